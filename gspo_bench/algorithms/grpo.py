"""GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300): group z-score advantages, no critic."""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class GRPO(PolicyModule):
    """GRPO: token ratio clipped at 0.2 / 0.2, each sequence's token mean, then the mean over sequences."""

    name = "grpo"
