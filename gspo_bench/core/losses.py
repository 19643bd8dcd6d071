"""Policy-gradient losses for the six pinned algorithms (minimise the result).

The contract is the "Losses" section of ``docs/algorithms.md``. Each loss is registered by ``@register_loss`` directly
above its function, with its ratio unit, aggregation, default clip and paper;
``policy_loss`` is the one entry point. The statistics each call returns
(clip fractions, ratio spread, ``kl/old``) come from ``ratios.py``.

Mismatch corrections (docs/algorithms.md, "Mismatch corrections"): given the
sampler's ``rollout_logp`` and ``correction="tis"`` or ``"mis"`` (cap ``C =
correction_cap``, default 2.0), each unit's policy-gradient loss term is
weighted before aggregation by the detached ``rho = exp(old_logp -
rollout_logp)`` taken at the loss's ratio unit: ``w_t = rho_t`` per token
(ppo, grpo, dapo, cispo, gspo_token), ``w_i = exp(mean_t log rho_it)`` per
sequence (gspo). ``tis`` multiplies the term by ``min(w, C)``; ``mis`` zeroes
the terms with ``w`` outside ``[1/C, C]`` (they stay in the denominator) and
leaves the others unweighted. The KL term is never weighted. Two stats are
added, weighted like the other stats (token units: mask-weighted over response
tokens; gspo: each non-empty sequence once):
``mismatch/is_weight_mean`` = mean of the raw (untruncated) ``w``;
``mismatch/corrected_frac`` = fraction of units truncated (tis: ``w > C``) or
masked (mis: ``w < 1/C`` or ``w > C``; a NaN ``w`` counts as outside).
``correction="none"`` (the default) or ``rollout_logp=None`` leaves the loss
and stats bit-identical to no correction.

Conventions
-----------
- ``logp_BT`` / ``old_logp_BT``: log-probs of the sampled tokens under the
  policy being trained / the rollout policy, ``B`` responses padded to ``T``.
  ``old_logp`` (and ``ref_logp``, and the advantages) are detached here: they
  are targets, and a caller must not be able to leak gradient into them.
- ``mask_BT``: 1 on response tokens, 0 on prompt and padding (bool or float).
  ``|y_i| = mask[i].sum()``. A response with ``|y_i| = 0`` adds nothing and is
  left out of every sequence mean. An all-padding batch gives a zero loss that
  is still attached to the graph, so ``backward()`` works and grads are zero.
- ``delta = logp - old_logp``, token ratio ``r = exp(delta)``.
- One clip convention: ``clip(x) = clamp(x, 1 - eps_low, 1 + eps_high)``,
  ``eps_low=None`` means no lower bound (CISPO's "cap 5.0" is ``eps_high=4.0``).
- Clip conditions use strict inequalities, so a ratio exactly on the band edge
  is not counted as clipped.
- Everything is computed in at least float32 (bf16/fp16 inputs are cast up).
- Padding positions are zeroed with ``torch.where`` *before* ``exp``: padding
  often holds garbage (``-inf``), and ``0 * inf`` in a backward pass is NaN.

Choices the papers leave open
-----------------------------
- PPO's KL-to-reference lives in the reward (``advantages.token_rewards``), so
  the loss-level ``kl_coef`` defaults to 0 for every algorithm, ppo included.
  When it is on, the per-token KL is reduced with the algorithm's own
  aggregation (gspo: seq-mean of per-sequence token means) and ``loss/kl`` is
  the ``kl_coef``-scaled term, so ``loss = loss/policy + loss/kl``.
- Dual clip (Ye et al. 2020, https://arxiv.org/abs/1912.09729) is allowed for
  every clipped-surrogate algorithm (ppo, grpo, dapo, gspo, gspo_token), off by
  default, and needs ``c > 1``. CISPO has no clipped surrogate to bound, so a
  non-None ``dual_clip_c`` is an error there.
- ``clip/seq_frac`` is the fraction of non-empty sequences with at least one
  clipped token. For gspo that is exactly the fraction of clipped sequences;
  token-level algorithms use the same "any token" definition.
- Stats are mask-weighted; for a 0/1 mask that is a plain count of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from gspo_bench.core.names import KL_ESTIMATORS
from gspo_bench.core.ratios import (apply_correction, check_correction, compute_dtype, correction_stats, is_weights,
                                   masked_delta, masked_mean, ratio_stats, seq_logratio)

Tensor = torch.Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean")
RATIO_UNITS = ("token", "sequence", "sequence-token")
# Every **hparams keyword policy_loss accepts (the correction has its own keywords, see CORRECTIONS).
HPARAMS = ("eps_low", "eps_high", "dual_clip_c", "kl_coef", "ref_logp", "kl_estimator")
# Defaults every loss shares (the clip range is each loss's own, in its registration).
BASE_DEFAULTS = {"dual_clip_c": None, "kl_coef": 0.0, "kl_estimator": "k3"}


@dataclass(frozen=True)
class LossSpec:
    """One registered loss: its function and the facts the README table and ``list`` show."""

    name: str  # registry key, also the algorithm's name
    fn: Callable  # (logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip_c) -> (loss, high_BT, low_BT)
    ratio: str  # "token" | "sequence" | "sequence-token"
    loss: str  # human formula for the README table
    aggregation: str  # one of AGGREGATIONS
    eps_low: float | None  # default lower clip offset, None = no lower bound
    eps_high: float  # default upper clip offset
    paper: str  # title + URL


LOSSES: dict[str, LossSpec] = {}


def register_loss(name: str, *, ratio: str, loss: str, aggregation: str, eps_low: float | None, eps_high: float,
                  paper: str) -> Callable[[Callable], Callable]:
    """Decorator: add the function below to ``LOSSES`` under ``name`` with its table facts.

    The other hparams (``dual_clip_c``, ``kl_coef``, ``kl_estimator``) share
    one default for every loss (``BASE_DEFAULTS``). A duplicate name is an error.
    """
    if name in LOSSES:
        raise ValueError(f"loss {name!r} is already registered")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r} not in {AGGREGATIONS}")
    if ratio not in RATIO_UNITS:
        raise ValueError(f"ratio {ratio!r} not in {RATIO_UNITS}")

    def add(fn: Callable) -> Callable:
        LOSSES[name] = LossSpec(name, fn, ratio, loss, aggregation, eps_low, eps_high, paper)
        return fn

    return add


# ----------------------------------------------------------------------------- helpers


def _adv_BT(advantages: Tensor, mask_BT: Tensor) -> Tensor:
    # token-level algorithms: one advantage per sequence is broadcast over its tokens
    adv = advantages.detach()
    adv_BT = adv[:, None].expand_as(mask_BT) if adv.dim() == 1 else adv
    return torch.where(mask_BT > 0, adv_BT, 0.0)  # (B, T)


def _clip(x: Tensor, eps_low: float | None, eps_high: float) -> Tensor:
    # clip(x) = clamp(x, 1 - eps_low, 1 + eps_high); eps_low None -> no floor
    return torch.clamp(x, min=None if eps_low is None else 1.0 - eps_low, max=1.0 + eps_high)


def _surrogate(adv: Tensor, ratio: Tensor, eps_low, eps_high, dual_clip_c):
    """Pessimistic clipped surrogate per unit, plus where the clip binds."""
    # L = max(-A * ratio, -A * clip(ratio))
    loss = torch.maximum(-adv * ratio, -adv * _clip(ratio, eps_low, eps_high))
    if dual_clip_c is not None:
        # dual clip: for A < 0, L = min(L, -A * c), bounding the loss when ratio >> 1
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip_c), loss)
    # binding side: the clipped branch is the max and carries no gradient
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    low = (ratio < 1.0 - eps_low) & (adv < 0) if eps_low is not None else torch.zeros_like(high)
    return loss, high, low


# ----------------------------------------------------------------------------- losses


_GSPO_PAPER = "Group Sequence Policy Optimization, https://arxiv.org/abs/2507.18071"


def clipped_token_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """The clipped surrogate on the token ratio (PPO, GRPO, DAPO differ only in aggregation and clip).

    Returns (loss_BT, high_BT, low_BT).
    """
    delta_BT = masked_delta(logp, old_logp, mask)
    # r = exp(delta)
    ratio_BT = torch.exp(delta_BT)
    loss_BT, high_BT, low_BT = _surrogate(_adv_BT(advantages, mask), ratio_BT, eps_low, eps_high, dual_clip_c)
    valid_BT = mask > 0
    return loss_BT, high_BT & valid_BT, low_BT & valid_BT


@register_loss("ppo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="token-mean", eps_low=0.2,
               eps_high=0.2, paper="Proximal Policy Optimization Algorithms, https://arxiv.org/abs/1707.06347")
def ppo_loss(logp, old_logp, advantages, mask, **clip):
    """PPO: the token clipped surrogate, token-mean (advantages from GAE, per token)."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_loss("grpo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="seq-mean-token-mean",
               eps_low=0.2, eps_high=0.2, paper="DeepSeekMath: Pushing the Limits of Mathematical Reasoning in "
               "Open Language Models, https://arxiv.org/abs/2402.03300")
def grpo_loss(logp, old_logp, advantages, mask, **clip):
    """GRPO: the token clipped surrogate, each sequence's token mean, then the mean over sequences."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_loss("dapo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="token-mean", eps_low=0.2,
               eps_high=0.28, paper="DAPO: An Open-Source LLM Reinforcement Learning System at Scale, "
               "https://arxiv.org/abs/2503.14476")
def dapo_loss(logp, old_logp, advantages, mask, **clip):
    """DAPO: the token clipped surrogate with clip-higher (0.28 above), token-mean over the minibatch."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_loss("gspo", ratio="sequence", loss="max(-A_i s_i, -A_i clip(s_i))", aggregation="seq-mean",
               eps_low=3e-4, eps_high=4e-4, paper=_GSPO_PAPER)
def gspo_sequence_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """GSPO: clipped surrogate on the length-normalised sequence ratio. Returns (loss_B, high_BT, low_BT)."""
    if advantages.dim() != 1:
        raise ValueError(
            "gspo clips one ratio per sequence and needs one advantage per sequence, shape [B]; "
            f"got {tuple(advantages.shape)}. Use 'gspo_token' for per-token advantages."
        )
    delta_BT = masked_delta(logp, old_logp, mask)
    # s_i = exp(sum_t(delta * mask) / |y_i|); the gradient flows through the mean
    s_B = torch.exp(seq_logratio(delta_BT, mask))
    loss_B, high_B, low_B = _surrogate(advantages.detach(), s_B, eps_low, eps_high, dual_clip_c)
    # a clipped sequence clips every one of its tokens
    valid_BT = mask > 0
    return loss_B, high_B[:, None] & valid_BT, low_B[:, None] & valid_BT


@register_loss("gspo_token", ratio="sequence-token", loss="max(-A_it s_it, -A_it clip(s_it))",
               aggregation="seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4, paper=_GSPO_PAPER + " (section 4.3)")
def gspo_token_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """GSPO-token (GSPO paper, section 4.3). Returns (loss_BT, high_BT, low_BT)."""
    delta_BT = masked_delta(logp, old_logp, mask)
    s_B = torch.exp(seq_logratio(delta_BT, mask))
    # s_it = sg(s_i) * exp(logp - sg(logp)); logp - sg(logp) == delta - sg(delta) since old_logp
    # is constant, and delta is finite at padding. Value s_i, gradient s_i * grad logp_it.
    s_BT = s_B.detach()[:, None] * torch.exp(delta_BT - delta_BT.detach())  # (B, T)
    loss_BT, high_BT, low_BT = _surrogate(_adv_BT(advantages, mask), s_BT, eps_low, eps_high, dual_clip_c)
    valid_BT = mask > 0
    return loss_BT, high_BT & valid_BT, low_BT & valid_BT


@register_loss("cispo", ratio="token", loss="-sg(clip(r)) A log p", aggregation="token-mean", eps_low=None,
               eps_high=4.0, paper="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention, "
               "https://arxiv.org/abs/2506.13585")
def cispo_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """CISPO (MiniMax-M1): REINFORCE with a truncated, stop-gradient IS weight. Returns (loss_BT, high_BT, low_BT)."""
    if dual_clip_c is not None:
        raise ValueError("dual_clip_c applies to clipped surrogates; cispo has none (pass None)")
    valid_BT = mask > 0
    ratio_BT = torch.exp(masked_delta(logp, old_logp, mask))
    # w = sg(clip(r)): the weight is truncated but never zeroed, and carries no gradient
    w_BT = _clip(ratio_BT, eps_low, eps_high).detach()
    # L = -sg(clip(r)) * A * logp, so every token keeps its w * A * grad logp term
    loss_BT = -w_BT * _adv_BT(advantages, mask) * torch.where(valid_BT, logp, 0.0)
    # truncated on either side, whatever the sign of A (the gradient survives)
    high_BT = (ratio_BT > 1.0 + eps_high) & valid_BT
    low_BT = (ratio_BT < 1.0 - eps_low) & valid_BT if eps_low is not None else torch.zeros_like(high_BT)
    return loss_BT, high_BT, low_BT


# ----------------------------------------------------------------------------- aggregation, KL


def agg_loss(loss: Tensor, mask: Tensor, mode: str, units: float | None = None) -> Tensor:
    """Reduce a per-token ``(B, T)`` or per-sequence ``(B,)`` loss to a scalar.

    ``mask`` is ``(B, T)``; for "seq-mean" it may also be ``(B,)`` (sequence
    lengths or validity). Empty sequences are left out of sequence means, and
    an all-empty batch gives 0 still attached to ``loss``'s graph.

    ``units`` (W > 1 ranks): the minibatch's unit count (tokens for token-mean,
    else non-empty sequences) over all ranks / W, the divisor of this rank's sum,
    so the ranks' terms average to the whole minibatch's mean (``distributed``).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; allowed: {AGGREGATIONS}")
    mask = mask.to(loss.dtype)

    def mean(x: Tensor, w: Tensor) -> Tensor:
        if units is None:
            return masked_mean(x, w)
        # this rank's term: sum over its units / (N / W), N counted over every rank's units
        return torch.where(w > 0, x * w, 0.0).sum() / (float(units) if units > 0 else 1.0)

    if mode == "seq-mean":
        if loss.dim() != 1 or mask.shape[0] != loss.shape[0] or mask.dim() not in (1, 2):
            raise ValueError(f"seq-mean needs loss (B,) and mask (B, T) or (B,); got {tuple(loss.shape)}, "
                             f"{tuple(mask.shape)}")
        len_B = mask.sum(-1) if mask.dim() == 2 else mask
        # seq-mean: mean over non-empty sequences
        return mean(loss, (len_B > 0).to(loss.dtype))
    if loss.shape != mask.shape or loss.dim() != 2:
        raise ValueError(f"{mode} needs loss and mask of the same (B, T) shape; got {tuple(loss.shape)}, "
                         f"{tuple(mask.shape)}")
    if mode == "token-mean":
        # token-mean: sum(l * mask) / sum(mask) over the whole minibatch
        return mean(loss, mask)
    len_B = mask.sum(-1)
    # per sequence: sum_t(l * mask) / |y_i|
    seq_B = torch.where(mask > 0, loss * mask, 0.0).sum(-1) / torch.where(len_B > 0, len_B, 1.0)
    # seq-mean-token-mean: mean over non-empty sequences of their token means
    return mean(seq_B, (len_B > 0).to(loss.dtype))


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate, (B, T); http://joschu.net/blog/kl-approx.html."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; allowed: {KL_ESTIMATORS}")
    dtype = compute_dtype(logp.dtype)
    # delta_ref = ref_logp - logp (the reference model is frozen)
    delta_ref = ref_logp.detach().to(dtype) - logp.to(dtype)
    if estimator == "k1":
        # k1 = -delta_ref
        return -delta_ref
    if estimator == "k2":
        # k2 = delta_ref^2 / 2
        return 0.5 * delta_ref.square()
    # k3 = exp(delta_ref) - delta_ref - 1, via expm1 to keep precision near 0
    return torch.expm1(delta_ref) - delta_ref


# ----------------------------------------------------------------------------- entry point


def _check(hp: dict, logp, old_logp, advantages, mask) -> None:
    eps_low, eps_high = hp["eps_low"], hp["eps_high"]
    if eps_high is None or not (math.isfinite(eps_high) and eps_high >= 0):
        raise ValueError(f"eps_high must be a finite float >= 0, got {eps_high!r}")
    if eps_low is not None and not 0 <= eps_low < 1:
        raise ValueError(f"eps_low must be None or in [0, 1), got {eps_low!r}")
    if hp["dual_clip_c"] is not None and not hp["dual_clip_c"] > 1:
        raise ValueError(f"dual_clip_c must be None or > 1, got {hp['dual_clip_c']!r}")
    if not hp["kl_coef"] >= 0:
        raise ValueError(f"kl_coef must be >= 0, got {hp['kl_coef']!r}")
    if hp["kl_estimator"] not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {hp['kl_estimator']!r}; allowed: {KL_ESTIMATORS}")
    if hp["kl_coef"] > 0 and hp["ref_logp"] is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    if logp.dim() != 2 or logp.numel() == 0:
        raise ValueError(f"logp must be a non-empty (B, T) tensor, got shape {tuple(logp.shape)}")
    for key, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", hp["ref_logp"])):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{key} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"advantages must be [B]={list(logp.shape[:1])} or [B, T]={list(logp.shape)}, "
                         f"got {list(advantages.shape)}")


def policy_loss(name: str, *, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                rollout_logp: Tensor | None = None, correction: str = "none", correction_cap: float = 2.0,
                units: float | None = None, **hparams) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of algorithm ``name`` (a key of ``LOSSES``) and its detached 0-dim stats.

    ``hparams``: ``eps_low``, ``eps_high``, ``dual_clip_c``, ``kl_coef``,
    ``ref_logp``, ``kl_estimator``; missing ones take the spec's defaults.

    ``correction`` (one of ``CORRECTIONS``) with ``rollout_logp`` (the
    sampler's log-probs, (B, T)) weights the policy-gradient term per unit
    (token, or sequence for gspo) by ``w = sg(exp(old_logp - rollout_logp))``:
    tis by ``min(w, C)``, mis by 1 if ``1/C <= w <= C`` else 0, with ``C =
    correction_cap`` (a finite float > 1). It then adds
    ``mismatch/is_weight_mean`` (the raw ``w`` averaged over units, token units
    mask-weighted, sequences: over non-empty ones) and
    ``mismatch/corrected_frac`` (the same average of "truncated": ``w > C``
    for tis, "masked": ``w < 1/C or w > C`` for mis). ``rollout_logp=None`` or
    ``correction="none"``: no weight, no new stats, a bit-identical loss.

    ``units``: ``agg_loss``'s divisor on W > 1 ranks; ``None`` on one process.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(LOSSES)}")
    unknown = sorted(set(hparams) - set(HPARAMS))
    if unknown:
        raise TypeError(f"unknown hparam(s) {unknown} for policy_loss; allowed: {', '.join(HPARAMS)}")
    spec = LOSSES[name]
    hp = {"eps_low": spec.eps_low, "eps_high": spec.eps_high, "ref_logp": None,
          **BASE_DEFAULTS, **hparams}
    _check(hp, logp, old_logp, advantages, mask)
    cap = check_correction(correction, correction_cap, rollout_logp, logp.shape)

    dtype = compute_dtype(logp.dtype)
    logp_BT = logp.to(dtype)  # (B, T), the only input that carries gradient
    old_logp_BT = old_logp.detach().to(dtype)  # (B, T)
    adv = advantages.detach().to(dtype)  # (B,) or (B, T)
    mask_BT = mask.to(dtype)  # (B, T)
    eps_low, eps_high = hp["eps_low"], hp["eps_high"]

    unit_loss, high_BT, low_BT = spec.fn(logp_BT, old_logp_BT, adv, mask_BT, eps_low=eps_low,
                                         eps_high=eps_high, dual_clip_c=hp["dual_clip_c"])
    corr_stats = {}
    if correction != "none" and rollout_logp is not None:
        # w at the loss's ratio unit: per sequence for gspo, per token otherwise (gspo_token included)
        unit = "sequence" if spec.ratio == "sequence" else "token"
        w, unit_w = is_weights(old_logp_BT, rollout_logp.detach().to(dtype), mask_BT, unit)
        # L_u <- min(w_u, C) L_u (tis) or [1/C <= w_u <= C] L_u (mis), before aggregation, KL untouched
        unit_loss, corrected = apply_correction(unit_loss, w, correction, cap)
        corr_stats = correction_stats(w, corrected, unit_w)
    pg_loss = agg_loss(unit_loss, mask_BT, spec.aggregation, units)

    kl_part = torch.zeros((), dtype=dtype, device=logp.device)
    if hp["kl_coef"] > 0:
        valid_BT = mask_BT > 0
        kl_BT = kl_penalty(torch.where(valid_BT, logp_BT, 0.0),
                           torch.where(valid_BT, hp["ref_logp"].to(dtype), 0.0), hp["kl_estimator"])
        # the KL shares the algorithm's reduction; gspo's per-sequence loss has no tokens,
        # so its KL is the seq-mean of per-sequence token means
        kl_mode = "seq-mean-token-mean" if spec.aggregation == "seq-mean" else spec.aggregation
        # loss += kl_coef * kl_agg
        kl_part = hp["kl_coef"] * agg_loss(kl_BT, mask_BT, kl_mode, units)
    loss = pg_loss + kl_part

    with torch.no_grad():
        stats = ratio_stats(logp_BT.detach(), old_logp_BT, mask_BT, high_BT, low_BT)
    stats["loss/policy"] = pg_loss.detach()
    stats["loss/kl"] = kl_part.detach()
    stats.update(corr_stats)
    return loss, stats
