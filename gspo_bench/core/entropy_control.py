"""The entropy bonus's coefficient, fixed or adaptive (TRL's ``entropy_target``).

The bonus is ``L = L_policy - c * Hbar`` (``losses.policy_loss``). With a target entropy, ``c`` is a state the
run carries: after every optimiser step it moves by ``delta`` toward keeping the minibatch's mean token entropy
at the target, within ``[c_min, c_max]``, and the bonus is applied only while the last step's entropy was at most
the target (TRL's gate; before the first step nothing was measured, so no bonus). The state is two floats, so a
checkpoint holds it and a resumed run continues it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gspo_bench.core.losses import top_entropy_mask


@dataclass
class EntropyControl:
    """The bonus's coefficient ``coef`` (c) and the mean entropy the last optimiser step measured. ``start``: the
    configured c (``loss.entropy_coef``); ``target``: ``loss.entropy_target`` (None: c stays fixed);
    ``delta``, ``low``, ``high``: the step and bounds of the adaptive c; ``quantile``: the top-entropy mask's
    (``loss.top_entropy_quantile``), whose tokens are the ones the bonus averages over."""

    start: float = 0.0
    target: float | None = None
    delta: float = 0.005
    low: float = 0.0
    high: float = 1.0
    quantile: float = 1.0
    coef: float = math.nan
    last_entropy: float = math.inf  # no bonus under a target until one step was measured at it

    def __post_init__(self):
        if math.isnan(self.coef):
            self.coef = self.start

    @classmethod
    def of(cls, loss) -> "EntropyControl":
        """From resolved loss settings (``config.Resolved.loss``: its ``entropy_*`` and ``top_entropy_quantile``)."""
        return cls(loss.entropy_coef, loss.entropy_target, loss.entropy_coef_delta, loss.entropy_coef_min,
                   loss.entropy_coef_max, loss.top_entropy_quantile)

    @property
    def in_loss(self) -> bool:
        """The loss has a bonus (a coefficient, or the adaptive control), so the entropy carries its gradient."""
        return self.start > 0 or self.target is not None

    def applied(self) -> float:
        """The coefficient of this optimiser step: c, or with a target c only while the last step's mean entropy
        was at most the target, else 0."""
        if self.target is None:
            return self.coef
        return self.coef if self.last_entropy <= self.target else 0.0

    def adapt(self, entropy_BT: torch.Tensor, mask_BT: torch.Tensor, all_sum=None) -> None:
        """After one optimiser step, from its minibatch: the mean entropy over the loss's tokens ``m``, and c
        moved by ``delta`` within bounds. ``all_sum``: the sum over every process's rows (several processes)."""
        if self.target is None:
            return
        m_BT = top_entropy_mask(entropy_BT, mask_BT, self.quantile)
        dtype = torch.promote_types(entropy_BT.dtype, torch.float32)
        m_BT = m_BT.to(dtype)
        sums = torch.stack([(entropy_BT.detach().to(dtype) * m_BT).sum(), m_BT.sum()])
        if all_sum is not None:
            sums = all_sum(sums)
        # Hbar = sum(H * m) / sum(m) over the minibatch
        h_bar = float(sums[0] / sums[1].clamp(min=1.0))
        if h_bar <= self.target:
            # c <- min(c + delta, max)
            self.coef = min(self.coef + self.delta, self.high)
        else:
            # c <- max(c - delta, min)
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = h_bar

    def state_dict(self) -> dict:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
