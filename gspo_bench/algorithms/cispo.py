"""CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the importance weight, keep every gradient."""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class CISPO(PolicyModule):
    """CISPO: REINFORCE weighted by sg(clip(r)), token-mean; the weight is capped at 1 + 4.0, no floor."""

    name = "cispo"
    searched_by_default = ("eps_high",)

    @classmethod
    def search_ranges(cls) -> dict[str, tuple[float, float, bool]]:
        """The weight cap 1 + eps_high, eps_high log-uniform over 0.5 .. 10 (published 4.0). The lower
        bound is off as published (``searched_by_default`` leaves it out); ``--params eps_low,eps_high``
        searches it uniformly over 0.1 .. 0.9."""
        return {"eps_high": (0.5, 10.0, True), "eps_low": (0.1, 0.9, False)}
