"""Masked reductions and the sampler/trainer mismatch statistics (``gspo_bench/core/ratios.py``), by hand.

The clip and ratio statistics are checked through ``policy_loss`` in ``test_losses.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from gspo_bench.core.ratios import masked_extreme, masked_mean, mismatch_stats

e = math.exp


def close(a, b, tol=1e-9):
    assert a == pytest.approx(b, abs=tol), (a, b)


def test_masked_mean_and_extreme_ignore_the_mask_zeros_and_never_nan():
    x = torch.tensor([[1.0, 5.0, float("inf")]])
    w = torch.tensor([[1.0, 1.0, 0.0]])
    close(masked_mean(x, w).item(), 3.0)
    close(masked_extreme(x, w > 0, largest=True).item(), 5.0)
    # nothing selected: 0, not NaN
    assert masked_mean(x, torch.zeros_like(w)).item() == 0.0
    assert masked_extreme(x, torch.zeros_like(w, dtype=torch.bool), largest=False).item() == 0.0


def test_mismatch_stats_by_hand():
    # trainer (old_logp) vs sampler (rollout_logp); row 1's last token is padding with garbage
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 9.0]])
    roll = torch.tensor([[-1.2, -1.9, -0.5], [-0.1, -0.7, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    st = mismatch_stats(old, roll, mask)
    log_rho = [0.2, -0.1, 0.0, -0.2, 0.0]  # old - roll on response tokens
    # k3 = rho - 1 - log rho, rho = exp(log rho): KL(sampler || trainer)
    close(st["mismatch/kl"].item(), sum(e(x) - 1 - x for x in log_rho) / 5, 1e-7)
    close(st["mismatch/abs_diff_max"].item(), 0.2, 1e-6)
    # per-sequence mean of log rho: 0.1 / 3 and -0.2 / 2, population std over the two
    a, b = 0.1 / 3, -0.1
    close(st["mismatch/seq_log_ratio_std"].item(), abs(a - b) / 2, 1e-6)
    # the same logits on both sides: no mismatch at all (an effective sample size of 1: every weight is 1)
    zero = mismatch_stats(old, old, mask)
    assert all(v.item() == (1.0 if k == "mismatch/ess" else 0.0) for k, v in zero.items()), zero


def test_the_loglinear_proximal_log_probs_by_hand():
    from gspo_bench.core.ratios import loglinear_prox_logp

    roll = torch.tensor([[-1.0, -2.0, -3.0, -0.5]], dtype=torch.float64)
    logp = torch.tensor([[-0.5, -1.0, -1.0, -0.1]], dtype=torch.float64, requires_grad=True)
    versions = torch.tensor([[7, 5, 4, -1]])
    prox = loglinear_prox_logp(roll, logp, versions, 7)
    # v_theta = 7, v_prox = 6: a token of version 7 keeps the sampler's (alpha 0); of 5, alpha = (6 - 5) / (7 - 5)
    # = 1/2; of 4, alpha = 2/3; version -1 (no sampler) keeps it too
    want = [-1.0, -2.0 + 0.5 * (-1.0 + 2.0), -3.0 + (2 / 3) * (-1.0 + 3.0), -0.5]
    assert prox[0].tolist() == pytest.approx(want)
    assert not prox.requires_grad  # sg(logp): no gradient reaches the current policy through it


def test_m2po_masks_the_fewest_largest_second_moments_by_hand():
    from gspo_bench.core.ratios import m2po_mask

    roll = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    prox = torch.tensor([[1.0, 2.0, 0.1], [0.0, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # m2 over the response: 1, 4, 0.01, 0, 0.25 (the padded 81 is not one); mean 5.26 / 5 = 1.052
    keep, m2 = m2po_mask(roll, prox, mask, 0.5)
    assert float(m2) == pytest.approx(5.26 / 5)
    # masking 4 leaves (1 + .01 + 0 + .25) / 4 = 0.315 < 0.5: one token masked, the padding never kept
    assert keep.tolist() == [[True, False, True], [True, True, False]]
    # a threshold no mean reaches masks all but the smallest one
    keep, _ = m2po_mask(roll, prox, mask, 1e-9)
    assert keep.tolist() == [[False, False, False], [True, False, False]]
    # a mean already below keeps everything
    keep, _ = m2po_mask(roll, prox, mask, 2.0)
    assert keep.tolist() == (mask > 0).tolist()
    keep, m2 = m2po_mask(roll, prox, torch.zeros_like(mask), 0.5)
    assert not keep.any() and float(m2) == 0.0
