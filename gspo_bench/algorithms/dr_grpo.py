"""Dr. GRPO (Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective,
https://arxiv.org/abs/2503.20783): GRPO without its two biases.

The loss is GRPO's clipped token surrogate summed over the minibatch and
divided by ``B * max_new_tokens`` (no per-response length normalisation), and
the group advantages are not divided by the group's std (the recipe sets
``rollout.advantage_scale`` to none). ``max_new_tokens`` is the rollout's
length cap, resolved per run.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm
from gspo_bench.config import Recipe


@register_algorithm
class DrGRPO(PolicyModule):
    """Dr. GRPO: token clipped surrogate, sum / (B * T_max), advantages without std scaling."""

    name = "dr_grpo"
    recipe = Recipe(advantage_scale="none")
