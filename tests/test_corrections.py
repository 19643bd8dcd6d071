"""Truncated / masked importance-sampling corrections (``tis`` / ``mis``) in ``policy_loss``, by hand.

docs/algorithms.md, "Mismatch corrections": ``rho = exp(old_logp - rollout_logp)``
per token; at the default level the weight is ``w_t = rho_t`` for token-unit
losses and ``w_i = exp(mean_t log rho_it)`` for gspo, detached. ``tis`` scales
each unit's term by ``min(w, C)``; ``mis`` keeps ``w`` on the units with ``w``
inside ``[1/C, C]``, zeroes the others and keeps them in the denominator.
Expected numbers are written out with ``math``. The levels, ``correction_min``,
the new losses and off-policy sequence masking are in ``test_field_losses.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from gspo_bench.core.losses import LOSSES, policy_loss
from gspo_bench.core.names import CORRECTIONS
from gspo_bench.core.ratios import apply_correction, is_weights

e = math.exp
F64 = torch.float64

# The shared 2x3 example of test_losses.py. Row 1's last token is padding (garbage there).
DELTA = [[0.2, -0.3, 0.5], [-0.4, 0.5, 3.0]]  # logp - old_logp
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]]
ADV = [1.0, -0.5]
MASK = [[1, 1, 1], [1, 1, 0]]
# log rho = old_logp - rollout_logp; the padding entry becomes old - (-inf) = +inf
LOG_RHO = [[0.1, 1.0, -0.5], [-1.0, 0.3, -math.inf]]


def example(log_rho=LOG_RHO):
    logp = torch.tensor(LOGP, dtype=F64, requires_grad=True)
    old = logp.detach() - torch.tensor(DELTA, dtype=F64)
    roll = old - torch.tensor(log_rho, dtype=F64)
    return logp, old, roll, torch.tensor(ADV, dtype=F64), torch.tensor(MASK, dtype=torch.bool)


def run(name, log_rho=LOG_RHO, **kw):
    logp, old, roll, adv, mask = example(log_rho)
    loss, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, rollout_logp=roll, **kw)
    loss.backward()
    return loss.detach(), logp.grad, stats


def t(x):
    return torch.tensor(x, dtype=F64)


def need(name):
    # dr_grpo's aggregation needs the rollout's length cap
    return {"max_new_tokens": 4} if name == "dr_grpo" else {}


# ----------------------------------------------------------------------------- token units


def test_grpo_tis_by_hand():
    loss, grad, stats = run("grpo", correction="tis", correction_cap=2.0)
    # rho = e^.1, e^1 (> 2: truncated to 2), e^-.5 | e^-1, e^.3 ; padding ignored
    m = [[e(0.1), 2.0, e(-0.5)], [e(-1.0), e(0.3)]]
    # grpo terms (test_losses): t00 -1.2 clipped, t01 -e^-.3, t02 -1.2 clipped | t10 .4 clipped, t11 .5 e^.5
    row0 = (m[0][0] * -1.2 + m[0][1] * -e(-0.3) + m[0][2] * -1.2) / 3
    row1 = (m[1][0] * 0.4 + m[1][1] * 0.5 * e(0.5)) / 2
    assert_close(loss, t((row0 + row1) / 2))
    # d/dlogp = min(rho, C) * (-A r) / (|y_i| * 2) on unclipped tokens, 0 elsewhere
    assert_close(grad, t([[0, 2.0 * -e(-0.3) / 6, 0], [0, e(0.3) * 0.5 * e(0.5) / 4, 0]]))
    assert_close(stats["loss/policy"], loss)
    assert_close(stats["mismatch/is_weight_mean"], t((e(0.1) + e(1.0) + e(-0.5) + e(-1.0) + e(0.3)) / 5))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 5))


def test_cispo_tis_by_hand():
    loss, grad, stats = run("cispo", correction="tis", correction_cap=1.2)
    # cispo: L_t = -sg(clip(r)) A logp, all r < 5 so clip(r) = r; tis: times min(rho, 1.2)
    r = [[e(0.2), e(-0.3), e(0.5)], [e(-0.4), e(0.5)]]
    m = [[e(0.1), 1.2, e(-0.5)], [e(-1.0), 1.2]]
    a = [1.0, -0.5]
    terms = [-m[i][j] * r[i][j] * a[i] * LOGP[i][j] for i in range(2) for j in range(len(r[i]))]
    assert_close(loss, t(sum(terms) / 5))
    # token-mean over 5: d/dlogp = -min(rho, C) r A / 5
    want = [[-m[i][j] * r[i][j] * a[i] / 5 for j in range(len(r[i]))] for i in range(2)]
    assert_close(grad, t([want[0], want[1] + [0.0]]))
    # truncated: e^1 and e^.3 (1.35) > 1.2
    assert_close(stats["mismatch/corrected_frac"], t(2 / 5))


def test_grpo_mis_by_hand_masked_tokens_stay_in_the_denominator():
    loss, grad, stats = run("grpo", correction="mis", correction_cap=2.0)
    # band [.5, 2]: t01 (e^1 = 2.72) and t10 (e^-1 = .37) are dropped, the rest keep their weight w = rho
    row0 = (e(0.1) * -1.2 + 0.0 + e(-0.5) * -1.2) / 3  # still / 3
    row1 = (0.0 + e(0.3) * 0.5 * e(0.5)) / 2  # still / 2
    assert_close(loss, t((row0 + row1) / 2))
    # t01 had a gradient and loses it; t11 keeps its own, times its weight e^.3
    assert_close(grad, t([[0, 0, 0], [0, e(0.3) * 0.5 * e(0.5) / 4, 0]]))
    assert_close(stats["mismatch/is_weight_mean"], t((e(0.1) + e(1.0) + e(-0.5) + e(-1.0) + e(0.3)) / 5))
    assert_close(stats["mismatch/corrected_frac"], t(2 / 5))


def test_gspo_token_uses_the_token_weight():
    loss, grad, _ = run("gspo_token", correction="tis", correction_cap=2.0)
    s1 = e((-0.4 + 0.5) / 2)
    # gspo_token terms: row 0 clipped at -(1 + 4e-4) per token, row 1 .5 s1 per token (grad .5 s1 per token)
    row0 = (e(0.1) + 2.0 + e(-0.5)) * -(1 + 4e-4) / 3
    row1 = (e(-1.0) + e(0.3)) * 0.5 * s1 / 2
    assert_close(loss, t((row0 + row1) / 2))
    assert_close(grad, t([[0, 0, 0], [e(-1.0) * 0.5 * s1 / 4, e(0.3) * 0.5 * s1 / 4, 0]]))


# ----------------------------------------------------------------------------- sequence unit (gspo)


def test_gspo_tis_by_hand():
    loss, grad, stats = run("gspo", correction="tis", correction_cap=1.1)
    s1 = e((-0.4 + 0.5) / 2)
    # w_i = exp(mean_t log rho): w0 = e^((.1 + 1 - .5)/3) = e^.2 = 1.22 > 1.1 -> 1.1 | w1 = e^((-1 + .3)/2) = e^-.35
    w0, w1 = e(0.2), e(-0.35)
    # gspo terms (test_losses): row 0 clipped -(1 + 4e-4), row 1 .5 s1; seq-mean over 2
    assert_close(loss, t((1.1 * -(1 + 4e-4) + w1 * 0.5 * s1) / 2))
    # d/dlogp_1t = w1 * .5 * s1 / |y_1| / 2
    assert_close(grad, t([[0, 0, 0], [w1 * 0.5 * s1 / 4, w1 * 0.5 * s1 / 4, 0]]))
    assert_close(stats["mismatch/is_weight_mean"], t((w0 + w1) / 2))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 2))


def test_gspo_mis_by_hand_masked_sequence_stays_in_the_denominator():
    # row 0: w0 = e^1 > 2 -> dropped | row 1: w1 = e^((.3 + .1) / 2) = e^.2 -> kept with its weight
    loss, grad, stats = run("gspo", log_rho=[[1.0, 1.0, 1.0], [0.3, 0.1, 7.0]], correction="mis")
    s1, w1 = e((-0.4 + 0.5) / 2), e(0.2)
    assert_close(loss, t((0.0 + w1 * 0.5 * s1) / 2))
    assert_close(grad, t([[0, 0, 0], [w1 * 0.5 * s1 / 4, w1 * 0.5 * s1 / 4, 0]]))
    assert_close(stats["mismatch/is_weight_mean"], t((e(1.0) + w1) / 2))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 2))


def test_gspo_stats_skip_empty_sequences():
    logp, old, roll, adv, mask = example()
    # a third response with no token, garbage everywhere
    logp2 = torch.cat([logp.detach(), t([[-math.inf, 5.0, 7.0]])]).requires_grad_(True)
    old2 = torch.cat([old, t([[0.0, -9.0, math.inf]])])
    roll2 = torch.cat([roll, t([[math.inf, -math.inf, math.nan]])])
    mask2 = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    kw = dict(correction="tis", correction_cap=1.1)
    loss, stats = policy_loss("gspo", logp=logp, old_logp=old, advantages=adv, mask=mask, rollout_logp=roll, **kw)
    loss2, stats2 = policy_loss("gspo", logp=logp2, old_logp=old2, advantages=torch.cat([adv, t([9.0])]),
                                mask=mask2, rollout_logp=roll2, **kw)
    loss2.backward()
    assert_close(loss2.detach(), loss.detach())
    assert torch.isfinite(logp2.grad).all() and (logp2.grad[2] == 0).all()
    for k in ("mismatch/is_weight_mean", "mismatch/corrected_frac"):
        assert_close(stats2[k], stats[k])


# ----------------------------------------------------------------------------- no-ops, gradients, validation


# rollout_is takes the sampler's log-probs as an input of its own loss (its ratio), not as a correction's
@pytest.mark.parametrize("name", [n for n in LOSSES if "rollout_logp" not in LOSSES[n].inputs])
@pytest.mark.parametrize("kw", [{"correction": "none"}, {"correction": "tis", "rollout_logp": None},
                                {"correction": "mis", "rollout_logp": None, "correction_cap": 3.0}])
def test_no_correction_is_bit_identical(name, kw):
    logp, old, roll, adv, mask = example()
    base, base_stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, **need(name))
    (g_base,) = torch.autograd.grad(base, logp)
    kw = {"rollout_logp": roll, **kw, **need(name)}
    loss, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, **kw)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.equal(loss, base) and torch.equal(g, g_base)
    assert list(stats) == list(base_stats)
    assert all(torch.equal(stats[k], base_stats[k]) for k in stats)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_weight_carries_no_gradient(name, correction):
    logp, old, roll, adv, mask = example()
    old.requires_grad_(True)
    roll.requires_grad_(True)
    loss, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, rollout_logp=roll,
                              correction=correction, kl_coef=0.1, ref_logp=old.detach() - 0.1, **need(name))
    loss.backward()
    assert old.grad is None and roll.grad is None
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
    assert not any(v.requires_grad for v in stats.values())


def test_kl_term_is_not_weighted():
    kw = dict(kl_coef=0.5, ref_logp=torch.zeros(2, 3, dtype=F64))
    _, _, plain = run("ppo", correction="none", **kw)
    loss, _, stats = run("ppo", correction="mis", correction_cap=1.01, **kw)
    # every rho (e^.1, e^1, e^-.5, e^-1, e^.3) is outside [1/1.01, 1.01]: the policy term is 0, the KL stays
    assert stats["loss/policy"].item() == 0.0
    assert_close(stats["loss/kl"], plain["loss/kl"])
    assert_close(loss, plain["loss/kl"])
    assert stats["mismatch/corrected_frac"].item() == 1.0


def test_weight_helpers_by_hand():
    old = t([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    roll = t([[-1.5, -1.0, math.nan], [-0.5, -math.inf, 1.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    w, unit_w = is_weights(old, roll, mask, "token")
    assert_close(w, t([[e(0.5), e(-1.0), 1.0], [1.0, 1.0, 1.0]]))
    assert torch.equal(unit_w, mask)
    # geometric: exp(mean_t log rho) = e^((.5 - 1) / 2); sequence: the product, e^(.5 - 1)
    w_B, seq_w = is_weights(old, roll, mask, "geometric")
    assert_close(w_B, t([e(-0.25), 1.0]))
    assert torch.equal(seq_w, t([1.0, 1.0]))
    w_B, seq_w = is_weights(old, roll, mask, "sequence")
    assert_close(w_B, t([e(-0.5), 1.0]))
    assert torch.equal(seq_w, t([1.0, 1.0]))
    # mis: an infinite loss on a dropped unit gives 0, a kept unit keeps its weight (1.5 x 2), and a NaN
    # weight counts as outside the band
    out, dropped = apply_correction(t([math.inf, 2.0, 3.0]), t([5.0, 1.5, math.nan]), "mis", 2.0, 0.5)
    assert torch.equal(out, t([0.0, 3.0, 0.0])) and dropped.tolist() == [True, False, True]
    out, trunc = apply_correction(t([1.0, 2.0, 3.0]), t([5.0, 0.1, 2.0]), "tis", 2.0)
    assert torch.equal(out, t([2.0, 0.2, 6.0])) and trunc.tolist() == [True, False, False]


def test_bf16_inputs_weighted_in_float32():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    roll = torch.tensor([[-1.5, -2.0]], dtype=torch.bfloat16)
    loss, stats = policy_loss("ppo", logp=logp, old_logp=logp.detach(), advantages=torch.tensor([1.0]),
                              mask=torch.ones(1, 2), rollout_logp=roll, correction="tis")
    assert loss.dtype == torch.float32 and stats["mismatch/is_weight_mean"].dtype == torch.float32
    # r = 1; L = -(min(e^.5, 2) + 1) / 2
    assert_close(loss, torch.tensor(-(e(0.5) + 1.0) / 2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"correction": "is"}, "tis"),
        ({"correction": None}, "correction"),
        ({"correction": "tis", "correction_cap": 1.0}, "correction_cap"),
        ({"correction": "mis", "correction_cap": 0.5}, "correction_cap"),
        ({"correction": "tis", "correction_cap": math.nan}, "correction_cap"),
        ({"correction": "tis", "correction_cap": math.inf}, "correction_cap"),
        ({"correction": "tis", "correction_cap": "2"}, "correction_cap"),
        ({"correction": "tis", "correction_cap": True}, "correction_cap"),
        ({"correction": "tis", "rollout_logp": torch.zeros(2, 2)}, "rollout_logp"),
        ({"correction": "none", "rollout_logp": torch.zeros(3, 3)}, "rollout_logp"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2),
                mask=torch.ones(2, 3), rollout_logp=torch.zeros(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        policy_loss("ppo", **args)
    assert CORRECTIONS == ("none", "tis", "mis")


# ----------------------------------------------------------------------------- property: w = 1 changes nothing


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_unit_weight_changes_nothing_on_random_inputs(seed, correction):
    # rollout_logp == old_logp gives w = 1 exactly: min(1, C) = 1 and 1 is inside [1/C, C]
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g))
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = logp - torch.randn(B, T, generator=g, dtype=F64) * 0.3
    adv = torch.randn(B, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.7
    cap = 1.0 + float(torch.rand(1, generator=g)) * 4
    for name in LOSSES:
        x = logp.clone().requires_grad_(True)
        base, base_stats = policy_loss(name, logp=x, old_logp=old, advantages=adv, mask=mask, **need(name))
        (g_base,) = torch.autograd.grad(base, x)
        loss, stats = policy_loss(name, logp=x, old_logp=old, advantages=adv, mask=mask, rollout_logp=old.clone(),
                                  correction=correction, correction_cap=cap, **need(name))
        (g_loss,) = torch.autograd.grad(loss, x)
        assert_close(loss, base)
        assert_close(g_loss, g_base)
        any_token = bool(mask.any())
        assert stats["mismatch/is_weight_mean"].item() == (1.0 if any_token else 0.0)
        assert stats["mismatch/corrected_frac"].item() == 0.0
        assert all(torch.equal(stats[k], base_stats[k]) for k in base_stats if k != "loss/policy")


# ----------------------------------------------------------------------------- M2PO


def test_grpo_m2po_by_hand_masked_tokens_stay_in_the_denominator():
    # m2 = log_rho^2 on the response: .01, 1, .25 | 1, .09; mean 2.35 / 5 = .47. tau .3: masking one 1 leaves
    # 1.35 / 4 = .3375, masking both leaves .35 / 3 = .117 < .3: t01 and t10 leave the loss
    loss, grad, stats = run("grpo", m2_threshold=0.3)
    # the clipped surrogate (eps .2): t00 and t02 clip at 1.2 (A = 1); t11 takes -A e^.5 (A = -.5, not clipped)
    row0 = (-1.2 + 0.0 - 1.2) / 3  # still / 3
    row1 = (0.0 + 0.5 * e(0.5)) / 2  # still / 2
    assert_close(loss, t((row0 + row1) / 2))
    assert_close(grad, t([[0, 0, 0], [0, 0.5 * e(0.5) / 4, 0]]))
    assert_close(stats["mismatch/m2"], t(2.35 / 5))
    assert_close(stats["mismatch/m2_masked_frac"], t(2 / 5))


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "gspo", "m2_threshold": 0.3}, "token-unit"),
    ({"name": "grpo", "m2_threshold": 0.3, "units": 2.0}, "whole minibatch"),
    ({"name": "grpo", "m2_threshold": 0.0}, "m2_threshold must be"),
    ({"name": "grpo", "m2_threshold": 0.3, "rollout_logp": None}, "sampler's log-probs"),
])
def test_m2po_refuses_what_it_cannot_mask(kwargs, match):
    logp, old, roll, adv, mask = example()
    kw = {"rollout_logp": roll, **kwargs}
    with pytest.raises(ValueError, match=match):
        policy_loss(kw.pop("name"), logp=logp, old_logp=old, advantages=adv, mask=mask, **kw)


def test_a_stale_run_with_loglinear_proximal_log_probs_and_m2po_trains(mixed_task, tracking_uri):
    from gspo_bench.config import load_config
    from gspo_bench.train.runner import run as run_cfg
    from tests.conftest import tiny_overrides

    cfg = load_config("smoke", overrides=tiny_overrides(
        mixed_task, tracking_uri, algos=["grpo"], tracking={"tracking_uri": tracking_uri, "experiment": "m2po"},
        rollout={"staleness": 2, "prox_logp": "loglinear", "m2_threshold": 1e-4}, train={"steps": 3}))
    [res] = run_cfg(cfg, log=lambda *a: None)
    assert res.status == "FINISHED"
    # the proximal log-probs differ from the sampler's from the third step on (tokens two versions old), and
    # M2PO masked some of the tokens whose second moment that opens
    assert res.last["mismatch/m2"] > 0 and 0 < res.last["mismatch/m2_masked_frac"] < 1
