"""Advantages, reward shaping and value diagnostics, as pinned in docs/algorithms.md.

Advantage estimators
--------------------
The rollout turns rewards into advantages with the estimator that
``rollout.advantage_estimator`` names, looked up in ``ADVANTAGE_ESTIMATORS``;
``@register_advantage(name)`` directly above a function adds one (verl's
``register_adv_est``). Every estimator takes the same arguments::

    fn(rewards_B, group_size, *, scale, baseline, all_sum) -> adv_B

``rewards_B`` (B,) is the rollout's rewards after shaping, in runs of
``group_size`` answers to one prompt; ``scale`` and ``baseline`` are
``rollout.advantage_scale`` and ``rollout.advantage_baseline`` (an estimator
that has no use for them ignores them); ``all_sum`` sums a tensor over the
processes of a multi-process run, None on one. It returns one advantage per
response, (B,), in at least float32, shared by all of the response's tokens.
The built-in one is ``group`` (``group_zscore``). An estimator registered
before the config is built is a valid ``rollout.advantage_estimator``: the
config checks the name against ``names.ADVANTAGE_ESTIMATOR_NAMES``, which
the decorator extends, without loading torch. PPO estimates its advantages
per token with GAE over its critic, not through this registry.

Conventions
-----------
- Group algorithms (GRPO, DAPO, GSPO, GSPO-token, CISPO): a batch of rewards
  ``rewards_B`` is ordered so that each run of ``group_size`` consecutive
  entries answers one prompt. ``A_i = (R_i - mean(R)) / (std(R) + eps)`` with
  the *population* std (divide by G), as in the GSPO article's worked example
  (rewards [1, 0, 1, 0] -> advantages [+1, -1, +1, -1]). ``scale="none"`` is
  Dr. GRPO (https://arxiv.org/abs/2503.20783), which drops the division.
- The field's other baselines and scales: ``baseline="leave_one_out"`` (RLOO,
  https://arxiv.org/abs/2402.14740) subtracts the mean of the other G - 1
  rewards, ``G / (G - 1) * (R_i - mean(R))``; ``scale="batch"``
  (REINFORCE++-baseline) divides by the population std, over the whole rollout
  batch, of the group-mean-centred rewards.
- PPO (https://arxiv.org/abs/1707.06347): the scalar reward sits on the last
  response token, an optional per-token KL-to-reference penalty is folded into
  the reward, and GAE (https://arxiv.org/abs/1506.02438) runs over response
  tokens only, with ``gamma = 1.0``, ``lam = 0.95`` defaults.
- ``mask_BT`` is 1 on response tokens, 0 on prompt and padding. Every
  per-token output is 0 at masked positions.
- Everything is computed in at least float32. Values are targets: detached.

Choices the papers leave open
-----------------------------
- GAE skips masked positions rather than assuming one contiguous span, so it
  is right for right-padded responses of any length (and for gaps); the value
  after a row's last response token is 0 (the episode ends there).
- ``whiten`` follows the TRL / verl PPO convention: Bessel-corrected masked
  variance, ``(x - mean) * rsqrt(var + eps)``, and with ``shift_mean=False``
  the mean is added back (rescale only).
- The scale is a property of the rewards, whatever the baseline: ``group``
  divides by the group's reward std and ``batch`` by the batch std of the
  group-mean-centred rewards, with leave-one-out as with the group mean.
- ``overlong_penalty`` is the contract's formula verbatim, with no -1 floor:
  generation is truncated at ``max_len``, so ``L <= max_len`` and the DAPO
  paper's "-1 beyond L_max" case never arises.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from gspo_bench.core.names import ADVANTAGE_ESTIMATOR_NAMES

Tensor = torch.Tensor

BASELINES = ("group_mean", "leave_one_out")
SCALES = ("group", "batch", "none")


class AdvantageEstimator(Protocol):
    """What ``ADVANTAGE_ESTIMATORS`` holds: shaped rewards (B,) in groups of ``group_size`` -> advantages (B,)."""

    def __call__(self, rewards_B: Tensor, group_size: int, *, scale: str, baseline: str,
                 all_sum: Callable[[Tensor], Tensor] | None) -> Tensor: ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""Advantage estimators by name (``rollout.advantage_estimator``), filled by ``register_advantage``."""


def register_advantage(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: add the function below to ``ADVANTAGE_ESTIMATORS`` under ``name``, and ``name`` to the names
    the config accepts (``names.ADVANTAGE_ESTIMATOR_NAMES``). A name is registered once."""

    def add(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered already")
        ADVANTAGE_ESTIMATORS[name] = fn
        if name not in ADVANTAGE_ESTIMATOR_NAMES:
            ADVANTAGE_ESTIMATOR_NAMES.append(name)
        return fn

    return add


def _float(x: Tensor) -> Tensor:
    # at least float32; rewards often arrive as int or bf16
    return x.to(torch.promote_types(x.dtype, torch.float32)) if x.is_floating_point() else x.to(torch.float32)


def _groups(rewards_B: Tensor, group_size: int) -> Tensor:
    if rewards_B.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards_B.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards_B.shape[0] % group_size != 0:
        raise ValueError(f"batch of {rewards_B.shape[0]} rewards does not split into groups of {group_size}")
    return _float(rewards_B).view(-1, group_size)  # (num_groups, G)


@register_advantage("group")
def group_zscore(rewards_B: Tensor, group_size: int, scale: str = "group", eps: float = 1e-6,
                 baseline: str = "group_mean", all_sum=None) -> Tensor:
    """Group-relative advantage of each response, shape [B]: ``(R_i - b_i) / s`` (estimator ``group``).

    ``baseline``: ``group_mean`` (``b_i = mean(R)``) or ``leave_one_out``
    (``b_i = mean_{j != i} R_j``). ``scale``: ``group`` (``s = std(R) + eps``,
    population std of the group), ``batch`` (``s`` = population std of
    ``R - mean(R)`` over every group of the batch, ``+ eps``) or ``none``
    (``s = 1``). ``all_sum`` (several processes): sums a tensor over ranks, so
    the batch std is the whole rollout's.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; allowed: {SCALES}")
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; allowed: {BASELINES}")
    r_NG = _groups(rewards_B, group_size)
    # centred reward R_i - mean(R) within the group
    centred_NG = r_NG - r_NG.mean(-1, keepdim=True)
    adv_NG = centred_NG
    if baseline == "leave_one_out":
        if group_size < 2:
            raise ValueError("leave_one_out needs groups of at least 2")
        # A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean(R))
        adv_NG = centred_NG * (group_size / (group_size - 1))
    if scale == "none":
        return adv_NG.reshape(-1)
    if scale == "group":
        # A_i = (R_i - b_i) / (std(R) + eps), population std (divide by G)
        return (adv_NG / (r_NG.std(-1, unbiased=False, keepdim=True) + eps)).reshape(-1)
    # batch: population std of the centred rewards over the whole batch (their mean is 0, up to rounding)
    n = torch.tensor(float(centred_NG.numel()), dtype=centred_NG.dtype)
    total = centred_NG.sum()
    if all_sum is not None:
        n, total = all_sum(n), all_sum(total)
    mean = total / n
    sq = (centred_NG - mean).square().sum()
    if all_sum is not None:
        sq = all_sum(sq)
    # A_i = (R_i - b_i) / (std_batch(R - mean_group(R)) + eps)
    return (adv_NG / (torch.sqrt(sq / n) + eps)).reshape(-1)


def group_is_degenerate(rewards_B: Tensor, group_size: int, tol: float = 1e-6) -> Tensor:
    """Bool [num_groups]: True where a group's rewards all agree (std <= tol).

    DAPO's dynamic sampling drops these groups: their advantages are all zero,
    so they only dilute the batch. A tolerance, not ``!= 0``, because rewards
    that went through float arithmetic rarely tie exactly.
    """
    r_NG = _groups(rewards_B, group_size)
    # degenerate <=> population std(R) <= tol
    return r_NG.std(-1, unbiased=False) <= tol


def overlong_penalty(lengths_B: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO soft overlong shaping, [B], to be ADDED to the rewards (always <= 0)."""
    if not buffer > 0:
        raise ValueError(f"buffer must be > 0, got {buffer!r}")
    if not buffer <= max_len:
        raise ValueError(f"buffer ({buffer}) must be <= max_len ({max_len})")
    L_B = _float(lengths_B)
    # min(0, -(L - (L_max - L_buf)) / L_buf) * penalty: 0 up to L_max - L_buf, then linear to -penalty at L_max
    return torch.clamp(-(L_B - (max_len - buffer)) / buffer, max=0.0) * penalty


def token_rewards(scores_B: Tensor, mask_BT: Tensor, kl_BT: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """PPO per-token rewards [B, T]: the score on each row's last response token, minus kl_coef * kl."""
    if mask_BT.dim() != 2 or scores_B.shape != mask_BT.shape[:1]:
        raise ValueError(f"need scores [B] and mask [B, T]; got {tuple(scores_B.shape)}, {tuple(mask_BT.shape)}")
    if kl_coef != 0 and kl_BT is None:
        raise ValueError("kl_coef != 0 needs kl_BT")
    if kl_BT is not None and kl_BT.shape != mask_BT.shape:
        raise ValueError(f"kl_BT shape {tuple(kl_BT.shape)} != mask shape {tuple(mask_BT.shape)}")
    scores_B = _float(scores_B)
    valid_BT = mask_BT > 0
    pos_T = torch.arange(mask_BT.shape[1], device=mask_BT.device)
    # index of the last response token per row, -1 for a row with none
    last_B = torch.where(valid_BT, pos_T, -1).amax(-1)
    # r_t = score on t == last, 0 elsewhere (a row with no token matches nothing)
    rewards_BT = torch.where(pos_T[None, :] == last_B[:, None], scores_B[:, None], 0.0)
    if kl_BT is not None:
        # r_t -= kl_coef * kl_t on every response token
        rewards_BT = rewards_BT - kl_coef * torch.where(valid_BT, _float(kl_BT), 0.0)
    return rewards_BT


def gae(rewards_BT: Tensor, values_BT: Tensor, mask_BT: Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens; returns (advantages_BT, returns_BT)."""
    if not rewards_BT.shape == values_BT.shape == mask_BT.shape or rewards_BT.dim() != 2:
        raise ValueError(f"rewards, values and mask must share a (B, T) shape; got {tuple(rewards_BT.shape)}, "
                         f"{tuple(values_BT.shape)}, {tuple(mask_BT.shape)}")
    rewards_BT = _float(rewards_BT)
    values_BT = _float(values_BT.detach())
    valid_BT = mask_BT > 0
    B, T = rewards_BT.shape
    # carried from the next *response* token; 0 after the last one (terminal)
    next_value_B = rewards_BT.new_zeros(B)
    next_adv_B = rewards_BT.new_zeros(B)
    adv_cols = []
    for t in reversed(range(T)):
        valid_B = valid_BT[:, t]
        # delta_t = r_t + gamma * V_{t+1} - V_t
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        # A_t = delta_t + gamma * lam * A_{t+1}
        adv_B = delta_B + gamma * lam * next_adv_B
        # masked positions are skipped: they neither produce nor pass on anything
        next_value_B = torch.where(valid_B, values_BT[:, t], next_value_B)
        next_adv_B = torch.where(valid_B, adv_B, next_adv_B)
        adv_cols.append(torch.where(valid_B, adv_B, 0.0))
    advantages_BT = torch.stack(adv_cols[::-1], dim=1)
    # returns = A + V (the critic's regression target)
    returns_BT = torch.where(valid_BT, advantages_BT + values_BT, 0.0)
    return advantages_BT, returns_BT


def _masked_mean(x_BT: Tensor, valid_BT: Tensor) -> Tensor:
    n = valid_BT.sum()
    return torch.where(valid_BT, x_BT, 0.0).sum() / torch.clamp(n, min=1)


def whiten(x_BT: Tensor, mask_BT: Tensor, shift_mean: bool = True, eps: float = 1e-8, all_sum=None) -> Tensor:
    """Masked normalisation to zero mean, unit variance (PPO convention); masked positions -> 0.

    ``all_sum`` (multi-process): sums a tensor over ranks, so the mean and variance are the whole
    rollout's, not this rank's share's."""
    if x_BT.shape != mask_BT.shape:
        raise ValueError(f"x shape {tuple(x_BT.shape)} != mask shape {tuple(mask_BT.shape)}")
    x_BT = _float(x_BT)
    valid_BT = mask_BT > 0
    n = valid_BT.sum()
    if all_sum is None:
        mean = _masked_mean(x_BT, valid_BT)
    else:
        n = all_sum(n)
        # mean over every rank's valid positions
        mean = all_sum(torch.where(valid_BT, x_BT, 0.0).sum()) / n.clamp(min=1)
    # Bessel-corrected masked variance: sum((x - mean)^2) / (n - 1)  (population when n <= 1)
    sq_sum = torch.where(valid_BT, (x_BT - mean).square(), 0.0).sum()
    if all_sum is not None:
        sq_sum = all_sum(sq_sum)
    var = sq_sum / torch.clamp(n - 1, min=1)
    # (x - mean) / sqrt(var + eps)
    out_BT = (x_BT - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        # rescale only: keep the original mean
        out_BT = out_BT + mean
    return torch.where(valid_BT, out_BT, 0.0)


def explained_variance(values_BT: Tensor, returns_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """1 - Var[returns - values] / Var[returns] over response tokens; 0 when Var[returns] == 0."""
    valid_BT = mask_BT > 0
    values_BT = _float(values_BT.detach())
    returns_BT = _float(returns_BT.detach())

    def var(x_BT: Tensor) -> Tensor:
        # population variance over response tokens (the ratio cancels the normaliser)
        return _masked_mean((x_BT - _masked_mean(x_BT, valid_BT)).square(), valid_BT)

    var_ret = var(returns_BT)
    # ev = 1 - Var[R - V] / Var[R]; undefined for constant returns, reported as 0
    ev = 1.0 - var(returns_BT - values_BT) / torch.where(var_ret > 0, var_ret, 1.0)
    return torch.where(var_ret > 0, ev, 0.0)
