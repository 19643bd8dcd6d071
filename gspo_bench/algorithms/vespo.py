"""VESPO (Variational Sequence-Level Soft Policy Optimization, https://arxiv.org/abs/2602.10693).

REINFORCE weighted by ``phi(w) = e^lam w^k e^(-lam w)`` of the sequence's
product ratio ``w`` (a sum of token log-ratios, not GSPO's mean), without
gradient: 1 on policy, falling smoothly on both sides. Separate ``(k, lam)``
for non-negative (2, 3) and negative (3, 2) advantages.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class VESPO(PolicyModule):
    """VESPO: -sg(phi_i) A log p, token-mean, no clip band."""

    name = "vespo"
