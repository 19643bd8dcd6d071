"""GSPO and GSPO-token (Zheng et al. 2025, https://arxiv.org/abs/2507.18071).

GSPO clips one length-normalised ratio per sequence; GSPO-token (section 4.3,
TRL PR 3820) has the same ratio value with a gradient path per token, so it
can take per-token advantages. Both share one clip band and its search ranges (the loss registrations').
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class GSPO(PolicyModule):
    """GSPO: one length-normalised ratio and one clip per sequence, seq-mean."""

    name = "gspo"


@register_algorithm
class GSPOToken(PolicyModule):
    """GSPO-token: GSPO's ratio value with per-token gradient paths, seq-mean-token-mean."""

    name = "gspo_token"
