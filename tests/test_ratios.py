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
