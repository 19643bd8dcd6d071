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
    loss_defaults: tuple = ()
    """(name, value) pairs of its loss's own parameters (sapo's temperatures, vespo's k and lambda, dppo's
    truncation): what those ``auto`` fields resolve to; ``register_algorithm`` fills it from the registry."""
    advantage_scale: str = "group"
    """What ``rollout.advantage_scale: auto`` resolves to (Dr. GRPO: none)."""


@dataclass(frozen=True)
class LossSettings:
    """The loss hyper-parameters of one algorithm, every ``auto`` resolved."""

    eps_low: float | None
    eps_high: float | None
    dual_clip_c: float | None
    kl_coef: float
    kl_estimator: str
    tau_pos: float | None = None
    tau_neg: float | None = None
    k_pos: float | None = None
    lam_pos: float | None = None
    k_neg: float | None = None
    lam_neg: float | None = None
    trunc_c: float | None = None

    def hparams(self) -> dict:
        """Keyword arguments of ``losses.policy_loss`` (the KL weight goes in only with a reference model); the
        caller keeps those its loss takes."""
        return {"eps_low": self.eps_low, "eps_high": self.eps_high, "dual_clip_c": self.dual_clip_c,
                "kl_estimator": self.kl_estimator, "tau_pos": self.tau_pos, "tau_neg": self.tau_neg,
                "k_pos": self.k_pos, "lam_pos": self.lam_pos, "k_neg": self.k_neg, "lam_neg": self.lam_neg,
                "trunc_c": self.trunc_c}


@dataclass(frozen=True)
class Resolved:
    """What one algorithm runs with: ``RunConfig.resolve``'s answer."""

    loss: LossSettings
    rollout: "RolloutConfig"  # noqa: F821 -- config/sections.py's (it imports this module); every auto replaced
