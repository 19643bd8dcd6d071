"""What one algorithm runs with: ``RunConfig.resolve``'s answer, and the algorithm defaults it resolves from.

``Recipe`` sits on each algorithm class (``algorithms/``); ``LossSettings``
and ``Resolved`` are ``RunConfig.resolve``'s output (every ``auto``
replaced by a value), shared by the module and the datamodule of a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class LossParamFields:
    """The declared loss parameters (``core/loss_params.py``) read as fields: ``cfg.loss.eps_high``.

    A class with this mixin keeps them in its ``params`` field, a mapping declared with ``SPREAD``
    metadata: ``to_dict`` writes them as keys of the section itself (``loss.eps_high``), where YAML and
    ``--set`` put them.
    """

    def __getattr__(self, name: str) -> Any:
        params = self.__dict__.get("params")  # not set yet while unpickling
        if params is not None and name in params:
            return params[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


SPREAD = {"spread": True}
"""Field metadata: ``to_dict`` writes the field's mapping as keys of its section, not under its own name."""


@dataclass(frozen=True)
class Recipe:
    """An algorithm's own defaults for the fields a config leaves at ``auto``."""

    kl_coef: float = 0.0
    """KL-to-reference weight (PPO folds it into the reward, the others into the loss)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards all agree and resample."""
    overlong_shaping: bool = False
    """DAPO's overlong shaping, with buffer max_new_tokens // 4."""
    loss_defaults: tuple | None = None
    """(name, default) of every parameter its loss takes (the clip band, sapo's temperatures, vespo's k and
    lambda, dppo's truncation): what those ``auto`` keys resolve to. ``register_algorithm`` fills it from the
    loss registry, so the config never imports the losses (None: not registered)."""
    advantage_scale: str = "group"
    """What ``rollout.advantage_scale: auto`` resolves to (Dr. GRPO: none)."""


@dataclass(frozen=True)
class LossSettings(LossParamFields):
    """The loss hyper-parameters of one algorithm, every ``auto`` resolved."""

    params: dict = field(default_factory=dict, metadata=SPREAD)
    """Every declared loss parameter: its value, or None where its loss does not take it (``eps_high``, ...)."""
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    aggregation: str | None = None
    """``loss.aggregation`` resolved: None for the loss's own, else the one chosen (bnpo)."""

    def hparams(self) -> dict:
        """Keyword arguments of ``losses.policy_loss`` (the KL weight goes in only with a reference model); the
        caller keeps those its loss takes."""
        return {**self.params, "kl_estimator": self.kl_estimator}


@dataclass(frozen=True)
class Resolved:
    """What one algorithm runs with: ``RunConfig.resolve``'s answer."""

    loss: LossSettings
    rollout: "RolloutConfig"  # noqa: F821 -- config/sections.py's (it imports this module); every auto replaced
