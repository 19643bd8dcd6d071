"""SAPO (Gao et al. 2025, Soft Adaptive Policy Optimization, https://arxiv.org/abs/2511.20347).

A sigmoid gate on the token ratio replaces PPO's hard clip: the gradient is
damped smoothly as the ratio leaves 1, faster for negative advantages (a
higher temperature, 1.05 against 1.0). Nothing here but the search ranges:
the loss and its temperatures are the registration's (``core/losses.py``).
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class SAPO(PolicyModule):
    """SAPO: -A (4 / tau) sigmoid(tau (r - 1)) per token, seq-mean-token-mean, no clip band."""

    name = "sapo"
    searched_by_default = ("tau_pos", "tau_neg")

    @classmethod
    def search_ranges(cls) -> dict[str, tuple[float, float, bool]]:
        """The two gate temperatures, each log-uniform over 0.25 .. 4 (published 1.0 / 1.05): a temperature
        sets how far from 1 the ratio may move before the gradient halves (|r - 1| ~ 1.76 / tau)."""
        return {"tau_pos": (0.25, 4.0, True), "tau_neg": (0.25, 4.0, True)}
