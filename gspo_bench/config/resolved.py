"""What one algorithm runs with: ``RunConfig.resolve``'s answer, and the algorithm defaults it resolves from.

``Recipe`` sits on each algorithm class (``algorithms/``); ``LossSettings``
and ``Resolved`` are ``RunConfig.resolve``'s output (every ``auto``
replaced by a value), shared by the module and the datamodule of a run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """An algorithm's own defaults for the fields a config leaves at ``auto``."""

    kl_coef: float = 0.0
    """KL-to-reference weight (PPO folds it into the reward, the others into the loss)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards all agree and resample."""
    overlong_shaping: bool = False
    """DAPO's overlong shaping, with buffer max_new_tokens // 4."""
    clip: tuple | None = None
    """(eps_low, eps_high) of its loss: what ``auto`` clip offsets resolve to. ``register_algorithm`` fills it
    from the loss registry, so the config never imports the losses."""


@dataclass(frozen=True)
class LossSettings:
    """The loss hyper-parameters of one algorithm, every ``auto`` resolved."""

    eps_low: float | None
    eps_high: float
    dual_clip_c: float | None
    kl_coef: float
    kl_estimator: str

    def hparams(self) -> dict:
        """Keyword arguments of ``losses.policy_loss`` (the KL weight goes in only with a reference model)."""
        return {"eps_low": self.eps_low, "eps_high": self.eps_high, "dual_clip_c": self.dual_clip_c,
                "kl_estimator": self.kl_estimator}


@dataclass(frozen=True)
class Resolved:
    """What one algorithm runs with: ``RunConfig.resolve``'s answer."""

    loss: LossSettings
    rollout: "RolloutConfig"  # noqa: F821 -- config/sections.py's (it imports this module); every auto replaced
