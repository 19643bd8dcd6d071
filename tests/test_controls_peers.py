"""The controls against the peers' own code, on the same tensors: TRL 1.16's ``GRPOTrainer._compute_loss`` (the
two-sided clip ``delta``, ``bnpo``, the top-entropy mask, the entropy bonus and its adaptive coefficient) and verl's
(``tests/verl_code.py``, copied verbatim: Clip-Cov, KL-Cov, rejection by KL, the off-policy diagnostics).

Differences, as docs/algorithms.md lists them (each asserted below where the two can be compared):

- Truncated responses: TRL zeroes their mask as we do, but its ``grpo`` / ``sapo`` aggregations divide by every row
  (a fully masked one included); we leave an empty response out of the sequence mean. With ``bnpo`` / ``dapo`` the
  two agree.
- Clip-Cov and KL-Cov: verl's masked means divide by ``count + 1e-8``: equal to 1e-9 relative here. verl draws
  Clip-Cov's tokens with the global generator; we pass the run's (seeded the same here, the same draw).
- ``chi2_seq`` and the log-perplexity gap: verl averages over every row, an empty response included; equal when none
  is empty (as here). verl's effective sample size is of a correction's truncated weights; ours is of the raw ``rho``
  and is not compared.
- The top-entropy mask: TRL takes the quantile in float32; compared on float32 entropies.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from gspo_bench.core.losses import policy_loss, top_entropy_mask
from gspo_bench.core.names import REJECTION_OPTIONS, rejection_bounds
from gspo_bench.core.ratios import mismatch_stats, rejection_mask
from tests import verl_code as verl

trl = pytest.importorskip("trl", reason="trl is not installed (the compare extra)")
from trl import GRPOTrainer  # noqa: E402

F64 = torch.float64
B, T = 6, 7


def tensors(seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    roll = old + 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    ent = torch.rand(B, T, generator=g, dtype=F64) * 3
    mask = torch.arange(T)[None] < torch.tensor([7, 3, 5, 2, 6, 4])[:, None]
    return [x.to(dtype) for x in (logp, old, roll, adv, ent)] + [mask]


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def trl_trainer(loss_type, eps=(0.2, 0.2), delta=None, q=1.0, entropy_coef=0.0, adaptive=None):
    """A stand-in ``GRPOTrainer`` on which TRL's ``_compute_loss`` runs unchanged. ``adaptive``: (target, delta,
    min, max) of TRL's adaptive entropy control."""
    target, step, lo, hi = adaptive or (None, 0.0, 0.0, 1.0)
    args = SimpleNamespace(delta=delta, steps_per_generation=1, use_bias_correction_kl=False, entropy_target=target,
                           sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                           entropy_coef_delta=step, entropy_coef_min=lo, entropy_coef_max=hi)
    fake = SimpleNamespace(
        top_entropy_quantile=q, off_policy_mask_threshold=None, importance_sampling_level="token", beta=0.0,
        loss_type=loss_type, epsilon_low=eps[0], epsilon_high=eps[1], args=args, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=T, accelerator=_Accelerator(),
        _entropy_bonus_enabled=entropy_coef != 0.0 or adaptive is not None, entropy_coef=entropy_coef,
        use_adaptive_entropy=adaptive is not None, _last_world_entropy=math.inf, _entropy_window_stats=None,
        aux_loss_enabled=False, _metrics={"train": defaultdict(list)})
    fake.get_high_entropy_mask = lambda *a: GRPOTrainer.get_high_entropy_mask(fake, *a)
    return fake


def trl_loss(fake, logp, ent, old, adv, mask):
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    m = mask.to(logp.dtype)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": m, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": m.sum()}
    return GRPOTrainer._compute_loss(fake, None, inputs)


def both(name, trainer, ours, seed=0, dtype=F64, mask_fn=None):
    """TRL's loss and ours, with their gradients with respect to logp and the entropy."""
    logp, old, _, adv, ent, mask = tensors(seed, dtype)
    m = mask if mask_fn is None else mask_fn(mask)
    x, h = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    theirs = trl_loss(trainer, x, h, old, adv, m)
    g_theirs = torch.autograd.grad(theirs, (x, h), allow_unused=True)
    y, k = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    loss, stats = policy_loss(name, logp=y, old_logp=old, advantages=adv, mask=m, entropy=k, **ours)
    g_ours = torch.autograd.grad(loss, (y, k), allow_unused=True)
    return theirs.detach(), loss.detach(), g_theirs, g_ours, stats


def check(theirs, ours, g_theirs, g_ours, tol=1e-12):
    """Equal losses, and equal gradients with respect to logp and the entropy (None: no gradient reached it)."""
    assert_close(ours, theirs, rtol=tol, atol=tol)
    for a, b in zip(g_ours, g_theirs):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any())
        else:
            assert_close(a, b, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- TRL


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name, loss_type, eps", [("grpo", "grpo", (0.2, 0.2)), ("dapo", "bnpo", (0.2, 0.28)),
                                                  ("dr_grpo", "dr_grpo", (0.2, 0.2))])
def test_two_sided_clip_matches_trl_delta(name, loss_type, eps, seed):
    kw = {"max_new_tokens": T} if name == "dr_grpo" else {}
    out = both(name, trl_trainer(loss_type, eps, delta=1.3), {"delta_clip": 1.3, **kw}, seed)
    check(*out[:4])
    # the cap binds on these inputs: the loss differs from the one without it
    plain = both(name, trl_trainer(loss_type, eps), kw, seed)
    assert not torch.equal(out[1], plain[1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bnpo_matches_trl_bnpo(seed):
    # TRL's bnpo is a loss type (the clipped surrogate, token-mean over the process's rows); ours is grpo's loss
    # with loss.aggregation bnpo
    out = both("grpo", trl_trainer("bnpo"), {"aggregation": "bnpo"}, seed)
    check(*out[:4])
    assert not torch.equal(out[1], both("grpo", trl_trainer("grpo"), {}, seed)[1])  # not grpo's own mean


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("q", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("name, loss_type", [("grpo", "grpo"), ("dapo", "bnpo"), ("sapo", "sapo")])
def test_top_entropy_mask_and_bonus_match_trl(name, loss_type, q, seed):
    eps = (0.2, 0.28) if name == "dapo" else (0.2, 0.2)
    trainer = trl_trainer(loss_type, eps, q=q, entropy_coef=0.03)
    theirs, ours, g_theirs, g_ours, stats = both(name, trainer, {"top_entropy_quantile": q, "entropy_coef": 0.03},
                                                 seed, dtype=torch.float32)
    check(theirs, ours, g_theirs, g_ours, tol=2e-6)
    _, _, _, _, ent, mask = tensors(seed, torch.float32)
    theirs_mask = GRPOTrainer.get_high_entropy_mask(trainer, ent, mask, 1 - q)
    assert torch.equal(top_entropy_mask(ent, mask, q), theirs_mask)
    assert_close(stats["loss/entropy_mask_frac"], theirs_mask.sum() / mask.sum())


def test_adaptive_entropy_matches_trl_step_by_step():
    from gspo_bench.core.entropy_control import EntropyControl
    from gspo_bench.config import Recipe, load_config
    from gspo_bench.core.losses import LOSSES

    target, step, lo, hi = 1.45, 0.01, 0.0, 0.025
    trainer = trl_trainer("grpo", entropy_coef=0.005, adaptive=(target, step, lo, hi))
    cfg = load_config("smoke", overrides={"loss": {"entropy_coef": 0.005, "entropy_target": target,
                                                   "entropy_coef_delta": step, "entropy_coef_min": lo,
                                                   "entropy_coef_max": hi}})
    settings = cfg.resolve("grpo", Recipe(loss_defaults=LOSSES["grpo"].param_defaults()), T)
    control = EntropyControl.of(settings.loss)
    coefs, applied = [], []
    for seed in range(8):  # eight optimiser steps; the entropies' means straddle the target
        logp, old, _, adv, ent, mask = tensors(seed)
        ent = ent * (0.7 if seed % 3 else 1.2)
        x = logp.clone().requires_grad_(True)
        theirs = trl_loss(trainer, x, ent, old, adv, mask)
        c = control.applied()
        applied.append(c)
        ours, _ = policy_loss("grpo", logp=logp, old_logp=old, advantages=adv, mask=mask, entropy=ent,
                              **({"entropy_coef": c} if c > 0 else {}))
        assert_close(ours, theirs.detach(), rtol=1e-12, atol=1e-12)
        control.adapt(ent, mask)
        assert control.coef == pytest.approx(trainer.entropy_coef, abs=1e-15)
        assert control.last_entropy == pytest.approx(trainer._last_world_entropy, rel=1e-12)
        coefs.append(control.coef)
    # the control moved both ways and the gate closed at least once
    assert len(set(coefs)) > 2 and 0.0 in applied and any(a > 0 for a in applied)


@pytest.mark.parametrize("seed", [0, 1])
def test_truncated_responses_against_trl(seed):
    # TRL masks a truncated completion's whole row (mask_truncated_completions), as rollout.mask_truncated does
    truncated = torch.tensor([False, True, False, False, True, False])

    def cut(mask):
        return mask & ~truncated[:, None]

    theirs, ours, g_theirs, g_ours, _ = both("dapo", trl_trainer("bnpo", (0.2, 0.28)), {}, seed, mask_fn=cut)
    check(theirs, ours, g_theirs, g_ours)
    # grpo: TRL's mean over rows counts the two emptied rows, ours leaves them out: theirs = ours * 4 / 6
    theirs, ours, _, _, _ = both("grpo", trl_trainer("grpo"), {}, seed, mask_fn=cut)
    assert_close(theirs, ours * 4 / 6, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- verl


def _per_token_adv(adv, mask):
    return torch.where(mask, adv[:, None].expand(B, T), 0.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio, lb, ub", [(2e-4, 1.0, 5.0), (0.2, -0.1, 0.6), (0.5, -5.0, 5.0), (0.05, 0.0, 0.3)])
def test_clip_cov_matches_verl(ratio, lb, ub, seed):
    logp, old, _, adv, _, mask = tensors(seed)
    adv = adv * 3  # covariances reaching the default window (1, 5)
    m = mask.to(F64)
    x = logp.clone().requires_grad_(True)
    torch.manual_seed(100 + seed)  # verl draws with the global generator
    theirs, metrics = verl.compute_policy_loss_clip_cov(
        old, x, _per_token_adv(adv, mask), m, "token-mean",
        verl.actor_config(0.2, clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub))
    (g_theirs,) = torch.autograd.grad(theirs, x)
    y = logp.clone().requires_grad_(True)
    ours, stats = policy_loss("clip_cov", logp=y, old_logp=old, advantages=adv, mask=mask, clip_cov_ratio=ratio,
                              clip_cov_lb=lb, clip_cov_ub=ub, generator=torch.Generator().manual_seed(100 + seed))
    (g_ours,) = torch.autograd.grad(ours, y)
    assert_close(ours.detach(), theirs.detach(), rtol=1e-9, atol=1e-12)
    assert_close(g_ours, g_theirs, rtol=1e-9, atol=1e-12)
    assert stats["clip/frac"].item() == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-9)


def test_clip_cov_comparison_reaches_the_draw():
    # over the seeds of the comparison, some draws pick fewer tokens than there are candidates (the generator
    # decides which), and the default window selects some token
    picked = []
    for seed in range(6):
        logp, old, _, adv, _, mask = tensors(seed)
        for ratio, lb in ((2e-4, 1.0), (0.2, -0.1)):
            _, st = policy_loss("clip_cov", logp=logp, old_logp=old, advantages=adv * 3, mask=mask,
                                clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=5.0 if lb == 1.0 else 0.6)
            picked.append((ratio, st["clip/frac"].item() * mask.sum().item()))
    assert any(r == 2e-4 and n == 1 for r, n in picked) and any(r == 0.2 and n > 1 for r, n in picked), picked


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio, coef", [(2e-4, 1.0), (0.1, 1.0), (0.3, 2.5)])
def test_kl_cov_matches_verl(ratio, coef, seed):
    logp, old, _, adv, _, mask = tensors(seed)
    m = mask.to(F64)
    x = logp.clone().requires_grad_(True)
    theirs, _ = verl.compute_policy_loss_kl_cov(old, x, _per_token_adv(adv, mask), m, "token-mean",
                                               verl.actor_config(kl_cov_ratio=ratio, ppo_kl_coef=coef))
    (g_theirs,) = torch.autograd.grad(theirs, x)
    y = logp.clone().requires_grad_(True)
    ours, stats = policy_loss("kl_cov", logp=y, old_logp=old, advantages=adv, mask=mask, kl_cov_ratio=ratio,
                              kl_cov_coef=coef)
    (g_ours,) = torch.autograd.grad(ours, y)
    assert_close(ours.detach(), theirs.detach(), rtol=1e-9, atol=1e-12)
    assert_close(g_ours, g_theirs, rtol=1e-9, atol=1e-12)
    assert stats["clip/frac"].item() == pytest.approx(max(1, int(ratio * m.sum().item())) / m.sum().item())


THRESHOLDS = {"k1": ["0.5_2.0", "0.8_1.5", "1.2", "0.9_1.0"], "k2": ["0.02", "0.1", "0.5"],
              "k3": ["0.02", "0.1", "0.5"]}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("option", REJECTION_OPTIONS)
def test_rejection_matches_verl(option, seed):
    logp, old, roll, _, _, mask = tensors(seed)
    m = mask.to(F64)
    for threshold in THRESHOLDS[option[-2:]]:
        theirs, metrics = verl.compute_rollout_rejection_mask(old - roll, m, option, threshold)
        keep = rejection_mask(old, roll, mask, rejection_bounds(option, threshold))
        assert torch.equal(keep, theirs.bool() & mask), (option, threshold)
        assert (~keep & mask).sum() / mask.sum() == pytest.approx(metrics["rollout_rs_masked_fraction"], abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_combinations_match_verl(seed):
    logp, old, roll, _, _, mask = tensors(seed)
    m = mask.to(F64)
    for options, threshold in (("token_k1,seq_max_k2", "0.5_2.0,0.3"), ("seq_mean_k3,token_k2", "0.1,0.2"),
                               ("token_k3,seq_mean_k2,seq_max_k3", "0.3")):
        theirs, _ = verl.compute_rollout_rejection_mask(old - roll, m, options, threshold)
        keep = rejection_mask(old, roll, mask, rejection_bounds(options, threshold))
        assert torch.equal(keep, theirs.bool() & mask), options
    # the comparison's thresholds keep some tokens and reject others
    keep = rejection_mask(old, roll, mask, rejection_bounds("token_k2", 0.1))
    assert 0 < keep.sum() < mask.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_off_policy_diagnostics_match_verl(seed):
    _, old, roll, _, _, mask = tensors(seed)
    m = mask.to(F64)
    theirs = verl.compute_offpolicy_metrics(old, roll, m)
    ours = mismatch_stats(old, roll, mask)
    assert ours["mismatch/chi2_token"].item() == pytest.approx(theirs["chi2_token"], rel=1e-7)
    assert ours["mismatch/chi2_seq"].item() == pytest.approx(theirs["chi2_seq"], rel=1e-7)
    assert ours["mismatch/ppl_gap"].item() == pytest.approx(theirs["log_ppl_diff"], rel=1e-7, abs=1e-12)
    assert ours["mismatch/kl"].item() == pytest.approx(theirs["k3_kl"], rel=1e-7)
