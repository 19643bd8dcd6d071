"""SAPO (Gao et al. 2025, Soft Adaptive Policy Optimization, https://arxiv.org/abs/2511.20347).

A sigmoid gate on the token ratio replaces PPO's hard clip: the gradient is
damped smoothly as the ratio leaves 1, faster for negative advantages (a
higher temperature, 1.05 against 1.0). Nothing here but the name: the loss,
its temperatures and their search ranges are the registration's
(``core/losses.py``, ``core/loss_params.py``).
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class SAPO(PolicyModule):
    """SAPO: -A (4 / tau) sigmoid(tau (r - 1)) per token, seq-mean-token-mean, no clip band."""

    name = "sapo"
