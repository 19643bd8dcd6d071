"""DAPO (Yu et al. 2025, https://arxiv.org/abs/2503.14476): GRPO plus four changes.

Clip-higher (0.2 / 0.28) and the token-mean loss are the loss registration's
(``losses.py``); dynamic sampling and overlong shaping are the datamodule's,
switched on here by the recipe.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm
from gspo_bench.config import Recipe


@register_algorithm
class DAPO(PolicyModule):
    """DAPO: clip-higher, token-mean, dynamic sampling and overlong shaping on."""

    name = "dapo"
    recipe = Recipe(dynamic_sampling=True, overlong_shaping=True)
