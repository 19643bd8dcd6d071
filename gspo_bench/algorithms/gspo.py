"""GSPO and GSPO-token (Zheng et al. 2025, https://arxiv.org/abs/2507.18071).

GSPO clips one length-normalised ratio per sequence; GSPO-token (section 4.3,
TRL PR 3820) has the same ratio value with a gradient path per token, so it
can take per-token advantages. Both share the search ranges below.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class GSPO(PolicyModule):
    """GSPO: one length-normalised ratio and one clip per sequence, seq-mean."""

    name = "gspo"

    @classmethod
    def search_ranges(cls) -> dict[str, tuple[float, float, bool]]:
        """Sequence ratios sit within ~1e-3 of 1, so both offsets are log-uniform over 1e-5 .. 1e-2
        (the published 3e-4 / 4e-4 in the middle), independently."""
        return {"eps_low": (1e-5, 1e-2, True), "eps_high": (1e-5, 1e-2, True)}


@register_algorithm
class GSPOToken(GSPO):
    """GSPO-token: GSPO's ratio value with per-token gradient paths, seq-mean-token-mean."""

    name = "gspo_token"
