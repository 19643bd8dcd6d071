"""Hand-computed checks of the controls (docs/algorithms.md, "Controls"): the entropy bonus and its adaptive
coefficient, the top-entropy mask, Clip-Cov and KL-Cov, the two-sided clip, bnpo, truncated responses, rejection by
KL and the mismatch diagnostics; that each control, off, leaves every loss bit-identical; that bad values stop a run
with one line; and that the entropy's gradient through the chunked LM head is the plain autograd one.

Every expected number is written out from the formulas with ``math`` on the shared 2x3 example of test_losses.py
(row 1's last token is padding): ppo's per-token terms there are t00 -1.2 (clipped), t01 -e^-.3, t02 -1.2 (clipped),
t10 .4 (clipped), t11 .5 e^.5.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from gspo_bench.algorithms.base import loss_mask
from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError, Recipe, load_config, parse_sets
from gspo_bench.core.lm_head import token_logp_entropy
from gspo_bench.core.entropy_control import EntropyControl
from gspo_bench.core.losses import LOSSES, Controls, agg_loss, loss_keywords, policy_loss, top_entropy_mask
from gspo_bench.core.metrics import StepStats
from gspo_bench.core.names import rejection_bounds
from gspo_bench.core.ratios import mismatch_stats, rejection_mask
from gspo_bench.tuning.study import chosen_params
# the shared 2x3 example of test_losses.py (row 1's last token is padding)
from tests.test_field_losses import ADV, DELTA, F64, LOGP, MASK, _before_policy_loss, _inputs

e = math.exp
H = [[1.0, 2.0, 0.5], [0.3, 0.7, 9.0]]  # entropies; the padding entry is garbage
PPO = [[-1.2, -e(-0.3), -1.2], [0.4, 0.5 * e(0.5), 0.0]]


def t(x):
    return torch.tensor(x, dtype=F64)


def run(name, entropy=None, **kw):
    x = t(LOGP).requires_grad_(True)
    ent = None if entropy is None else t(entropy).requires_grad_(True)
    loss, stats = policy_loss(name, logp=x, old_logp=x.detach() - t(DELTA), advantages=t(ADV),
                              mask=torch.tensor(MASK, dtype=torch.bool), entropy=ent, **kw)
    loss.backward()
    return loss.detach(), x.grad, stats, None if ent is None else ent.grad


def fracs(stats, frac, high, low):
    assert_close(stats["clip/frac"], t(frac))
    assert_close(stats["clip/frac_high"], t(high))
    assert_close(stats["clip/frac_low"], t(low))


# ----------------------------------------------------------------------------- entropy


def test_entropy_bonus_is_a_token_mean_whatever_the_aggregation():
    base, g_base, _, _ = run("grpo")
    loss, grad, stats, g_ent = run("grpo", entropy=H, entropy_coef=0.1)
    # Hbar = (1 + 2 + .5 + .3 + .7) / 5 = .9 over the response tokens, not grpo's per-sequence means
    assert_close(loss, base - 0.1 * 0.9)
    assert_close(stats["loss/entropy_bonus"], t(0.09))
    assert_close(stats["loss/policy"], base)
    # the bonus's gradient reaches the entropy (-c / N per response token), not logp's
    assert_close(grad, g_base)
    assert_close(g_ent, t([[-0.02, -0.02, -0.02], [-0.02, -0.02, 0.0]]))


def test_top_entropy_tokens_by_hand():
    # tau = the .6-quantile of [.3, .5, .7, 1, 2] (linear): position 2.4, .7 + .4 * .3 = .82; kept: t00, t01
    kept = top_entropy_mask(t(H), t(MASK), 0.4)
    assert kept.tolist() == [[True, True, False], [False, False, False]]
    loss, grad, stats, _ = run("ppo", entropy=H, top_entropy_quantile=0.4)
    # only t00 (clipped) and t01 keep a term; the denominator is still 5 tokens
    assert_close(loss, t((-1.2 - e(-0.3)) / 5))
    assert_close(grad, t([[0, -e(-0.3) / 5, 0], [0, 0, 0]]))
    assert_close(stats["loss/entropy_mask_frac"], t(2 / 5))
    # grpo: each response keeps its own |y_i| (row 1 has no kept token and still counts as a sequence)
    loss, _, _, _ = run("grpo", entropy=H, top_entropy_quantile=0.4)
    assert_close(loss, t(((-1.2 - e(-0.3)) / 3 + 0.0) / 2))
    # with a bonus, m is the kept tokens: Hbar = (1 + 2) / 2
    loss, _, stats, g_ent = run("ppo", entropy=H, top_entropy_quantile=0.4, entropy_coef=0.1)
    assert_close(loss, t((-1.2 - e(-0.3)) / 5 - 0.1 * 1.5))
    assert_close(g_ent, t([[-0.05, -0.05, 0], [0, 0, 0]]))
    # q = 1 keeps every response token
    assert top_entropy_mask(t(H), t(MASK), 1.0).tolist() == [[True, True, True], [True, True, False]]


def test_sequence_unit_losses_refuse_the_top_entropy_mask_and_bnpo():
    for name in ("gspo", "gspo_token", "gmpo", "luspo", "vespo"):
        with pytest.raises(ValueError, match="top_entropy_quantile"):
            run(name, entropy=H, top_entropy_quantile=0.5)
        with pytest.raises(ValueError, match="bnpo needs a token-unit loss"):
            run(name, aggregation="bnpo")
    with pytest.raises(ValueError, match="need the entropy"):
        run("grpo", entropy_coef=0.1)
    with pytest.raises(ValueError, match="whole minibatch"):
        run("grpo", entropy=H, top_entropy_quantile=0.5, units=2.0)


def test_entropy_gradient_through_the_chunked_head_is_autograds():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 5, generator=g, dtype=torch.float32)
    w = torch.randn(11, 5, generator=g, dtype=torch.float32)
    b = torch.randn(11, generator=g, dtype=torch.float32)
    y = torch.randint(0, 11, (7,), generator=g)
    a, c = torch.randn(7, generator=g), torch.randn(7, generator=g)

    def grads(chunk, grad):
        hh, ww, bb = (x.clone().requires_grad_(True) for x in (h, w, b))
        lp, ent = token_logp_entropy(hh, ww, bb, y, 0.7, chunk, True, grad)
        # a loss that uses both outputs, as the bonus does
        ((a * lp).sum() + (c * ent).sum() if grad else (a * lp).sum()).backward()
        return lp.detach(), ent.detach(), hh.grad, ww.grad, bb.grad

    # the reference: plain autograd through the softmax at temperature .7
    hh, ww, bb = (x.clone().requires_grad_(True) for x in (h, w, b))
    z = (hh @ ww.T + bb) / 0.7
    lsm = torch.log_softmax(z, -1)
    ((a * lsm.gather(-1, y[:, None])[:, 0]).sum() + (c * -(lsm.exp() * lsm).sum(-1)).sum()).backward()
    for chunk in (0, 3):
        lp, ent, gh, gw, gb = grads(chunk, True)
        assert_close(ent, -(lsm.exp() * lsm).sum(-1).detach(), rtol=1e-5, atol=1e-6)
        for got, want in ((gh, hh.grad), (gw, ww.grad), (gb, bb.grad)):
            assert_close(got, want, rtol=1e-4, atol=1e-5)
    # without entropy_grad the entropy is a constant and the gradients are log p's alone, as before
    lp0, ent0, gh0, _, _ = grads(3, False)
    lp1, ent1, _, _, _ = grads(3, True)
    assert torch.equal(lp0, lp1) and torch.equal(ent0, ent1) and gh0.abs().sum() > 0


# ----------------------------------------------------------------------------- Clip-Cov and KL-Cov

# cov_t = (A_t - mean A)(logp_t - mean logp): mean A = (3 - 1) / 5 = .4, mean logp = -1
# t00 .6 * 0 = 0 | t01 .6 * .5 = .3 | t02 .6 * -1 = -.6 | t10 -.9 * .7 = -.63 | t11 -.9 * -.2 = .18


def test_clip_cov_by_hand():
    # the clipped branch is active at t00, t02, t10: candidates t01 and t11; n = max(1, floor(.5 * 5)) = 2
    loss, grad, stats, _ = run("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    assert_close(loss, t((-1.2 + 0.0 - 1.2 + 0.4 + 0.0) / 5))
    assert_close(grad, torch.zeros(2, 3, dtype=F64))
    fracs(stats, 2 / 5, 1 / 5, 1 / 5)  # t11's ratio e^.5 is above 1, t01's e^-.3 below
    # the window (.2, 5) holds t01 (.3) only: t11 keeps its term
    loss, grad, stats, _ = run("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=0.2)
    assert_close(loss, t((-1.2 - 1.2 + 0.4 + 0.5 * e(0.5)) / 5))
    assert_close(grad, t([[0, 0, 0], [0, 0.5 * e(0.5) / 5, 0]]))
    fracs(stats, 1 / 5, 0.0, 1 / 5)
    # the defaults (window (1, 5)) hold no token here: ppo's loss
    loss, grad, stats, _ = run("clip_cov")
    assert_close(loss, t(sum(map(sum, PPO)) / 5))
    fracs(stats, 0.0, 0.0, 0.0)


def test_clip_cov_draws_n_tokens_with_the_generator():
    # n = max(1, floor(.2 * 5)) = 1 of the candidates [t01, t11] (row-major): randperm(2)'s first
    for seed in range(6):
        first = int(torch.randperm(2, generator=torch.Generator().manual_seed(seed))[0])
        _, grad, _, _ = run("clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-10.0,
                            generator=torch.Generator().manual_seed(seed))
        kept_t11 = grad[1, 1] != 0
        assert bool(kept_t11) == (first == 0), seed  # t01 drawn: t11 keeps its gradient
    # without a generator the draw is the same every call (seeded 0)
    a = run("clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-10.0)[1]
    assert torch.equal(a, run("clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-10.0)[1])


def test_kl_cov_by_hand():
    # n = 1: the largest cov is t01's (.3); its term gains kl_cov_coef * |delta| = 2 * .3
    loss, grad, stats, _ = run("kl_cov", kl_cov_ratio=0.2, kl_cov_coef=2.0)
    plain = [-e(0.2), -e(-0.3), -e(0.5), 0.5 * e(-0.4), 0.5 * e(0.5)]
    assert_close(loss, t((sum(plain) + 2.0 * 0.3) / 5))
    # dL/dlogp = -A r / N, and at t01 + coef * sign(delta) / N = -2 / 5
    assert_close(grad, t([[-e(0.2) / 5, (-e(-0.3) - 2.0) / 5, -e(0.5) / 5], [0.5 * e(-0.4) / 5, 0.5 * e(0.5) / 5, 0]]))
    fracs(stats, 1 / 5, 0.0, 1 / 5)
    # n = 2: t01 and t11 (.18), the next largest
    loss, _, stats, _ = run("kl_cov", kl_cov_ratio=0.5)
    assert_close(loss, t((sum(plain) + 0.3 + 0.5) / 5))
    fracs(stats, 2 / 5, 1 / 5, 1 / 5)


def test_clip_cov_and_kl_cov_refuse_a_part_of_a_minibatch():
    for name in ("clip_cov", "kl_cov"):
        assert LOSSES[name].minibatch_wide
        with pytest.raises(ValueError, match="whole minibatch"):
            run(name, units=5.0)


# ----------------------------------------------------------------------------- two-sided clip, bnpo


def test_delta_clip_caps_the_unclipped_branch_for_both_signs():
    # d = 1.5: t11 (A < 0, r = e^.5 = 1.65 > d) becomes max(.5 * 1.5, .5 * 1.2) = .75, without gradient;
    # t02 (A > 0, r > d) was clipped already (-1.2)
    loss, grad, stats, _ = run("ppo", delta_clip=1.5)
    assert_close(loss, t((-1.2 - e(-0.3) - 1.2 + 0.4 + 0.75) / 5))
    assert_close(grad, t([[0, -e(-0.3) / 5, 0], [0, 0, 0]]))
    fracs(stats, 3 / 5, 2 / 5, 1 / 5)  # the band's binding sides only, as ppo
    # d above every ratio: ppo's loss
    assert torch.equal(run("ppo", delta_clip=1.7)[0], run("ppo")[0])
    for bad in (1.1, 1.2):  # d must be above 1 + eps_high
        with pytest.raises(ValueError, match="delta_clip"):
            run("ppo", delta_clip=bad)
    with pytest.raises(ValueError, match="sapo does not take delta_clip"):
        run("sapo", delta_clip=3.0)


def test_bnpo_is_the_token_mean_of_this_processs_rows():
    # one process: grpo with bnpo is the token mean of its terms, ppo's loss bit for bit
    loss, grad, _, _ = run("grpo", aggregation="bnpo")
    ppo, g_ppo, _, _ = run("ppo")
    assert torch.equal(loss, ppo) and torch.equal(grad, g_ppo)
    # two ranks, rows 0 and 1: each divides by its own tokens (3, 2); the strategy averages the two
    l = t([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    m = t(MASK)
    rank0 = agg_loss(l[:1], m[:1], "bnpo", units=3.0)
    rank1 = agg_loss(l[1:], m[1:], "bnpo", units=2.0)
    assert_close((rank0 + rank1) / 2, t((6 / 3 + 9 / 2) / 2))
    # token-mean divides both by the minibatch's 5 tokens / 2 ranks
    both = agg_loss(l[:1], m[:1], "token-mean", units=2.5) + agg_loss(l[1:], m[1:], "token-mean", units=2.5)
    assert_close(both / 2, t(15 / 5))


# ----------------------------------------------------------------------------- off: bit-identical


OFF = {"entropy_coef": 0.0, "top_entropy_quantile": 1.0, "delta_clip": None, "aggregation": None}


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_control_off_leaves_the_loss_bit_identical(name, dtype):
    logp, old, roll, adv, mask = _inputs(0, dtype)
    spec = LOSSES[name]
    kw = {"max_new_tokens": 7} if name == "dr_grpo" else {}
    off = {k: v for k, v in OFF.items() if k in spec.keywords or k == "aggregation"}
    ent = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    x, y = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    base, base_stats = policy_loss(name, logp=x, old_logp=old, advantages=adv, mask=mask, **kw)
    loss, stats = policy_loss(name, logp=y, old_logp=old, advantages=adv, mask=mask, entropy=ent,
                              generator=torch.Generator().manual_seed(0), **off, **kw)
    base.backward()
    loss.backward()
    assert torch.equal(loss, base) and torch.equal(y.grad, x.grad)
    assert stats.keys() == base_stats.keys() and all(torch.equal(stats[k], base_stats[k]) for k in stats)


@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "gspo", "gspo_token", "cispo"])
def test_controls_off_match_the_six_as_they_were(name):
    # the code before any control existed (test_field_losses), against the losses given every off keyword
    logp, old, roll, adv, mask = _inputs(1, F64)
    spec = LOSSES[name]
    off = {k: v for k, v in OFF.items() if k in spec.keywords or k == "aggregation"}
    x, y = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    loss, stats = policy_loss(name, logp=x, old_logp=old, advantages=adv, mask=mask, entropy=torch.ones_like(logp),
                              **off)
    want, want_stats = _before_policy_loss(name, y, old, adv, mask)
    loss.backward()
    want.backward()
    assert torch.equal(loss, want) and torch.equal(x.grad, y.grad)
    assert all(torch.equal(stats[k], want_stats[k]) for k in want_stats)


def test_the_module_passes_no_control_while_they_are_off():
    settings = load_config("smoke").resolve("grpo", Recipe(
        loss_defaults=LOSSES["grpo"].param_defaults()), 8)
    assert loss_keywords(LOSSES["grpo"], settings.loss.hparams(), 8) == {
        "eps_low": 0.2, "eps_high": 0.2, "dual_clip_c": None, "delta_clip": None, "kl_estimator": "k3"}
    assert not EntropyControl.of(settings.loss).in_loss
    r = settings.rollout
    assert (r.mask_truncated, r.rejection, settings.loss.aggregation) == (False, None, None)


# ----------------------------------------------------------------------------- truncation and rejection


# log rho = old_logp - rollout_logp per token (row 1's last entry is padding, garbage)
L = [[0.1, 1.0, -0.5], [-1.0, 0.3, 50.0]]


def rejected(options, threshold, log_rho=L):
    old = t([[-1.0] * 3] * 2)
    return rejection_mask(old, old - t(log_rho), t(MASK), rejection_bounds(options, threshold)).tolist()


def test_rejection_options_by_hand():
    # k2 = l^2 / 2: .005, .5, .125 | .5, .045
    assert rejected("token_k2", 0.2) == [[True, False, True], [False, True, False]]
    # k1 = -l: -.1, -1, .5 | 1, -.3, inside [ln .5, ln 2] = [-.69, .69]
    assert rejected("token_k1", "0.5_2.0") == [[True, False, True], [False, True, False]]
    assert rejected("token_k1", 2.0) == rejected("token_k1", "0.5_2.0")  # one ratio: lo = 1 / hi
    # k3 = e^l - 1 - l: .00517, .71828, .10653 (mean .2767) | .36788, .04986 (mean .2089)
    assert rejected("token_k3", 0.1) == [[True, False, False], [False, True, False]]
    assert rejected("seq_mean_k3", 0.25) == [[False, False, False], [True, True, False]]
    assert rejected("seq_mean_k3", 0.2) == [[False] * 3, [False] * 3]
    # seq_mean_k1: -mean l = -.2 | .35; [ln(1/1.3), ln 1.3] = [-.262, .262] keeps row 0
    assert rejected("seq_mean_k1", 1.3) == [[True, True, True], [False, False, False]]
    # seq_max_k2: .5 | .5
    assert rejected("seq_max_k2", 0.4) == [[False] * 3, [False] * 3]
    assert rejected("seq_max_k2", 0.6) == [[True, True, True], [True, True, False]]
    # every option must pass: token_k2 keeps t00, t02, t11; seq_mean_k3 keeps row 1
    assert rejected("token_k2,seq_mean_k3", "0.2,0.25") == [[False] * 3, [False, True, False]]
    # l is clamped to +-20: k2 of l = 30 is 200, not 450
    assert rejected("token_k2", 200.0, [[30.0, 0, 0], [0, 0, 0]]) == [[True, True, True], [True, True, False]]
    assert rejected("token_k2", 199.0, [[30.0, 0, 0], [0, 0, 0]])[0][0] is False


def _loss_mask(batch, old, **rollout):
    cfg = load_config("smoke", overrides={"rollout": rollout})
    stats = StepStats()
    return loss_mask(cfg.rollout, batch, old, stats), stats.reduce()


def test_the_loss_mask_leaves_out_truncated_and_rejected_tokens():
    old = t([[-1.0] * 3] * 3)
    mask = t(MASK + [[1, 1, 1]])
    batch = SimpleNamespace(response_mask=mask, loss_mask=mask, truncated=torch.tensor([False, False, True]),
                            rollout_logp=old - t(L + [[0.0, 0.0, 0.0]]))
    m, stats = _loss_mask(batch, old)
    assert torch.equal(m, mask) and stats == {}
    m, _ = _loss_mask(batch, old, mask_truncated=True)
    assert m.tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0]]
    m, stats = _loss_mask(batch, old, mask_truncated=True, rejection="token_k2", rejection_threshold=0.2)
    assert m.tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]
    assert stats["mismatch/rejected_frac"] == pytest.approx(2 / 5)  # of the 5 tokens left after truncation
    # the masked tokens leave the denominators: grpo's row 2 is an empty response, left out of the mean
    x = t(LOGP + [[-1.0, -1.0, -1.0]])
    loss, _ = policy_loss("grpo", logp=x, old_logp=x - t(DELTA + [[0.0] * 3]), advantages=t(ADV + [2.0]),
                          mask=_loss_mask(batch, old, mask_truncated=True)[0])
    assert_close(loss, t((sum(PPO[0]) / 3 + sum(PPO[1]) / 2) / 2))


def test_mismatch_diagnostics_by_hand():
    old = t([[-1.0, -2.0, -0.5], [-0.3, -0.7, 9.0]])
    roll = t([[-1.2, -1.9, -0.5], [-0.1, -0.7, -50.0]])
    st = mismatch_stats(old, roll, t(MASK))
    lr = [0.2, -0.1, 0.0, -0.2, 0.0]  # log rho on the response tokens
    assert_close(st["mismatch/chi2_token"], t(sum(e(2 * x) for x in lr) / 5 - 1))
    # per response: sum_t log rho = .1 and -.2
    assert_close(st["mismatch/chi2_seq"], t((e(0.2) + e(-0.4)) / 2 - 1))
    assert_close(st["mismatch/ess"], t((sum(e(x) for x in lr) / 5) ** 2 / (sum(e(2 * x) for x in lr) / 5)))
    # trainer minus sampler log-perplexity: mean_t(-old) - mean_t(-roll) = -mean_t log rho, averaged over responses
    assert_close(st["mismatch/ppl_gap"], t((-0.1 / 3 + 0.1) / 2))
    # the chi-square's logs are clamped to +-20
    far = mismatch_stats(t([[30.0]]), t([[0.0]]), t([[1.0]]))
    assert_close(far["mismatch/chi2_token"], t(e(40.0) - 1))
    assert_close(far["mismatch/chi2_seq"], t(e(40.0) - 1))


# ----------------------------------------------------------------------------- config: one line, exit 2


def test_the_keys_reach_the_config_and_tune():
    over = parse_sets(["loss.entropy_coef=0.01", "loss.entropy_target=0.5", "loss.top_entropy_quantile=0.2",
                       "loss.delta_clip=4", "loss.aggregation=bnpo", "rollout.mask_truncated=true",
                       "rollout.rejection=token_k1,seq_max_k3", "rollout.rejection_threshold=0.5_2.0,0.1",
                       "loss.clip_cov_ratio=1e-3", "loss.kl_cov_coef=0.5"])
    cfg = load_config("smoke", overrides={**over, "algos": ["grpo"]})
    s = cfg.resolve("grpo", Recipe(loss_defaults=LOSSES["grpo"].param_defaults()), 8)
    assert (s.loss.entropy_coef, s.loss.entropy_target, s.loss.top_entropy_quantile, s.loss.delta_clip,
            s.loss.aggregation) == (0.01, 0.5, 0.2, 4.0, "bnpo")
    assert (s.rollout.mask_truncated, s.rollout.rejection, s.rollout.rejection_threshold) == (
        True, "token_k1,seq_max_k3", "0.5_2.0,0.1")
    # tune searches a control only when --params names it
    assert "entropy_coef" not in chosen_params(LOSSES["grpo"], None, False)
    assert chosen_params(LOSSES["grpo"], ("entropy_coef", "delta_clip", "top_entropy_quantile"), False) == (
        "entropy_coef", "delta_clip", "top_entropy_quantile")
    with pytest.raises(ConfigError, match="not in gspo's search space"):
        chosen_params(LOSSES["gspo"], ("top_entropy_quantile",), False)


@pytest.mark.parametrize("sets, algo, text", [
    (["loss.top_entropy_quantile=0"], "grpo", "loss.top_entropy_quantile=0 must be a finite number in (0, 1]"),
    (["loss.top_entropy_quantile=1.5"], "grpo", "loss.top_entropy_quantile=1.5 must be a finite number in (0, 1]"),
    (["loss.entropy_coef=-0.1"], "grpo", "loss.entropy_coef=-0.1 must be a finite number >= 0"),
    (["loss.entropy_coef_delta=0"], "grpo", "loss.entropy_coef_delta=0 must be a finite number > 0"),
    (["loss.entropy_coef_min=0.5", "loss.entropy_coef_max=0.1"], "grpo", "loss.entropy_coef_min=0.5 must be <= loss.entropy_coef_max=0.1"),
    (["loss.aggregation=sum"], "grpo", "loss.aggregation='sum' is not allowed (allowed: auto, bnpo)"),
    (["rollout.rejection=token_k4"], "grpo", "rollout.rejection option 'token_k4' is not allowed"),
    (["rollout.rejection=token_k2"], "grpo", "needs rejection_threshold"),
    (["rollout.rejection=token_k2", "rollout.rejection_threshold=-1"], "grpo", "must be one number > 0"),
    (["rollout.rejection_threshold=0.1"], "grpo", "rollout.rejection_threshold needs rollout.rejection"),
    # "lo_hi" is read as the text typed, never as a YAML 1.1 number (2_0.5 was 20.5, 0.5_2 was 0.52)
    (["rollout.rejection=token_k1", "rollout.rejection_threshold=2_0.5"], "grpo",
     "rejection_threshold '2_0.5' for token_k1 must be 'lo_hi', two ratios 0 < lo < hi"),
    (["rollout.rejection=token_k1", "rollout.rejection_threshold=2_2"], "grpo", "two ratios 0 < lo < hi"),
    (["rollout.rejection=token_k1", "rollout.rejection_threshold=0.5"], "grpo", "one ratio hi > 1"),
    (["rollout.rejection=token_k2,seq_max_k3,token_k2", "rollout.rejection_threshold=0.1"], "grpo",
     "rollout.rejection='token_k2,seq_max_k3,token_k2' names 'token_k2' more than once"),
    (["loss.clip_cov_lb=5", "loss.clip_cov_ub=1"], "clip_cov",
     "loss.clip_cov_lb=5 must be below loss.clip_cov_ub=1"),
    (["loss.clip_cov_lb=5", "loss.clip_cov_ub=1"], "grpo", "loss.clip_cov_lb=5 must be below"),  # given: refused
    # one side auto: checked against clip_cov's own default (ub 5), before any work
    (["loss.clip_cov_lb=6"], "clip_cov", "loss.clip_cov_lb=6 must be below loss.clip_cov_ub=5 (Clip-Cov draws "
     "from the tokens whose covariance lies strictly between them) (clip_cov)"),
    (["loss.entropy_coef=5", "loss.entropy_target=0.2"], "grpo",
     "loss.entropy_coef=5 must be within [loss.entropy_coef_min, loss.entropy_coef_max] = [0, 1]"),
    (["loss.entropy_coef=0.1", "loss.entropy_target=0.2", "loss.entropy_coef_min=0.2"], "grpo",
     "= [0.2, 1]"),
    (["loss.top_entropy_quantile=0.5"], "gspo", "needs a token-unit loss"),
    (["loss.aggregation=bnpo"], "luspo", "loss.aggregation=bnpo needs a token-unit loss"),
    (["loss.delta_clip=3"], "gspo", "loss.delta_clip=3.0 is for the clipped token losses"),
    (["loss.delta_clip=1.25"], "dapo", "must be above 1 + eps_high = 1.28"),
    (["train.micro_batch_tokens=64"], "clip_cov", "clip_cov needs one process and train.micro_batch_tokens off (null)"),
    (["loss.top_entropy_quantile=0.5", "train.micro_batch_tokens=64"], "grpo", "needs one process"),
])
def test_bad_values_stop_the_run_with_one_line(sets, algo, text, tmp_path, capsys):
    args = ["run", "--preset", "smoke", "--algos", algo, "--no-progress", "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    out = capsys.readouterr().out.strip()
    assert text in out and len(out.splitlines()) == 1, out
    assert not (tmp_path / "mlflow.db").exists()  # stopped before any work


# ----------------------------------------------------------------------------- the controls as one object


def _settings(**sets):
    cfg = load_config("smoke", overrides=parse_sets([f"{k}={v}" for k, v in sets.items()]))
    return cfg.resolve("grpo", Recipe(loss_defaults=LOSSES["grpo"].param_defaults()), 8)


def test_the_controls_pass_nothing_while_they_are_off():
    s = _settings()
    off = Controls.of(s.loss, s.rollout)
    assert off == Controls() and off.keywords(t(LOGP), t(H)) == {} and not off.needs_entropy
    # so the loss with them is the loss without them, bit for bit
    x = t(LOGP).requires_grad_(True)
    plain, _ = policy_loss("grpo", logp=x, old_logp=x.detach() - t(DELTA), advantages=t(ADV), mask=t(MASK))
    with_off, _ = policy_loss("grpo", logp=x, old_logp=x.detach() - t(DELTA), advantages=t(ADV), mask=t(MASK),
                              **off.keywords(t(LOGP), t(H)))
    assert torch.equal(plain, with_off)


def test_the_controls_are_built_from_the_settings_and_pass_only_what_is_on():
    s = _settings(**{"loss.entropy_coef": 0.01, "loss.top_entropy_quantile": 0.5, "loss.aggregation": "bnpo",
                     "rollout.correction": "tis", "rollout.correction_cap": 3.0, "rollout.opsm_threshold": 0.1})
    c = Controls.of(s.loss, s.rollout, entropy_coef=0.02)  # this optimiser step's coefficient wins
    roll, ent = t(LOGP), t(H)
    kw = c.keywords(roll, ent)
    assert kw == {"rollout_logp": roll, "correction": "tis", "correction_cap": 3.0, "correction_min": None,
                  "correction_level": "unit", "opsm_threshold": 0.1, "entropy_coef": 0.02,
                  "top_entropy_quantile": 0.5, "entropy": ent, "aggregation": "bnpo"}
    # no sampler log-probs: no correction, and sequence masking compares with the old log-probs
    assert set(c.keywords(None, ent)) == {"opsm_threshold", "entropy_coef", "top_entropy_quantile", "entropy",
                                          "aggregation"}
    # with the sampler's own old log-probs the correction's weight is 1: it is not passed
    s = _settings(**{"rollout.correction": "tis", "rollout.old_logp_source": "rollout"})
    assert Controls.of(s.loss, s.rollout).keywords(roll) == {}
    # the divisor of a part of a minibatch follows the aggregation in force
    assert (c.units_key(LOSSES["grpo"]), Controls().units_key(LOSSES["grpo"]), Controls().units_key(LOSSES["dapo"]),
            Controls().units_key(LOSSES["gspo"])) == ("local_token", "sequence", "token", "sequence")


def test_the_controls_check_what_a_loss_cannot_take():
    with pytest.raises(ValueError, match="aggregation=bnpo needs a token-unit loss"):
        Controls(aggregation="bnpo").check(LOSSES["gspo"])
    with pytest.raises(ValueError, match="top_entropy_quantile=0.5 needs a token-unit loss"):
        Controls(top_entropy_quantile=0.5).check(LOSSES["gmpo"])
    with pytest.raises(ValueError, match="delta_clip=1.1 must be above 1 \\+ eps_high"):
        Controls().check(LOSSES["grpo"], delta_clip=1.1, eps_high=0.2)
    Controls(aggregation="bnpo", top_entropy_quantile=0.5).check(LOSSES["grpo"])
