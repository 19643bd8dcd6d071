"""CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the importance weight, keep every gradient."""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class CISPO(PolicyModule):
    """CISPO: REINFORCE weighted by sg(clip(r)), token-mean; the weight is capped at 1 + 4.0, no floor."""

    name = "cispo"
