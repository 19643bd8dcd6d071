"""GMPO (Zhao et al. 2025, Geometric-Mean Policy Optimization, https://arxiv.org/abs/2507.20673).

The objective is the geometric mean of the token ratios (a sequence ratio
like GSPO's), with each token's log-ratio clipped to ``[-eps_low, eps_high]``
before the mean, in the direction its advantage pushes. The clip is on the
log-ratio, so its band is wide (0.4 / 0.4, about ``[0.67, 1.49]`` as a ratio).
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class GMPO(PolicyModule):
    """GMPO: -A_i exp(mean_t of the clipped token log-ratios), seq-mean."""

    name = "gmpo"
