"""Typed configuration: one small dataclass per concern, loadable from YAML.

``sections.py`` holds the dataclasses (``RunConfig`` and its sections, every
field documented and checked in ``__post_init__``) and ``RunConfig.resolve``,
which turns ``auto`` into one algorithm's values (its ``Recipe``,
``resolved.py``). ``loading.py`` reads presets, ``--config`` files and ``--set``
overrides and merges them; ``uris.py`` checks tracking URIs; ``names.py`` owns
the name lists the fields are checked against (engines, replay modes,
precisions).

May import: core's name lists (``core/names.py``), the loss parameters'
declarations (``core/loss_params.py``) and paths only; importing the config
loads neither torch nor anything of the layers above.
"""

from gspo_bench.config.loading import (PRESET_DIR, deep_merge, flatten, load_config, load_yaml, parse_sets, presets,
                                       read_yaml, resolve_config_file, to_dict, yaml_file)
from gspo_bench.config.sections import (AUTO, CONNECT_TIMEOUT_S, LOGIT_CHUNK_TOKENS, CollapseConfig, ConfigError,
                                        EnvConfig, LossConfig,
                                        LossSettings, ModelConfig,
                                        MoEConfig, Recipe, Resolved, RolloutConfig, RunConfig, TaskOptions,
                                        TrackingConfig, TrainConfig, WarmStartConfig)
from gspo_bench.config.uris import DEFAULT_TRACKING_URI, resolve_tracking_uri

__all__ = ["AUTO", "CONNECT_TIMEOUT_S", "LOGIT_CHUNK_TOKENS", "DEFAULT_TRACKING_URI", "PRESET_DIR", "CollapseConfig",
           "ConfigError", "EnvConfig",
           "LossConfig", "LossSettings",
           "ModelConfig", "MoEConfig", "Recipe", "Resolved", "RolloutConfig", "RunConfig", "TaskOptions",
           "TrackingConfig", "TrainConfig",
           "WarmStartConfig", "deep_merge", "flatten", "load_config", "load_yaml", "parse_sets", "presets", "read_yaml",
           "resolve_config_file", "resolve_tracking_uri", "to_dict", "yaml_file"]
