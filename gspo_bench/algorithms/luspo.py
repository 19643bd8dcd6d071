"""LUSPO (Length-Unbiased Sequence Policy Optimization, https://arxiv.org/abs/2602.05261).

GSPO's clipped sequence surrogate, scaled by the response length ``|y_i|``
before the mean over sequences: GSPO's length-normalised ratio gives every
response the same weight whatever its length, which LUSPO undoes. Same ratio,
band and search ranges as GSPO (the loss registration's).
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class LUSPO(PolicyModule):
    """LUSPO: |y_i| max(-A_i s_i, -A_i clip(s_i)), seq-mean."""

    name = "luspo"
