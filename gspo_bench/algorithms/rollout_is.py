"""Rollout importance sampling (the GLM-5 report; SkyRL's ``rollout_is``): the policy gradient weighted by the
ratio to the policy that sampled, zeroed outside a band, so it needs no old policy and suits stale samples."""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class RolloutIS(PolicyModule):
    """rollout_is: -sg(r 1[r in (1 - 0.2, 1 + 0.2)]) A log p with r against the sampler's log-probs, token-mean."""

    name = "rollout_is"
