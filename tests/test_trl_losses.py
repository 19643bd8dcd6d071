"""The new losses and the mismatch corrections against TRL's own loss code, on the same tensors.

``GRPOTrainer._compute_loss`` (TRL 1.16) is called on a stand-in trainer whose forward pass returns our
log-probs, so TRL's formulas, aggregation and masks run unchanged; value and gradient must match ours. The
sampler/trainer weight TRL builds while generating (``importance_sampling_ratio``) is rebuilt here the way TRL's
``_generate_and_score_completions`` builds it for each ``vllm_importance_sampling_mode``.

Where TRL and the pinned definitions differ (docs/algorithms.md says the same):

- ``dr_grpo`` and ``luspo``: TRL divides by every row of the batch, an empty response included; we leave empty
  responses out of the count. Equal when no response is empty (as here).
- ``vespo`` with a correction: TRL folds the sampler weight into ``phi``'s argument (token modes only); we
  multiply the loss term by the corrected sequence weight like any other loss. Not compared.
- ``*_mask`` modes: TRL's lower bound defaults to none, ours to ``1 / C_max``; the comparison passes both.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from gspo_bench.core.losses import policy_loss

trl = pytest.importorskip("trl", reason="trl is not installed (the compare extra)")
from trl import GRPOTrainer  # noqa: E402

F64 = torch.float64
B, T = 4, 5


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05
    old = logp + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    roll = old + 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.tensor([1.0, -0.7, 0.4, -1.3], dtype=F64)
    mask = torch.arange(T)[None] < torch.tensor([5, 3, 4, 2])[:, None]
    return logp, old, roll, adv, mask


class _Accelerator:
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(loss_type, logp, old, adv, mask, level="token", eps=(0.2, 0.2), t_max=T, is_ratio=None,
             sampling=None, opsm=None):
    """TRL's ``_compute_loss`` on our tensors; returns the loss (grad flows into ``logp``)."""
    args = SimpleNamespace(delta=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
                           vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0, steps_per_generation=1,
                           use_bias_correction_kl=False)
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=opsm, importance_sampling_level=level, beta=0.0,
        loss_type=loss_type, epsilon_low=eps[0], epsilon_high=eps[1], args=args,
        use_vllm=is_ratio is not None, vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, max_completion_length=t_max,
        accelerator=_Accelerator(), _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)}, get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=GRPOTrainer.get_gamma_weights)
    m = mask.to(F64)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": m, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": m.sum()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    if sampling is not None:
        inputs["sampling_per_token_logps"] = sampling
    return GRPOTrainer._compute_loss(fake, None, inputs)


def trl_is_ratio(mode, old, roll, mask, c_max, c_min):
    """``importance_sampling_ratio`` as TRL's ``_generate_and_score_completions`` builds it."""
    diff = torch.nan_to_num((old - roll) * mask.to(F64), nan=0.0)
    log_w = diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff
    w = torch.exp(log_w)
    if mode.endswith("truncate"):
        return torch.clamp(w, min=c_min, max=c_max)
    lo = c_min if c_min is not None else -math.inf
    return w.masked_fill((w < lo) | (w > c_max), 0.0)


def both(name, trl_kw, ours_kw, seed=0):
    logp, old, roll, adv, mask = tensors(seed)
    x = logp.clone().requires_grad_(True)
    theirs = trl_loss(logp=x, old=old, adv=adv, mask=mask, **trl_kw(roll, old, mask))
    (g_theirs,) = torch.autograd.grad(theirs, x)
    y = logp.clone().requires_grad_(True)
    ours, _ = policy_loss(name, logp=y, old_logp=old, advantages=adv, mask=mask, **ours_kw(roll))
    (g_ours,) = torch.autograd.grad(ours, y)
    return theirs.detach(), ours.detach(), g_theirs, g_ours


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name, trl_kw, ours_kw", [
    ("sapo", lambda r, o, m: {"loss_type": "sapo"}, lambda r: {}),
    ("dr_grpo", lambda r, o, m: {"loss_type": "dr_grpo", "t_max": 8}, lambda r: {"max_new_tokens": 8}),
    ("luspo", lambda r, o, m: {"loss_type": "luspo", "level": "sequence", "eps": (3e-4, 4e-4)}, lambda r: {}),
    ("vespo", lambda r, o, m: {"loss_type": "vespo"}, lambda r: {}),
    ("grpo", lambda r, o, m: {"loss_type": "grpo"}, lambda r: {}),
    ("gspo", lambda r, o, m: {"loss_type": "grpo", "level": "sequence", "eps": (3e-4, 4e-4)}, lambda r: {}),
    ("grpo", lambda r, o, m: {"loss_type": "grpo", "sampling": r, "opsm": 0.05},
     lambda r: {"rollout_logp": r, "opsm_threshold": 0.05}),
])
def test_loss_matches_trl(name, trl_kw, ours_kw, seed):
    theirs, ours, g_theirs, g_ours = both(name, trl_kw, ours_kw, seed)
    # sapo: TRL builds its temperatures with torch.where on python floats, i.e. in float32 (1.05 -> 1.0499999523)
    tol = 1e-6 if name == "sapo" else 1e-12
    assert_close(ours, theirs, rtol=tol, atol=tol)
    assert_close(g_ours, g_theirs, rtol=tol, atol=tol)
    assert g_ours.abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode, correction, level, c_min", [
    ("token_truncate", "tis", "token", None), ("token_truncate", "tis", "token", 0.5),
    ("token_mask", "mis", "token", 0.5), ("token_mask", "mis", "token", 0.0),
    ("sequence_truncate", "tis", "sequence", None), ("sequence_mask", "mis", "sequence", 0.3),
])
@pytest.mark.parametrize("name, trl_kw", [
    ("grpo", {"loss_type": "grpo"}),
    ("dapo", {"loss_type": "bnpo", "eps": (0.2, 0.28)}),  # bnpo: TRL's token-mean over the minibatch
    ("gspo", {"loss_type": "grpo", "level": "sequence", "eps": (3e-4, 4e-4)}),
    ("sapo", {"loss_type": "sapo"}),
])
def test_importance_sampling_modes_match_trl(name, trl_kw, mode, correction, level, c_min, seed):
    cap = 1.5

    def theirs_kw(roll, old, mask):
        return {**trl_kw, "is_ratio": trl_is_ratio(mode, old, roll, mask, cap, c_min)}

    def ours_kw(roll):
        return {"rollout_logp": roll, "correction": correction, "correction_cap": cap, "correction_min": c_min,
                "correction_level": level}

    theirs, ours, g_theirs, g_ours = both(name, theirs_kw, ours_kw, seed)
    tol = 1e-6 if name == "sapo" else 1e-12  # TRL's float32 temperatures, as above
    assert_close(ours, theirs, rtol=tol, atol=tol)
    assert_close(g_ours, g_theirs, rtol=tol, atol=tol)
