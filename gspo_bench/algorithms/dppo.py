"""DPPO (Rethinking the Trust Region in LLM Reinforcement Learning, https://arxiv.org/abs/2602.04879).

Divergence PPO: instead of clipping the sampled token's ratio, a token loses
its gradient when the policy's probability of it has moved too far from the
old one in the direction its advantage pushes, measured as a total variation
(``dppo_tv``, |p - p_old|, thresholds 0.15) or a binary KL (``dppo_kl``, the
KL between Bernoulli(p_old) and Bernoulli(p), thresholds 0.05). Kept tokens
carry a truncated importance weight ``min(r, c)``, c = 20, without gradient.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class DPPOTV(PolicyModule):
    """DPPO-TV: -A sg(min(r, c)) log p on tokens whose probability moved less than the band, token-mean."""

    name = "dppo_tv"


@register_algorithm
class DPPOKL(PolicyModule):
    """DPPO-KL: as DPPO-TV with the binary KL as the divergence, token-mean."""

    name = "dppo_kl"
