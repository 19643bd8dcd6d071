"""LUSPO (Length-Unbiased Sequence Policy Optimization, https://arxiv.org/abs/2602.05261).

GSPO's clipped sequence surrogate, scaled by the response length ``|y_i|``
before the mean over sequences: GSPO's length-normalised ratio gives every
response the same weight whatever its length, which LUSPO undoes. Same ratio
and band as GSPO, so the same search ranges.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import register_algorithm
from gspo_bench.algorithms.gspo import GSPO


@register_algorithm
class LUSPO(GSPO):
    """LUSPO: |y_i| max(-A_i s_i, -A_i clip(s_i)), seq-mean."""

    name = "luspo"
