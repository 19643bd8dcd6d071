"""Hand-computed checks of the field's other losses (sapo, gmpo, dr_grpo, luspo, vespo, dppo_tv, dppo_kl), the
correction levels and floors, weighted mis and off-policy sequence masking (``core/losses.py``, ``core/ratios.py``).

Every expected number is written out from the formulas with ``math`` on scalars, so a wrong sign, a missing
stop-gradient or a wrong denominator fails. The last test checks ``correction: none`` (and the default tis) of the
six older losses bit for bit against the code as it was before the levels and floors existed, written out here and
run on the same machine.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from gspo_bench.core.losses import LOSSES, policy_loss

e = math.exp
F64 = torch.float64

# The shared 2x3 example of test_losses.py. Row 1's last token is padding (its values are garbage).
DELTA = [[0.2, -0.3, 0.5], [-0.4, 0.5, 3.0]]
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]]
ADV = [1.0, -0.5]
MASK = [[1, 1, 1], [1, 1, 0]]


def t(x):
    return torch.tensor(x, dtype=F64)


def sig(x):
    return 1.0 / (1.0 + e(-x))


def run(name, logp=LOGP, delta=DELTA, adv=ADV, mask=MASK, **kw):
    x = t(logp).requires_grad_(True)
    old = x.detach() - t(delta)
    loss, stats = policy_loss(name, logp=x, old_logp=old, advantages=t(adv), mask=torch.tensor(mask, dtype=torch.bool),
                              **kw)
    loss.backward()
    return loss.detach(), x.grad, stats


def fracs(stats, frac, high, low):
    assert_close(stats["clip/frac"], t(frac))
    assert_close(stats["clip/frac_high"], t(high))
    assert_close(stats["clip/frac_low"], t(low))


# ----------------------------------------------------------------------------- sapo


def test_sapo_by_hand():
    loss, grad, stats = run("sapo")
    # row 0: A = 1 > 0, tau = 1; row 1: A = -.5, tau = 1.05; g = (4 / tau) sig(tau (r - 1)), L = -A g
    r0 = [e(d) for d in DELTA[0]]
    r1 = [e(d) for d in DELTA[1][:2]]
    row0 = sum(-1.0 * 4.0 * sig(r - 1) for r in r0) / 3
    row1 = sum(0.5 * (4 / 1.05) * sig(1.05 * (r - 1)) for r in r1) / 2
    assert_close(loss, t((row0 + row1) / 2))
    # dL/dlogp = -A * 4 sig (1 - sig) * r, then / |y_i| / B
    g0 = [-4 * sig(r - 1) * (1 - sig(r - 1)) * r / 3 / 2 for r in r0]
    g1 = [0.5 * 4 * sig(1.05 * (r - 1)) * (1 - sig(1.05 * (r - 1))) * r / 2 / 2 for r in r1]
    assert_close(grad, t([g0, g1 + [0.0]]))
    fracs(stats, 0.0, 0.0, 0.0)  # every slope is above 0.5 here (|tau (r - 1)| < 1.76)


def test_sapo_clip_frac_counts_tokens_damped_past_half():
    # x = tau (r - 1): t00 e^1.2 - 1 = 2.32 (damped, high) | t01 0 | t10 2 (e^-3 - 1) = -1.90 (damped, low) | t11 .21
    _, grad, stats = run("sapo", logp=[[-1.0, -1.0], [-1.0, -1.0]], delta=[[1.2, 0.0], [-3.0, 0.1]], adv=[1.0, -1.0],
                         mask=[[1, 1], [1, 1]], tau_neg=2.0)
    fracs(stats, 2 / 4, 1 / 4, 1 / 4)
    # the damped tokens keep a (small) gradient: no hard cut
    x = 2 * (e(-3.0) - 1)
    assert_close(grad[1, 0], t(4 * sig(x) * (1 - sig(x)) * e(-3.0) / 2 / 2))
    assert grad[0, 0].item() != 0.0


# ----------------------------------------------------------------------------- gmpo


def test_gmpo_by_hand():
    loss, grad, stats = run("gmpo", eps_low=0.25, eps_high=0.45)
    # row 0, A > 0: dc = min(d, clamp(d, -.25, .45)) = [.2, -.3, .45] (t02 cut above)
    # row 1, A < 0: dc = max(d, clamp(d)) = [-.25, .5] (t10 cut below)
    s0, s1 = e((0.2 - 0.3 + 0.45) / 3), e((-0.25 + 0.5) / 2)
    assert_close(loss, t((-1.0 * s0 + 0.5 * s1) / 2))
    # dL/dlogp_t = -A_i s_i / |y_i| / B where the clamp does not bind, 0 where it does
    assert_close(grad, t([[-s0 / 3 / 2, -s0 / 3 / 2, 0.0], [0.0, 0.5 * s1 / 2 / 2, 0.0]]))
    fracs(stats, 2 / 5, 1 / 5, 1 / 5)
    assert_close(stats["clip/seq_frac"], t(1.0))


def test_gmpo_clip_binds_only_in_the_direction_that_counts():
    # d = .6 > eps_high but A < 0: the log-ratio is not clamped (max(d, .4) = d), gradient kept, not counted
    loss, grad, stats = run("gmpo", logp=[[-1.0]], delta=[[0.6]], adv=[-1.0], mask=[[1]])
    assert_close(loss, t(e(0.6)))
    assert_close(grad, t([[e(0.6)]]))
    fracs(stats, 0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------- dr_grpo


def test_dr_grpo_by_hand():
    loss, grad, stats = run("dr_grpo", max_new_tokens=4)
    # ppo's terms (test_losses), summed, / (B * T_max) = / (2 * 4)
    assert_close(loss, t((-1.2 - e(-0.3) - 1.2 + 0.4 + 0.5 * e(0.5)) / 8))
    assert_close(grad, t([[0, -e(-0.3) / 8, 0], [0, 0.5 * e(0.5) / 8, 0]]))
    fracs(stats, 3 / 5, 2 / 5, 1 / 5)  # as ppo
    with pytest.raises(ValueError, match="max_new_tokens"):
        run("dr_grpo")


# ----------------------------------------------------------------------------- luspo


def test_luspo_by_hand():
    loss, grad, stats = run("luspo")
    s1 = e((-0.4 + 0.5) / 2)
    # gspo's terms times |y_i|: row 0 clipped, 3 * -(1 + 4e-4); row 1 2 * .5 s1; seq-mean over 2
    assert_close(loss, t((3 * -(1 + 4e-4) + 2 * 0.5 * s1) / 2))
    # row 1: d/dlogp_1t = |y_1| * .5 * s1 / |y_1| / 2 = .25 s1 per token
    assert_close(grad, t([[0, 0, 0], [0.25 * s1, 0.25 * s1, 0]]))
    fracs(stats, 3 / 5, 3 / 5, 0.0)  # as gspo: every token of the clipped sequence
    assert_close(stats["clip/seq_frac"], t(0.5))


# ----------------------------------------------------------------------------- vespo


def phi(lw, k, lam):
    return e(lam + k * lw - lam * e(lw))


def test_vespo_by_hand():
    loss, grad, stats = run("vespo")
    # lw_i = sum of the token log-ratios: .4 and .1; (k, lam) = (2, 3) for A >= 0, (3, 2) for A < 0
    p0, p1 = phi(0.4, 2, 3), phi(0.1, 3, 2)
    # L = -phi A logp, token-mean over 5
    assert_close(loss, t((-p0 * 1.0 * (-1.0 - 0.5 - 2.0) - p1 * -0.5 * (-0.3 - 1.2)) / 5))
    # phi carries no gradient: dL/dlogp = -phi A / N
    assert_close(grad, t([[-p0 / 5] * 3, [0.5 * p1 / 5, 0.5 * p1 / 5, 0.0]]))
    fracs(stats, 0.0, 0.0, 0.0)  # p0 = .509, p1 = 1.09: none below .5


def test_vespo_clip_frac_and_clamps():
    # row 0: lw = 1 (A > 0): phi = e^(3 + 2 - 3e) = .043, damped high | row 1: lw = -1.5 (A < 0): phi = .052, low
    # row 2: one token of log-ratio 30 -> clamped to 20 per token and lw to 20: phi = 0
    loss, grad, stats = run("vespo", logp=[[-1.0, -1.0], [-1.0, -2.0], [-1.0, -1.0]],
                            delta=[[0.5, 0.5], [-1.0, -0.5], [30.0, 0.0]], adv=[1.0, -1.0, 2.0],
                            mask=[[1, 1], [1, 1], [1, 1]])
    p0, p1 = phi(1.0, 2, 3), phi(-1.5, 3, 2)
    assert_close(loss, t((-p0 * (-2.0) - p1 * -1.0 * (-3.0) + 0.0) / 6))
    assert_close(grad, t([[-p0 / 6] * 2, [p1 / 6] * 2, [0.0, 0.0]]))
    fracs(stats, 6 / 6, 4 / 6, 2 / 6)
    assert_close(stats["clip/seq_frac"], t(1.0))


# ----------------------------------------------------------------------------- dppo

# probabilities inside (0, 1): p = e^logp, p_old = e^old_logp
D_LOGP = [[-0.5, -2.0, -0.1], [-0.2, -1.0, -0.7]]
D_OLD = [[-1.0, -2.1, -0.2], [-0.6, -0.5, 9.0]]  # row 1's last entry is padding
D_DELTA = [[a - b for a, b in zip(ra, rb)] for ra, rb in zip(D_LOGP, D_OLD)]
D_ADV = [1.0, -2.0]


def dppo(name, **kw):
    return run(name, logp=D_LOGP, delta=D_DELTA, adv=D_ADV, **kw)


def _dppo_expected(keep, c=20.0):
    # L = -A sg(min(r, c)) logp v, token-mean over 5; dL/dlogp = -A min(r, c) v / 5
    loss, grad = 0.0, [[0.0] * 3, [0.0] * 3]
    for i, row in enumerate(keep):
        for j, v in enumerate(row):
            if v:
                w = min(e(D_DELTA[i][j]), c)
                loss += -D_ADV[i] * w * D_LOGP[i][j] / 5
                grad[i][j] = -D_ADV[i] * w / 5
    return t(loss), t(grad)


def test_dppo_tv_by_hand():
    p = [[e(x) for x in row] for row in D_LOGP]
    q = [[e(x) for x in row] for row in D_OLD]
    # A > 0 keeps p - p_old <= .15; A < 0 keeps p - p_old >= -.15
    keep = [[p[0][j] - q[0][j] <= 0.15 for j in range(3)], [p[1][j] - q[1][j] >= -0.15 for j in range(2)]]
    assert keep == [[False, True, True], [True, False]]  # .239 up with A > 0, .239 down with A < 0
    loss, grad, stats = dppo("dppo_tv")
    want_loss, want_grad = _dppo_expected(keep)
    assert_close(loss, want_loss)
    assert_close(grad, want_grad)
    fracs(stats, 2 / 5, 1 / 5, 1 / 5)
    # the weight is truncated at c: t10 r = e^.4 = 1.49 -> 1.2, the others (e^.1) are below it
    loss, grad, _ = dppo("dppo_tv", trunc_c=1.2)
    want_loss, want_grad = _dppo_expected(keep, c=1.2)
    assert_close(loss, want_loss)
    assert_close(grad, want_grad)
    assert_close(grad[1, 0], t(2 * 1.2 / 5))


def test_dppo_kl_by_hand():
    keep = []
    for i, row in enumerate(D_LOGP):
        keep.append([])
        for j in range(3 if i == 0 else 2):
            p, q = e(row[j]), e(D_OLD[i][j])
            # b = p_old (old_logp - logp) + (1 - p_old) ln((1 - p_old + 1e-8) / (1 - p + 1e-8))
            b = q * (D_OLD[i][j] - row[j]) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            keep[i].append((b <= 0.05 or p <= q) if D_ADV[i] > 0 else (b <= 0.05 or p >= q))
    assert keep == [[False, True, True], [True, False]]  # b = .116 and .117 on the two cut tokens
    loss, grad, stats = dppo("dppo_kl")
    want_loss, want_grad = _dppo_expected(keep)
    assert_close(loss, want_loss)
    assert_close(grad, want_grad)
    fracs(stats, 2 / 5, 1 / 5, 1 / 5)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl", "vespo", "sapo"])
def test_weights_and_gates_carry_no_gradient_into_old_logp(name):
    x = t(D_LOGP).requires_grad_(True)
    old = t(D_OLD).requires_grad_(True)
    loss, _ = policy_loss(name, logp=x, old_logp=old, advantages=t(D_ADV), mask=torch.tensor(MASK, dtype=torch.bool))
    loss.backward()
    assert old.grad is None and torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name, kw, match", [
    ("sapo", {"tau_pos": 0.0}, "tau_pos"),
    ("vespo", {"lam_neg": -1.0}, "lam_neg"),
    ("dppo_tv", {"trunc_c": 0.0}, "trunc_c"),
    ("dr_grpo", {"max_new_tokens": 0}, "max_new_tokens"),
    ("ppo", {"tau_pos": 1.0}, "ppo does not take tau_pos"),
    ("sapo", {"eps_high": 0.2}, "sapo does not take eps_high"),
    ("sapo", {"dual_clip_c": 3.0}, "dual_clip_c"),
    ("gmpo", {"advantages": torch.ones(2, 3)}, "gmpo"),
    ("luspo", {"advantages": torch.ones(2, 3)}, "luspo"),
])
def test_bad_hparams_raise(name, kw, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        policy_loss(name, **args)
    # None for another loss's parameter is accepted (one config drives every algorithm)
    policy_loss("ppo", logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2),
                mask=torch.ones(2, 3), tau_pos=None, trunc_c=None)


# ----------------------------------------------------------------------------- corrections: levels, floors, weighted mis

# log rho = old_logp - rollout_logp per token (test_corrections.py's); the padding entry is garbage
LOG_RHO = [[0.1, 1.0, -0.5], [-1.0, 0.3, -math.inf]]
S1 = e((-0.4 + 0.5) / 2)  # gspo's s_1 on the shared example
GRPO_ROWS = [[-1.2, -e(-0.3), -1.2], [0.4, 0.5 * e(0.5)]]  # grpo / ppo per-token terms (test_losses)


def corrected(name, log_rho=LOG_RHO, **kw):
    x = t(LOGP).requires_grad_(True)
    old = x.detach() - t(DELTA)
    loss, stats = policy_loss(name, logp=x, old_logp=old, advantages=t(ADV), mask=torch.tensor(MASK, dtype=torch.bool),
                              rollout_logp=old - t(log_rho), **kw)
    loss.backward()
    return loss.detach(), x.grad, stats


def test_sequence_level_on_a_token_loss_weights_every_token_by_the_product():
    loss, grad, stats = corrected("grpo", correction="tis", correction_level="sequence")
    # w_i = exp(sum_t log rho): e^.6 = 1.82 (< 2) and e^-.7
    w0, w1 = e(0.6), e(-0.7)
    assert_close(loss, t((w0 * sum(GRPO_ROWS[0]) / 3 + w1 * sum(GRPO_ROWS[1]) / 2) / 2))
    assert_close(grad, t([[0, w0 * -e(-0.3) / 6, 0], [0, w1 * 0.5 * e(0.5) / 4, 0]]))
    assert_close(stats["mismatch/is_weight_mean"], t((w0 + w1) / 2))
    assert_close(stats["mismatch/corrected_frac"], t(0.0))


def test_geometric_level_mis_with_a_floor_keeps_the_weight():
    # w_i = exp(mean_t log rho): e^.2 (kept, weighted) and e^-.35 = .70 (< floor .8: dropped, still / 2)
    loss, grad, stats = corrected("grpo", correction="mis", correction_level="geometric", correction_min=0.8)
    w0 = e(0.2)
    assert_close(loss, t((w0 * sum(GRPO_ROWS[0]) / 3 + 0.0) / 2))
    assert_close(grad, t([[0, w0 * -e(-0.3) / 6, 0], [0, 0, 0]]))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 2))


def test_token_level_on_a_sequence_loss_uses_the_token_mean_of_the_factors():
    loss, grad, stats = corrected("gspo", correction="tis", correction_level="token")
    # per-token factors clamp(rho, max=2), averaged over each response
    f0 = (e(0.1) + 2.0 + e(-0.5)) / 3
    f1 = (e(-1.0) + e(0.3)) / 2
    assert_close(loss, t((f0 * -(1 + 4e-4) + f1 * 0.5 * S1) / 2))
    assert_close(grad, t([[0, 0, 0], [f1 * 0.25 * S1 / 2, f1 * 0.25 * S1 / 2, 0]]))
    # the stats are per token at this level
    assert_close(stats["mismatch/is_weight_mean"], t((e(0.1) + e(1.0) + e(-0.5) + e(-1.0) + e(0.3)) / 5))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 5))


def test_tis_floor_truncates_from_below():
    loss, grad, stats = corrected("ppo", correction="tis", correction_min=0.5)
    # factors clamp(rho, .5, 2): e^.1, 2, e^-.5 (= .61) | e^-1 (= .37) -> .5, e^.3
    f = [[e(0.1), 2.0, e(-0.5)], [0.5, e(0.3)]]
    want = sum(f[i][j] * GRPO_ROWS[i][j] for i in range(2) for j in range(len(f[i]))) / 5
    assert_close(loss, t(want))
    assert_close(grad, t([[0, 2.0 * -e(-0.3) / 5, 0], [0, e(0.3) * 0.5 * e(0.5) / 5, 0]]))
    assert_close(stats["mismatch/corrected_frac"], t(2 / 5))


def test_vespo_unit_level_is_the_product_and_mis_keeps_w():
    # w_i = exp(sum_t log rho): e^.6 (kept, weighted) and e^-.7 = .497 (< 1/2: dropped)
    loss, grad, stats = corrected("vespo", correction="mis")
    p0, w0 = phi(0.4, 2, 3), e(0.6)
    assert_close(loss, t(w0 * 3.5 * p0 / 5))
    assert_close(grad, t([[-w0 * p0 / 5] * 3, [0.0] * 3]))
    assert_close(stats["mismatch/is_weight_mean"], t((e(0.6) + e(-0.7)) / 2))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 2))


def test_gmpo_unit_level_is_the_geometric_mean():
    loss, _, stats = corrected("gmpo", correction="tis", correction_cap=1.1, eps_low=0.25, eps_high=0.45)
    s0, s1 = e((0.2 - 0.3 + 0.45) / 3), e((-0.25 + 0.5) / 2)
    # w0 = e^.2 = 1.22 -> 1.1, w1 = e^-.35
    assert_close(loss, t((1.1 * -s0 + e(-0.35) * 0.5 * s1) / 2))
    assert_close(stats["mismatch/corrected_frac"], t(1 / 2))


@pytest.mark.parametrize("name", ["sapo", "dr_grpo", "dppo_tv", "dppo_kl", "luspo"])
def test_mis_weights_each_unit_it_keeps(name):
    # a constant log rho of .3 on every token (inside [1/2, 2] at the token and geometric levels): every kept
    # unit's term is multiplied by e^.3, so the loss and the gradient are e^.3 times the uncorrected ones
    kw = {"max_new_tokens": 4} if name == "dr_grpo" else {}
    base, g_base, _ = run(name, **kw)
    loss, grad, stats = corrected(name, log_rho=[[0.3] * 3, [0.3, 0.3, 9.0]], correction="mis", **kw)
    assert_close(loss, e(0.3) * base)
    assert_close(grad, e(0.3) * g_base)
    assert stats["mismatch/corrected_frac"].item() == 0.0


def test_bad_correction_levels_and_floors_raise():
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3),
                rollout_logp=torch.zeros(2, 3), correction="tis")
    with pytest.raises(ValueError, match="correction_level"):
        policy_loss("ppo", correction_level="batch", **args)
    with pytest.raises(ValueError, match="correction_min"):
        policy_loss("ppo", correction_min=2.0, **args)
    with pytest.raises(ValueError, match="opsm_threshold"):
        policy_loss("ppo", opsm_threshold=math.nan, **args)


# ----------------------------------------------------------------------------- off-policy sequence masking


def test_opsm_drops_negative_sequences_past_the_threshold():
    # mean_t(roll - logp) = mean_t(-delta - log rho): row 0 -1/3, row 1 (A < 0) -.05 + .35 = .3
    loss, grad, stats = corrected("grpo", opsm_threshold=0.2)
    assert_close(loss, t((sum(GRPO_ROWS[0]) / 3 + 0.0) / 2))  # row 1 zeroed, still counted in the mean
    assert_close(grad, t([[0, -e(-0.3) / 6, 0], [0, 0, 0]]))
    assert_close(stats["mismatch/opsm_frac"], t(1 / 2))
    # .35 is above .3: nothing dropped, the plain grpo loss
    loss, _, stats = corrected("grpo", opsm_threshold=0.35)
    assert_close(loss, t((sum(GRPO_ROWS[0]) / 3 + sum(GRPO_ROWS[1]) / 2) / 2))
    assert stats["mismatch/opsm_frac"].item() == 0.0


def test_opsm_keeps_positive_advantages_and_falls_back_to_old_logp():
    # no sampler log-probs: old_logp stands in, mean_t(old - logp) = -mean_t(delta): row 0 -.133, row 1 -.05
    _, _, stats = run("gspo", opsm_threshold=0.0)
    assert stats["mismatch/opsm_frac"].item() == 0.0  # -.05 is not above 0
    # threshold -1: both rows exceed it, but row 0 has A > 0 and stays
    loss, grad, stats = run("gspo", opsm_threshold=-1.0)
    assert_close(loss, t((-(1 + 4e-4) + 0.0) / 2))
    assert_close(grad, torch.zeros(2, 3, dtype=F64))
    assert_close(stats["mismatch/opsm_frac"], t(1 / 2))


# ----------------------------------------------------------------------------- the six, as they were
#
# ``correction: none`` and the default tis of the six older losses must give what the code gave before correction
# levels, floors, opsm and the seven newer losses existed. That code is written out below, op for op, and both are
# run on the same machine: float bits depend on the CPU's kernels (their summation order), so only two computations
# made here can be compared bit for bit, never numbers read off another machine.

# the six's defaults as they were: (ratio unit, aggregation, eps_low, eps_high)
_BEFORE = {"ppo": ("token", "token-mean", 0.2, 0.2), "grpo": ("token", "seq-mean-token-mean", 0.2, 0.2),
           "dapo": ("token", "token-mean", 0.2, 0.28), "gspo": ("sequence", "seq-mean", 3e-4, 4e-4),
           "gspo_token": ("sequence-token", "seq-mean-token-mean", 3e-4, 4e-4),
           "cispo": ("token", "token-mean", None, 4.0)}


def _b_mean(x, w):
    n = w.sum()
    return torch.where(w > 0, x * w, 0.0).sum() / torch.where(n > 0, n, 1.0)


def _b_seq_log(delta_BT, mask_BT):
    len_B = mask_BT.sum(-1)
    return (delta_BT * mask_BT).sum(-1) / torch.where(len_B > 0, len_B, 1.0)  # (B,)


def _b_extreme(x, keep, largest):
    ext = torch.where(keep, x, -math.inf if largest else math.inf)
    return torch.where(keep.any(), ext.amax() if largest else ext.amin(), 0.0)


def _b_surrogate(adv, ratio, eps_low, eps_high):
    clipped = torch.clamp(ratio, min=None if eps_low is None else 1.0 - eps_low, max=1.0 + eps_high)
    loss = torch.maximum(-adv * ratio, -adv * clipped)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    low = (ratio < 1.0 - eps_low) & (adv < 0)
    return loss, high, low


def _before_policy_loss(name, logp, old_logp, advantages, mask, rollout_logp=None, cap=None):
    """``policy_loss(name, ...)`` as it was before correction levels: default clip, no KL, tis when ``cap``."""
    unit, aggregation, eps_low, eps_high = _BEFORE[name]
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp, old, mask = logp.to(dtype), old_logp.detach().to(dtype), mask.to(dtype)
    adv = advantages.detach().to(dtype)
    valid = mask > 0
    delta = torch.where(valid, logp - old, 0.0)  # (B, T)
    adv_BT = torch.where(valid, adv[:, None].expand_as(mask), 0.0)
    if name == "gspo":
        loss, high_B, low_B = _b_surrogate(adv, torch.exp(_b_seq_log(delta, mask)), eps_low, eps_high)
        high, low = high_B[:, None] & valid, low_B[:, None] & valid
    elif name == "gspo_token":
        s_BT = torch.exp(_b_seq_log(delta, mask)).detach()[:, None] * torch.exp(delta - delta.detach())
        loss, high, low = _b_surrogate(adv_BT, s_BT, eps_low, eps_high)
        high, low = high & valid, low & valid
    elif name == "cispo":
        ratio = torch.exp(delta)
        loss = -torch.clamp(ratio, max=1.0 + eps_high).detach() * adv_BT * torch.where(valid, logp, 0.0)
        high, low = (ratio > 1.0 + eps_high) & valid, torch.zeros_like(valid)
    else:
        loss, high, low = _b_surrogate(adv_BT, torch.exp(delta), eps_low, eps_high)
        high, low = high & valid, low & valid
    len_B = mask.sum(-1)
    seq_w = (len_B > 0).to(dtype)
    extra = {}
    if cap is not None:
        # tis at the loss's unit: per sequence for gspo (length-normalised), per token otherwise
        log_rho = torch.where(valid, old - rollout_logp.detach().to(dtype), 0.0)
        w, unit_w = (torch.exp(_b_seq_log(log_rho, mask)), seq_w) if unit == "sequence" else (torch.exp(log_rho), mask)
        loss = torch.clamp(w, max=cap) * loss
        extra = {"mismatch/is_weight_mean": _b_mean(w, unit_w),
                 "mismatch/corrected_frac": _b_mean((w > cap).to(dtype), unit_w)}
    if aggregation == "token-mean":
        pg = _b_mean(loss, mask)
    elif aggregation == "seq-mean":
        pg = _b_mean(loss, seq_w)
    else:
        pg = _b_mean(torch.where(valid, loss * mask, 0.0).sum(-1) / torch.where(len_B > 0, len_B, 1.0), seq_w)
    kl = torch.zeros((), dtype=dtype)
    with torch.no_grad():
        d = delta.detach()
        r = torch.exp(d)
        frac_high, frac_low = _b_mean(high.to(dtype), mask), _b_mean(low.to(dtype), mask)
        seq_log = _b_seq_log(d, mask)
        s = torch.exp(seq_log)
        stats = {
            "clip/frac": frac_high + frac_low, "clip/frac_high": frac_high, "clip/frac_low": frac_low,
            "clip/seq_frac": _b_mean(((high | low) & valid).any(-1).to(dtype), seq_w),
            "ratio/mean": _b_mean(r, mask),
            "ratio/min": _b_extreme(r, valid, largest=False), "ratio/max": _b_extreme(r, valid, largest=True),
            "ratio/token_log_std": _b_mean((d - _b_mean(d, mask)).square(), mask).sqrt(),
            "ratio/seq_log_std": _b_mean((seq_log - _b_mean(seq_log, seq_w)).square(), seq_w).sqrt(),
            "ratio/seq_mean": _b_mean(s, seq_w),
            "ratio/seq_min": _b_extreme(s, len_B > 0, largest=False),
            "ratio/seq_max": _b_extreme(s, len_B > 0, largest=True),
            "kl/old": _b_mean(torch.expm1(d) - d, mask),
            "loss/policy": pg.detach(), "loss/kl": kl,
        }
    return pg + kl, {**stats, **extra}


def _inputs(seed, dtype):
    # five rows of seven tokens, lengths 7, 3, 0 (an empty row), 5, 1; rollout log-probs off by N(0, 0.5^2)
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    roll = old + 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    mask = torch.arange(T)[None] < torch.tensor([7, 3, 0, 5, 1])[:, None]
    return logp.to(dtype), old.to(dtype), roll.to(dtype), adv.to(dtype), mask


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("corr", ["none", "tis"])
@pytest.mark.parametrize("name", sorted(_BEFORE))
def test_correction_none_and_default_tis_are_bit_identical_to_before(name, corr, seed, dtype):
    logp, old, roll, adv, mask = _inputs(seed, dtype)
    x, x_before = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    kw = {} if corr == "none" else {"rollout_logp": roll, "correction": "tis", "correction_cap": 1.5}
    loss, stats = policy_loss(name, logp=x, old_logp=old, advantages=adv, mask=mask, **kw)
    want, want_stats = _before_policy_loss(name, x_before, old, adv, mask, roll, 1.5 if corr == "tis" else None)
    loss.backward()
    want.backward()
    assert torch.equal(loss, want), (loss.item(), want.item())
    assert torch.equal(x.grad, x_before.grad)
    assert stats.keys() == want_stats.keys()
    for k in stats:
        assert stats[k].dtype == want_stats[k].dtype and torch.equal(stats[k], want_stats[k]), k


@pytest.mark.parametrize("name", sorted(set(_BEFORE) - {"cispo"}))
def test_the_inputs_of_the_comparison_reach_the_clip_and_the_tis_cap(name):
    # over the two seeds, each clipped loss clips some units and keeps others, and tis truncates some weights
    # (cispo's cap, r > 5, is out of reach of these ratios)
    clip, corrected = [], []
    for seed in (0, 1):
        logp, old, roll, adv, mask = _inputs(seed, F64)
        _, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, rollout_logp=roll,
                               correction="tis", correction_cap=1.5)
        clip.append(stats["clip/frac"].item())
        corrected.append(stats["mismatch/corrected_frac"].item())
    assert 0 < max(clip) and min(clip) < 1 and max(corrected) > 0, (clip, corrected)


def test_the_ratio_band_a_histogram_draws_follows_what_the_loss_bounds():
    import math

    assert LOSSES["grpo"].ratio_band(0.2, 0.28) == (0.2, 0.28)  # a band on r itself
    lo, hi = LOSSES["gmpo"].ratio_band(0.4, 0.4)  # a band on the log-ratio: r in [e^-0.4, e^0.4]
    assert lo == pytest.approx(1 - math.exp(-0.4)) and hi == pytest.approx(math.exp(0.4) - 1)
    for name in ("sapo", "vespo", "dppo_tv", "dppo_kl"):  # a soft gate, a weight, a probability gap: no ratio band
        assert LOSSES[name].ratio_band(0.15, 0.15) == (None, None), name


# ----------------------------------------------------------------------------- losses for stale samples


def test_rollout_is_by_hand_weighs_by_the_ratio_to_the_sampler_inside_the_band():
    import math

    from gspo_bench.core.losses import policy_loss

    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - 0.05  # the old policy plays no part
    # log r_s = logp - roll_logp: 0.1 (inside), 0.3 (above 1.2), -0.1 | -0.4 (below 0.8), 0.15, padding
    log_rs = torch.tensor([[0.1, 0.3, -0.1], [-0.4, 0.15, 0.0]], dtype=torch.float64)
    roll = logp.detach() - log_rs
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    loss, stats = policy_loss("rollout_is", logp=logp, old_logp=old, advantages=adv, mask=mask, rollout_logp=roll)
    e = math.exp
    # L_t = -sg(r 1[.8 < r < 1.2]) A logp, token-mean over the 5 response tokens
    terms = [-e(0.1) * 1.0 * -1.0, 0.0, -e(-0.1) * 1.0 * -2.0, 0.0, -e(0.15) * -0.5 * -1.2]
    assert float(loss) == pytest.approx(sum(terms) / 5)
    loss.backward()
    # the gradient is -w A per token (w carries none): zero outside the band
    want = torch.tensor([[-e(0.1), 0.0, -e(-0.1)], [0.0, 0.5 * e(0.15), 0.0]], dtype=torch.float64) / 5
    assert torch.allclose(logp.grad, want)
    assert float(stats["clip/frac"]) == pytest.approx(2 / 5)  # t01 above the band, t10 below it
    # without the sampler's log-probs the old ones stand in
    alone, _ = policy_loss("rollout_is", logp=logp, old_logp=roll, advantages=adv, mask=mask)
    assert float(alone) == pytest.approx(float(loss))


def test_dro_by_hand_penalises_the_squared_log_ratio():
    from gspo_bench.core.losses import policy_loss

    logp = torch.tensor([[-1.0, -0.5], [-0.3, -1.2]], dtype=torch.float64, requires_grad=True)
    delta = torch.tensor([[0.2, -0.4], [0.5, 3.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    loss, stats = policy_loss("dro", logp=logp, old_logp=logp.detach() - delta, advantages=adv, mask=mask,
                              dro_beta=0.5)
    # L_t = -(A logp - (beta / 2) delta^2), token-mean over the 3 response tokens
    terms = [-(1.0 * -1.0 - 0.25 * 0.04), -(1.0 * -0.5 - 0.25 * 0.16), -(-2.0 * -0.3 - 0.25 * 0.25)]
    assert float(loss) == pytest.approx(sum(terms) / 3)
    loss.backward()
    # dL/dlogp_t = (-A + beta delta) / 3
    want = torch.tensor([[-1.0 + 0.5 * 0.2, -1.0 + 0.5 * -0.4], [2.0 + 0.5 * 0.5, 0.0]], dtype=torch.float64) / 3
    assert torch.allclose(logp.grad, want)
    assert float(stats["clip/frac"]) == 0.0
    with pytest.raises(ValueError, match="dro_beta"):
        policy_loss("dro", logp=logp, old_logp=logp.detach(), advantages=adv, mask=mask, dro_beta=0.0)
