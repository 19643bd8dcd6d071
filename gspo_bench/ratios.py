"""Masked reductions over (B, T) token grids, and the ratio statistics every step logs.

Pure functions of tensors, shared by ``losses.py`` (which computes the loss)
and the diagnostics callbacks (which measure the sampler/trainer mismatch).
The definitions are ALGORITHMS.md's "Clip fraction" and "Rollout precision and
the mismatch" sections; ``docs/algorithms.md`` restates them.
"""

from __future__ import annotations

import math

import torch

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
    n = w.sum()
    return torch.where(w > 0, x * w, 0.0).sum() / torch.where(n > 0, n, 1.0)


def masked_extreme(x: Tensor, keep: Tensor, largest: bool) -> Tensor:
    fill = -math.inf if largest else math.inf
    filled = torch.where(keep, x, fill)
    ext = filled.amax() if largest else filled.amin()
    return torch.where(keep.any(), ext, 0.0)



def ratio_stats(logp_BT: Tensor, old_logp_BT: Tensor, mask_BT: Tensor, high_BT: Tensor, low_BT: Tensor
                ) -> dict[str, Tensor]:
    """The clip fractions, ratio spread and ``kl/old`` of one minibatch (ALGORITHMS.md, "Clip fraction").

    ``high_BT`` / ``low_BT``: where the loss's clip binds on each side (token-expanded for sequence units).
    """
    valid_BT = mask_BT > 0
    delta_BT = masked_delta(logp_BT, old_logp_BT, mask_BT)
    ratio_BT = torch.exp(delta_BT)
    len_B = mask_BT.sum(-1)
    nonempty_B = len_B > 0
    seq_w_B = nonempty_B.to(mask_BT.dtype)

    frac_high = masked_mean(high_BT.to(mask_BT.dtype), mask_BT)
    frac_low = masked_mean(low_BT.to(mask_BT.dtype), mask_BT)
    # a sequence counts as clipped when any of its tokens is
    seq_clipped_B = ((high_BT | low_BT) & valid_BT).any(-1)

    # population std of delta over response tokens
    delta_mean = masked_mean(delta_BT, mask_BT)
    token_log_std = masked_mean((delta_BT - delta_mean).square(), mask_BT).sqrt()
    # per-sequence log-ratio log s_i and its population std over non-empty sequences
    seq_log_B = seq_logratio(delta_BT, mask_BT)
    seq_log_mean = masked_mean(seq_log_B, seq_w_B)
    seq_log_std = masked_mean((seq_log_B - seq_log_mean).square(), seq_w_B).sqrt()
    s_B = torch.exp(seq_log_B)
    # kl/old = r - 1 - log r = expm1(delta) - delta: k3 of KL(old || new), the tokens being the old policy's
    kl_old_BT = torch.expm1(delta_BT) - delta_BT

    return {
        "clip/frac": frac_high + frac_low,
        "clip/frac_high": frac_high,
        "clip/frac_low": frac_low,
        "clip/seq_frac": masked_mean(seq_clipped_B.to(mask_BT.dtype), seq_w_B),
        "ratio/mean": masked_mean(ratio_BT, mask_BT),
        "ratio/min": masked_extreme(ratio_BT, valid_BT, largest=False),
        "ratio/max": masked_extreme(ratio_BT, valid_BT, largest=True),
        "ratio/token_log_std": token_log_std,
        "ratio/seq_log_std": seq_log_std,
        "ratio/seq_mean": masked_mean(s_B, seq_w_B),
        "ratio/seq_min": masked_extreme(s_B, nonempty_B, largest=False),
        "ratio/seq_max": masked_extreme(s_B, nonempty_B, largest=True),
        "kl/old": masked_mean(kl_old_BT, mask_BT),
    }


def mismatch_stats(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the sampler's log-probs are from the trainer's on the tokens the sampler drew.

    ``old_logp`` is the trainer's (recomputed) log-prob, ``rollout_logp`` the
    engine's, both (B, T). ``rho = exp(old_logp - rollout_logp)`` is trainer
    over sampler, so ``rho - 1 - log rho`` (k3) estimates KL(sampler || trainer)
    without bias: the tokens come from the sampler.
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
    return {
        "mismatch/kl": masked_mean(k3_BT, mask_BT),
        "mismatch/abs_diff_max": masked_extreme(log_rho_BT.abs(), valid_BT, largest=True),
        "mismatch/seq_log_ratio_std": masked_mean((seq_B - seq_mean).square(), seq_w_B).sqrt(),
    }
