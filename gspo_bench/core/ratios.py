"""Masked reductions over (B, T) token grids, and the ratio statistics every step logs.

Pure functions of tensors, shared by ``losses.py`` (which computes the loss)
and the diagnostics callbacks (which measure the sampler/trainer mismatch).
The definitions are docs/algorithms.md's "Clip fraction" and "Rollout precision and
the mismatch" sections; ``docs/algorithms.md`` restates them. The importance
weights of the mismatch corrections (``tis`` / ``mis``, docs/algorithms.md's
"Mismatch corrections") are here too: ``is_weights`` computes the detached
weight at a loss's ratio unit, ``apply_correction`` applies it to the per-unit
loss, ``correction_stats`` gives ``mismatch/is_weight_mean`` and
``mismatch/corrected_frac`` (as sufficient statistics, like ``ratio_partials``:
``core/metrics.py``). Rejection by KL (``rejection_mask``, docs/algorithms.md's
"Controls") removes tokens or whole responses whose ``log rho`` statistic is
out of bounds.
"""

from __future__ import annotations

import math
import numbers

import torch

from gspo_bench.core.metrics import Partial, Plus, extreme_of, mean_of, spread_of, value
from gspo_bench.core.names import CORRECTION_LEVELS, CORRECTIONS

Tensor = torch.Tensor



def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # at least float32: bf16 ratios near 1 are too coarse (bf16 step at 1 is 2^-7)
    return torch.promote_types(dtype, torch.float32)


def masked_delta(logp_BT: Tensor, old_logp_BT: Tensor, mask_BT: Tensor) -> Tensor:
    # delta = logp - sg(old_logp), zeroed at padding before anything exponentiates it
    return torch.where(mask_BT > 0, logp_BT - old_logp_BT.detach(), 0.0)  # (B, T)


def seq_logratio(delta_BT: Tensor, mask_BT: Tensor) -> Tensor:
    len_B = mask_BT.sum(-1)
    # log s_i = sum_t(delta * mask) / |y_i|   (empty rows: 0, i.e. s_i = 1, never used)
    return (delta_BT * mask_BT).sum(-1) / torch.where(len_B > 0, len_B, 1.0)  # (B,)


def masked_mean(x: Tensor, w: Tensor) -> Tensor:
    # mean of x weighted by w over w > 0; 0 (not NaN) when nothing is selected
    return value(mean_of(x, w))


def masked_extreme(x: Tensor, keep: Tensor, largest: bool) -> Tensor:
    # max (min) of x over keep; 0 when nothing is kept
    return value(extreme_of(x, keep, largest))


def ratio_partials(logp_BT: Tensor, old_logp_BT: Tensor, mask_BT: Tensor, high_BT: Tensor, low_BT: Tensor
                   ) -> dict[str, Partial]:
    """The clip fractions, ratio spread and ``kl/old`` of some rows (docs/algorithms.md, "Clip fraction"), as
    their sufficient statistics (``core/metrics.py``: ``metrics.values`` gives the numbers), which merge over
    the parts of a minibatch into the whole minibatch's.

    ``high_BT`` / ``low_BT``: where the loss's clip binds on each side (token-expanded for sequence units).
    """
    valid_BT = mask_BT > 0
    delta_BT = masked_delta(logp_BT, old_logp_BT, mask_BT)
    ratio_BT = torch.exp(delta_BT)
    len_B = mask_BT.sum(-1)
    nonempty_B = len_B > 0
    seq_w_B = nonempty_B.to(mask_BT.dtype)

    frac_high = mean_of(high_BT.to(mask_BT.dtype), mask_BT)
    frac_low = mean_of(low_BT.to(mask_BT.dtype), mask_BT)
    # a sequence counts as clipped when any of its tokens is
    seq_clipped_B = ((high_BT | low_BT) & valid_BT).any(-1)
    # per-sequence log-ratio log s_i (its spread is over non-empty sequences)
    seq_log_B = seq_logratio(delta_BT, mask_BT)
    s_B = torch.exp(seq_log_B)
    # kl/old = r - 1 - log r = expm1(delta) - delta: k3 of KL(old || new), the tokens being the old policy's
    kl_old_BT = torch.expm1(delta_BT) - delta_BT

    return {
        "clip/frac": Plus((frac_high, frac_low)),
        "clip/frac_high": frac_high,
        "clip/frac_low": frac_low,
        "clip/seq_frac": mean_of(seq_clipped_B.to(mask_BT.dtype), seq_w_B),
        "ratio/mean": mean_of(ratio_BT, mask_BT),
        "ratio/min": extreme_of(ratio_BT, valid_BT, largest=False),
        "ratio/max": extreme_of(ratio_BT, valid_BT, largest=True),
        # population std of delta over the response tokens
        "ratio/token_log_std": spread_of(delta_BT, mask_BT),
        # population std of log s_i over the non-empty sequences
        "ratio/seq_log_std": spread_of(seq_log_B, seq_w_B),
        "ratio/seq_mean": mean_of(s_B, seq_w_B),
        "ratio/seq_min": extreme_of(s_B, nonempty_B, largest=False),
        "ratio/seq_max": extreme_of(s_B, nonempty_B, largest=True),
        "kl/old": mean_of(kl_old_BT, mask_BT),
    }


# |log rho| and |sum_t log rho| are clamped here before exponentiation in the chi-square diagnostics and the
# rejection statistics (verl's safety bound: e^20 is about 4.9e8)
LOG_RATIO_BOUND = 20.0


def mismatch_stats(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the sampler's log-probs are from the trainer's on the tokens the sampler drew.

    ``old_logp`` is the trainer's (recomputed) log-prob, ``rollout_logp`` the
    engine's, both (B, T). ``rho = exp(old_logp - rollout_logp)`` is trainer
    over sampler, so ``rho - 1 - log rho`` (k3) estimates KL(sampler || trainer)
    without bias: the tokens come from the sampler. Also: the chi-square
    divergence per token (``mean(rho^2) - 1``) and per response (``mean_i
    exp(2 sum_t log rho) - 1``), both with the log clamped to +-20, the
    normalised effective sample size of the token weights ``(mean rho)^2 /
    mean(rho^2)``, and the log-perplexity gap, trainer minus sampler, averaged
    over responses. Sequence means leave empty responses out.
    """
    dtype = compute_dtype(old_logp.dtype)
    mask_BT = mask.to(dtype)
    valid_BT = mask_BT > 0
    # log rho = old_logp - roll_logp, zero at padding
    log_rho_BT = torch.where(valid_BT, old_logp.detach().to(dtype) - rollout_logp.detach().to(dtype), 0.0)
    # k3 = rho - 1 - log rho
    k3_BT = torch.expm1(log_rho_BT) - log_rho_BT
    # per sequence: mean_t(log rho), and its population std over non-empty sequences
    seq_B = seq_logratio(log_rho_BT, mask_BT)
    seq_w_B = (mask_BT.sum(-1) > 0).to(dtype)
    seq_mean = masked_mean(seq_B, seq_w_B)
    # chi2_token = mean_t(rho^2) - 1, log rho clamped to +-20
    rho2_BT = torch.exp(2.0 * torch.clamp(log_rho_BT, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    # chi2_seq = mean_i exp(2 sum_t log rho) - 1, the sum clamped to +-20
    rho2_B = torch.exp(2.0 * torch.clamp((log_rho_BT * mask_BT).sum(-1), -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    # ess = (mean rho)^2 / mean(rho^2), rho per token: 1 when the weights agree
    rho_BT = torch.exp(log_rho_BT)
    ess = masked_mean(rho_BT, mask_BT).square() / masked_mean(rho_BT.square(), mask_BT)
    # ppl_gap = mean_i [mean_t(-old_logp) - mean_t(-roll_logp)] = mean_i mean_t(-log rho)
    ppl_gap = masked_mean(-seq_B, seq_w_B)
    return {
        "mismatch/kl": masked_mean(k3_BT, mask_BT),
        "mismatch/abs_diff_max": masked_extreme(log_rho_BT.abs(), valid_BT, largest=True),
        "mismatch/seq_log_ratio_std": masked_mean((seq_B - seq_mean).square(), seq_w_B).sqrt(),
        "mismatch/chi2_token": masked_mean(rho2_BT, mask_BT) - 1.0,
        "mismatch/chi2_seq": masked_mean(rho2_B, seq_w_B) - 1.0,
        "mismatch/ess": torch.where(mask_BT.sum() > 0, ess, 1.0),
        "mismatch/ppl_gap": ppl_gap,
    }


def rejection_mask(old_logp_BT: Tensor, rollout_logp_BT: Tensor, mask_BT: Tensor,
                   bounds: tuple[tuple[str, float | None, float], ...]) -> Tensor:
    """Bool (B, T): the response tokens that pass every rejection option (verl's ``rollout_rs``).

    ``bounds``: ``core.names.rejection_bounds``' ``(option, low, high)``. With ``l = log rho = old_logp -
    rollout_logp`` clamped to +-20: ``k1 = -l``, ``k2 = l^2 / 2``, ``k3 = exp(l) - 1 - l`` per token; a
    ``token_*`` option keeps a token whose statistic is within bounds, ``seq_mean_*`` / ``seq_max_*`` a whole
    response whose masked mean / max is (an empty response's is 0). ``low`` (k1 only) is a lower bound too.
    """
    dtype = compute_dtype(torch.promote_types(old_logp_BT.dtype, rollout_logp_BT.dtype))
    valid_BT = mask_BT > 0
    w_BT = mask_BT.to(dtype)
    # l = clamp(old_logp - roll_logp, -20, 20), zeroed at padding
    l_BT = torch.where(valid_BT, old_logp_BT.detach().to(dtype) - rollout_logp_BT.detach().to(dtype), 0.0)
    l_BT = torch.clamp(l_BT, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    # k1 = -l, k2 = l^2 / 2, k3 = exp(l) - 1 - l
    stats = {"k1": -l_BT, "k2": 0.5 * l_BT.square(), "k3": torch.exp(l_BT) - 1.0 - l_BT}
    keep_BT = valid_BT.clone()
    for option, low, high in bounds:
        level, k = option.rsplit("_", 1)
        s = stats[k]
        if level == "seq_mean":
            s = seq_logratio(s, w_BT)[:, None]  # the masked mean over the response
        elif level == "seq_max":
            s = masked_row_max(s, valid_BT)[:, None]
        ok = s <= high if low is None else (s >= low) & (s <= high)
        keep_BT = keep_BT & ok
    return keep_BT


def masked_row_max(x_BT: Tensor, keep_BT: Tensor) -> Tensor:
    """Each row's max over ``keep_BT``; 0 for a row with nothing kept. (B,)"""
    row_B = torch.where(keep_BT, x_BT, -math.inf).amax(-1)
    return torch.where(keep_BT.any(-1), row_B, 0.0)


# ----------------------------------------------------------------------------- mismatch corrections


def check_correction(correction: str, cap, rollout_logp: Tensor | None, shape: torch.Size, floor=None,
                     level: str = "unit") -> tuple[float, float | None]:
    """Validate a correction request; returns ``(C_max, C_min)``, ``C_min`` resolved (mis: ``1 / C_max`` when
    not given; tis: None, no floor)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; allowed: {CORRECTIONS}")
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"unknown correction_level {level!r}; allowed: {CORRECTION_LEVELS}")
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not (math.isfinite(cap) and cap > 1.0):
        raise ValueError(f"correction_cap must be a finite float > 1, got {cap!r}")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, numbers.Real)
                              or not (math.isfinite(floor) and 0.0 <= floor < cap)):
        raise ValueError(f"correction_min must be None or a finite float in [0, correction_cap={cap}), got {floor!r}")
    if rollout_logp is not None and rollout_logp.shape != shape:
        raise ValueError(f"rollout_logp shape {tuple(rollout_logp.shape)} != logp shape {tuple(shape)}")
    if floor is None and correction == "mis":
        floor = 1.0 / cap
    return float(cap), None if floor is None else float(floor)


def is_weights(old_logp_BT: Tensor, rollout_logp_BT: Tensor, mask_BT: Tensor, level: str
               ) -> tuple[Tensor, Tensor]:
    """The detached trainer/sampler importance weight at ``level``: "token", "sequence" or "geometric".

    Returns ``(w, unit_w)``: ``w`` is ``(B, T)`` for "token" (``w_t = rho_t``),
    ``(B,)`` for "sequence" (``w_i = exp(sum_t log rho_it)``, the product over
    the response) and "geometric" (``w_i = exp(mean_t log rho_it)``, length-normalised
    like GSPO's ``s_i``); ``unit_w`` weights each unit in the statistics: the
    mask for tokens, 1 for each non-empty sequence (0 for an empty one).
    Padding and empty rows get ``w = 1``.
    """
    if level not in ("token", "sequence", "geometric"):
        raise ValueError(f"level must be 'token', 'sequence' or 'geometric', got {level!r}")
    dtype = compute_dtype(torch.promote_types(old_logp_BT.dtype, rollout_logp_BT.dtype))
    mask_BT = mask_BT.to(dtype)
    # log rho = sg(old_logp) - sg(rollout_logp), zeroed at padding before anything exponentiates it
    log_rho_BT = torch.where(mask_BT > 0, old_logp_BT.detach().to(dtype) - rollout_logp_BT.detach().to(dtype), 0.0)
    if level == "token":
        # w_t = rho_t = exp(log rho_t)
        return torch.exp(log_rho_BT), mask_BT
    nonempty_B = (mask_BT.sum(-1) > 0).to(dtype)
    if level == "sequence":
        # w_i = exp(sum_t(log rho * mask)), the product of the token weights
        return torch.exp((log_rho_BT * mask_BT).sum(-1)), nonempty_B
    # w_i = exp(sum_t(log rho * mask) / |y_i|), length-normalised like s_i
    return torch.exp(seq_logratio(log_rho_BT, mask_BT)), nonempty_B


def apply_correction(unit_loss: Tensor, w: Tensor, mode: str, cap: float, floor: float | None = None,
                     mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Weight a per-unit loss by ``tis`` or ``mis``; returns (loss, corrected), ``corrected`` shaped like ``w``.

    tis: ``L_u * clamp(w_u, C_min, C_max)`` (``floor`` None: no lower bound).
    mis: ``L_u * w_u`` where ``C_min <= w_u <= C_max``, 0 elsewhere (a NaN weight
    counts as outside); a masked unit's term is 0 with no gradient, but it stays
    in the aggregation's denominator. ``corrected`` marks the units truncated or
    masked. ``floor`` is required for mis (``check_correction`` resolves it).

    ``w`` may be taken at another unit than the loss's: a per-sequence ``w``
    ``(B,)`` on a per-token loss ``(B, T)`` weights every token of the sequence;
    per-token weights ``(B, T)`` on a per-sequence loss ``(B,)`` (needs
    ``mask``) weight the sequence's term by the token mean of their corrected
    factors, as if the term were spread evenly over its tokens.
    """
    if mode not in ("tis", "mis"):
        raise ValueError(f"apply_correction needs 'tis' or 'mis', got {mode!r}")
    w = w.detach().to(unit_loss.dtype)
    if mode == "tis":
        # tis: factor = clamp(w, C_min, C_max)
        factor = torch.clamp(w, min=floor, max=cap)
        corrected = w > cap if floor is None else (w > cap) | (w < floor)
        kept = None
    else:
        if floor is None:
            raise ValueError("mis needs its lower bound (floor), e.g. 1 / cap")
        # mis: the unit keeps its weight w when C_min <= w <= C_max, else it is dropped
        kept = (w >= floor) & (w <= cap)
        corrected = ~kept
        factor = torch.where(kept, w, 0.0)
    if w.dim() == 2 and unit_loss.dim() == 1:
        if mask is None:
            raise ValueError("per-token weights on a per-sequence loss need the mask")
        # per-token factors on a sequence's term: their token mean over the response
        factor = seq_logratio(torch.where(mask > 0, factor, 0.0), mask.to(factor.dtype))
        kept = None if kept is None else factor != 0
    elif w.dim() == 1 and unit_loss.dim() == 2:
        # a per-sequence factor on every token of the sequence
        factor, w = factor[:, None], w[:, None]
        kept = None if kept is None else kept[:, None]
    if kept is None:
        # L_u <- factor_u * L_u
        return factor * unit_loss, corrected
    # L_u <- w_u * L_u if kept else 0 (where, not a product: a dropped inf term gives no NaN)
    return torch.where(kept, factor * unit_loss, 0.0), corrected


def correction_stats(w: Tensor, corrected: Tensor, unit_w: Tensor) -> dict[str, Partial]:
    """``mismatch/is_weight_mean`` (raw, untruncated ``w``) and ``mismatch/corrected_frac``, ``unit_w``-weighted,
    as sufficient statistics (``core/metrics.py``)."""
    return {
        "mismatch/is_weight_mean": mean_of(w.detach(), unit_w),
        "mismatch/corrected_frac": mean_of(corrected.to(unit_w.dtype), unit_w),
    }


def off_policy_sequences(logp_BT: Tensor, sampler_logp_BT: Tensor, mask_BT: Tensor, threshold: float) -> Tensor:
    """Bool ``(B,)``: the non-empty sequences whose ``mean_t(sampler_logp - sg(logp))`` exceeds ``threshold``.

    DeepSeek-V3.2's off-policy sequence masking (OPSM) drops those of them that have a negative advantage;
    the mean estimates KL(sampler || current policy) on the tokens the sampler drew.
    """
    valid_BT = mask_BT > 0
    # mean_t(roll_logp - sg(logp)) over the response
    kl_B = seq_logratio(torch.where(valid_BT, sampler_logp_BT.detach() - logp_BT.detach(), 0.0),
                        mask_BT.to(logp_BT.dtype))
    return (kl_B > threshold) & valid_BT.any(-1)


def loglinear_prox_logp(roll_logp_BT: Tensor, logp_BT: Tensor, versions_BT: Tensor, v_train: int) -> Tensor:
    """The proximal policy's log-probs without a forward pass (AReaL's log-linear approximation), ``(B, T)``:
    each token's log-prob moved from the sampler's toward the current policy's by how far the proximal version
    ``v_train - 1`` lies between the token's version and ``v_train``. A token sampled at ``v_train`` (or whose
    version is unknown, -1) keeps the sampler's log-prob; ``logp`` enters without gradient."""
    v_t = versions_BT.to(roll_logp_BT.dtype)
    v_theta, v_prox = float(v_train), float(v_train - 1)
    gap = v_theta - v_t
    # alpha_t = clamp((v_prox - v_t) / (v_theta - v_t), 0, 1) where v_theta > v_t, else 0
    alpha = torch.where((gap > 0) & (versions_BT >= 0), ((v_prox - v_t) / gap.clamp(min=1.0)).clamp(0.0, 1.0), 0.0)
    # prox_logp_t = roll_logp_t + alpha_t * (sg(logp_t) - roll_logp_t)
    return roll_logp_BT + alpha * (logp_BT.detach() - roll_logp_BT)


def m2po_mask(roll_logp_BT: Tensor, prox_logp_BT: Tensor, mask_BT: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """M2PO's token mask (arXiv 2510.01161), ``(B, T)`` bool, and the mean second moment before masking.

    ``m2_t = (roll_logp_t - prox_logp_t)^2`` over the response tokens of ``mask``; the fewest tokens of largest
    ``m2`` are masked such that the mean ``m2`` of the rest is below ``tau``, keeping at least one. True where
    a token stays; False off the response too."""
    valid = mask_BT > 0
    m2 = (roll_logp_BT.detach() - prox_logp_BT.detach()).float().pow(2)
    vals = m2[valid]
    keep = valid.clone()
    if vals.numel() == 0:
        return keep, m2.new_zeros(())
    mean_all = vals.mean()
    order = torch.argsort(vals, descending=True)
    sorted_m2 = vals[order]
    n = vals.numel()
    # the mean of the rest after masking the k largest, k = 0 .. n - 1: suffix sums of the sorted values / (n - k)
    suffix = torch.flip(torch.cumsum(torch.flip(sorted_m2, [0]), 0), [0])  # suffix[k] = sum of sorted_m2[k:]
    rest_mean = suffix / torch.arange(n, 0, -1, device=vals.device, dtype=suffix.dtype)
    below = (rest_mean < tau).nonzero()
    k = int(below[0]) if len(below) else n - 1  # the fewest masked; at least one token kept
    dropped = torch.zeros(n, dtype=torch.bool, device=vals.device)
    dropped[order[:k]] = True
    keep[valid] = ~dropped
    return keep, mean_all
