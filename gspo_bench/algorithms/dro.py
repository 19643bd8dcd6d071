"""DRO (Kimi k1.5, eq. 3; verl's ``dro``): the policy gradient with a squared log-ratio penalty in place of a
clip, so a stale sample's update is damped rather than cut off."""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class DRO(PolicyModule):
    """dro: -(A log p - (beta / 2)(log p - log p_old)^2), beta 0.1, token-mean; nothing is clipped."""

    name = "dro"
