"""Rollout engines: the ``RolloutEngine`` seam and its registry (``base.py``), and one file per engine:
``fast.py`` (the package's KV-cache sampler), ``compiled.py`` (the same, decode steps compiled), ``hf.py``
(transformers' ``generate``), ``vllm.py`` (vLLM in this process). Importing this package imports each of its
modules, so a new engine is one more file here that registers with ``@register_engine`` (docs/engines.md).
``rollout.engine`` is checked against the registry (``check_engine``) by every command that runs a config,
before any work; ``list`` and ``bench --engines`` read it too.

May import: the rest of rollout, tasks, models, tracking, config, core.
"""

from gspo_bench.rollout.engines.base import (ENGINES, Capabilities, EngineSetup, InProcessEngine, RolloutEngine,
                                             build_engine, check_engine, engine_class, engine_names, engine_options,
                                             generate, partial_check, register_engine, resolve_engine, route_recorders, sharded_engine,
                                             unregister_engine)
import importlib
import pkgutil

# the built-in engines first, in the order ``list`` and the error lines name them; then any other file here
from gspo_bench.rollout.engines import fast, compiled, hf, vllm  # noqa: E402,F401  (each registers its engine)

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
from gspo_bench.rollout.engines.vllm import VLLM_AUTO_MIN_PARAMS, prefers_vllm

__all__ = ["ENGINES", "Capabilities", "EngineSetup", "InProcessEngine", "RolloutEngine", "VLLM_AUTO_MIN_PARAMS",
           "build_engine", "check_engine", "engine_class", "engine_names", "engine_options", "generate",
           "partial_check", "prefers_vllm",
           "register_engine", "resolve_engine", "route_recorders", "sharded_engine", "unregister_engine"]
