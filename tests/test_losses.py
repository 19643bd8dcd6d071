"""Hand-computed checks of gspo_bench.core.losses against docs/algorithms.md.

Expected numbers are written out from the formulas with ``math``; nothing here
compares a function with itself except the GSPO == GSPO-token identity, which
the contract asks for and which pits two different implementations against
each other.
"""

import dataclasses
import math

import pytest
import torch

from gspo_bench.core.loss_params import DUAL_CLIP_C, LossParam, clip_band
from gspo_bench.core.losses import BASE_DEFAULTS, LOSSES, agg_loss, kl_penalty, policy_loss, register_loss
from gspo_bench.core.metrics import merged, values

e = math.exp

# The shared 2x3 example. Row 1's last token is padding (its values are garbage).
DELTA = [[0.2, -0.3, 0.5], [-0.4, 0.5, 3.0]]
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]]
ADV = [1.0, -0.5]
MASK = [[1, 1, 1], [1, 1, 0]]


def example(adv=ADV, mask=MASK):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor(DELTA, dtype=torch.float64)
    return logp, old, torch.tensor(adv, dtype=torch.float64), torch.tensor(mask, dtype=torch.bool)


def run(name, **hp):
    logp, old, adv, mask = example()
    loss, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, **hp)
    loss.backward()
    return loss.item(), logp.grad.tolist(), stats


def close(a, b, tol=1e-9):
    assert a == pytest.approx(b, abs=tol), (a, b)


def close_grid(got, want, tol=1e-9):
    for g_row, w_row in zip(got, want):
        for g, w in zip(g_row, w_row):
            close(g, w, tol)


# ----------------------------------------------------------------------------- the six losses by hand


def test_ppo_by_hand():
    loss, grad, stats = run("ppo")
    # t00 r=e^.2=1.22>1.2, A>0: clipped -> -1.2 | t01 r=e^-.3, A>0: -r | t02 r=e^.5: clipped -> -1.2
    # t10 r=e^-.4=.67<.8, A<0: clipped -> .5*.8 | t11 r=e^.5, A<0: unclipped .5 r ; N = 5 tokens
    close(loss, (-1.2 - e(-0.3) - 1.2 + 0.4 + 0.5 * e(0.5)) / 5)
    # dL/dlogp = -A r / N on unclipped tokens, 0 on clipped and padding
    close_grid(grad, [[0, -e(-0.3) / 5, 0], [0, 0.5 * e(0.5) / 5, 0]])
    close(stats["clip/frac_high"].item(), 2 / 5)
    close(stats["clip/frac_low"].item(), 1 / 5)
    close(stats["clip/frac"].item(), 3 / 5)
    close(stats["clip/seq_frac"].item(), 1.0)
    close(stats["loss/policy"].item(), loss)
    close(stats["loss/kl"].item(), 0.0)


def test_grpo_by_hand():
    loss, grad, _ = run("grpo")
    # same terms as ppo, but each row is a token mean (3 and 2 tokens), then rows are averaged
    close(loss, ((-1.2 - e(-0.3) - 1.2) / 3 + (0.4 + 0.5 * e(0.5)) / 2) / 2)
    close_grid(grad, [[0, -e(-0.3) / 6, 0], [0, 0.5 * e(0.5) / 4, 0]])


def test_dapo_by_hand():
    loss, grad, stats = run("dapo")
    # eps_high .28: t00 r=1.2214 < 1.28 is no longer clipped; t02 r=1.6487 -> 1.28
    close(loss, (-e(0.2) - e(-0.3) - 1.28 + 0.4 + 0.5 * e(0.5)) / 5)
    close_grid(grad, [[-e(0.2) / 5, -e(-0.3) / 5, 0], [0, 0.5 * e(0.5) / 5, 0]])
    close(stats["clip/frac_high"].item(), 1 / 5)
    close(stats["clip/frac_low"].item(), 1 / 5)


def test_gspo_by_hand():
    loss, grad, stats = run("gspo")
    s0, s1 = e((0.2 - 0.3 + 0.5) / 3), e((-0.4 + 0.5) / 2)
    # row 0: s0=1.14 > 1.0004 with A>0 -> clipped to -1.0004 | row 1: s1=1.05, A<0 -> unclipped .5 s1
    close(loss, (-(1 + 4e-4) + 0.5 * s1) / 2)
    # d/dlogp_1t of .5 * (-A s1) = .5 * .5 * s1 / |y_1|, identical for every token of the row
    close_grid(grad, [[0, 0, 0], [0.25 * s1 / 2, 0.25 * s1 / 2, 0]])
    # every token of the clipped row counts: 3 of 5 tokens, 1 of 2 sequences
    close(stats["clip/frac_high"].item(), 3 / 5)
    close(stats["clip/frac"].item(), 3 / 5)
    close(stats["clip/seq_frac"].item(), 0.5)
    close(stats["ratio/seq_mean"].item(), (s0 + s1) / 2)
    close(stats["ratio/seq_min"].item(), s1)
    close(stats["ratio/seq_max"].item(), s0)


def test_gspo_token_by_hand():
    loss, grad, stats = run("gspo_token")
    s1 = e((-0.4 + 0.5) / 2)
    close(loss, (-(1 + 4e-4) + 0.5 * s1) / 2)
    close_grid(grad, [[0, 0, 0], [0.25 * s1 / 2, 0.25 * s1 / 2, 0]])
    close(stats["clip/frac_high"].item(), 3 / 5)
    close(stats["clip/seq_frac"].item(), 0.5)


def test_cispo_by_hand_default_no_truncation():
    loss, grad, stats = run("cispo")
    # all ratios < 5, so w = r; L = -w A logp, token-mean over 5
    terms = [-e(0.2) * 1 * -1.0, -e(-0.3) * 1 * -0.5, -e(0.5) * 1 * -2.0, -e(-0.4) * -0.5 * -0.3,
             -e(0.5) * -0.5 * -1.2]
    close(loss, sum(terms) / 5)
    # the weight is a constant: dL/dlogp = -w A / N (a live weight would add -A logp r / N)
    close_grid(grad, [[-e(0.2) / 5, -e(-0.3) / 5, -e(0.5) / 5], [0.5 * e(-0.4) / 5, 0.5 * e(0.5) / 5, 0]])
    close(stats["clip/frac"].item(), 0.0)


def test_cispo_by_hand_truncated_both_sides():
    loss, grad, stats = run("cispo", eps_low=0.2, eps_high=0.3)
    # w = clip(r, .8, 1.3): t02 and t11 capped at 1.3, t01 (r=.74) and t10 (r=.67) floored at .8
    w = [[e(0.2), 0.8, 1.3], [0.8, 1.3]]
    terms = [-w[0][0] * -1.0, -w[0][1] * -0.5, -w[0][2] * -2.0, -w[1][0] * -0.5 * -0.3, -w[1][1] * -0.5 * -1.2]
    close(loss, sum(terms) / 5)
    # truncated tokens keep their gradient, scaled by the truncated weight
    close_grid(grad, [[-w[0][0] / 5, -w[0][1] / 5, -1.3 / 5], [0.5 * 0.8 / 5, 0.5 * 1.3 / 5, 0]])
    # either side, whatever the sign of A (t11 has A<0 and still counts high, t01 has A>0 and counts low)
    close(stats["clip/frac_high"].item(), 2 / 5)
    close(stats["clip/frac_low"].item(), 2 / 5)
    close(stats["clip/frac"].item(), 4 / 5)
    close(stats["clip/seq_frac"].item(), 1.0)


def test_cispo_keeps_gradient_where_ppo_clips():
    logp = torch.tensor([[-1.0, -0.7]], requires_grad=True)
    old = torch.tensor([[-1.5, -0.7]])  # token 0: r = e^.5 = 1.65 > 1.2 with A > 0
    adv, mask = torch.tensor([2.0]), torch.ones(1, 2)
    policy_loss("ppo", logp=logp, old_logp=old, advantages=adv, mask=mask)[0].backward()
    assert logp.grad[0, 0].item() == 0.0
    logp.grad = None
    policy_loss("cispo", logp=logp, old_logp=old, advantages=adv, mask=mask, eps_high=0.2)[0].backward()
    close(logp.grad[0, 0].item(), -1.2 * 2.0 / 2, 1e-6)  # -clip(r) A / N
    close(logp.grad[0, 1].item(), -1.0 * 2.0 / 2, 1e-6)


# ----------------------------------------------------------------------------- GSPO specifics


def test_gspo_article_worked_example():
    # 512 tokens, 510 with ratio 1, two with 1.9 and 0.4
    logp = torch.zeros(1, 512, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 512, dtype=torch.float64)
    old[0, 10], old[0, 300] = -math.log(1.9), -math.log(0.4)
    loss, stats = policy_loss("gspo", logp=logp, old_logp=old, advantages=torch.tensor([1.0]),
                              mask=torch.ones(1, 512))
    s = stats["ratio/seq_mean"].item()
    close(s, e((math.log(1.9) + math.log(0.4)) / 512), 1e-12)
    assert abs(math.log(s) + 0.0005) < 5e-5
    loss.backward()
    # s = 0.99946 sits inside [1 - 3e-4, ...] for A > 0 (the low side only binds for A < 0):
    # every token gets the same gradient -A s / |y|, outliers included
    assert torch.allclose(logp.grad, torch.full_like(logp, -s / 512))
    # token-level PPO instead weights the 1.9 token (and clips it) differently from its neighbours
    logp.grad = None
    policy_loss("ppo", logp=logp, old_logp=old, advantages=torch.tensor([1.0]),
                mask=torch.ones(1, 512))[0].backward()
    assert logp.grad[0, 10].item() == 0.0 and logp.grad[0, 300].item() == pytest.approx(-0.4 / 512)


@pytest.mark.parametrize("dual_clip_c", [None, 1.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_token_equals_gspo_with_sequence_advantages(seed, dual_clip_c):
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 9
    base = torch.randn(B, T, generator=g, dtype=torch.float64) - 2.0
    # per-row drift from tiny to large, so rows land inside, outside and (A < 0) past the dual clip
    scale_B1 = torch.logspace(-2.5, 0.3, B, dtype=torch.float64)[:, None]
    old = base + scale_B1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    lens[3] = 0  # one empty response
    mask = torch.arange(T)[None, :] < lens[:, None]
    out = {}
    for name in ("gspo", "gspo_token"):
        logp = base.clone().requires_grad_(True)
        loss, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask,
                                  eps_low=0.02, eps_high=0.02, dual_clip_c=dual_clip_c)
        loss.backward()
        out[name] = loss.detach(), logp.grad, stats
    # the band is narrow enough that some but not all sequences clip
    assert 0.0 < out["gspo"][2]["clip/seq_frac"].item() < 1.0
    assert torch.allclose(out["gspo"][0], out["gspo_token"][0], atol=1e-12)
    assert torch.allclose(out["gspo"][1], out["gspo_token"][1], atol=1e-12)
    assert out["gspo"][1].abs().sum() > 0
    for key in ("clip/frac", "clip/frac_high", "clip/frac_low", "clip/seq_frac"):
        close(out["gspo"][2][key].item(), out["gspo_token"][2][key].item(), 1e-12)


def test_gspo_token_accepts_token_advantages_gspo_rejects_them():
    logp, old, _, mask = example()
    adv_BT = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -2.0, 0.0]], dtype=torch.float64)
    loss, _ = policy_loss("gspo_token", logp=logp, old_logp=old, advantages=adv_BT, mask=mask)
    loss.backward()
    s1 = e(0.05)
    # row 0 clipped high; row 1 (A<0, s1 > 1+eps_high: not binding): t10 1 s1, t11 2 s1, over |y_1| = 2
    close(loss.item(), (-(1 + 4e-4) + (s1 + 2 * s1) / 2) / 2)
    close_grid(logp.grad.tolist(), [[0, 0, 0], [s1 / 4, 2 * s1 / 4, 0]])
    with pytest.raises(ValueError, match="gspo_token"):
        policy_loss("gspo", logp=logp, old_logp=old, advantages=adv_BT, mask=mask)


# ----------------------------------------------------------------------------- clip fraction, dual clip


def test_clip_fraction_eps_low_none_never_clips_low():
    loss, grad, stats = run("ppo", eps_low=None)
    # t10 (r=.67, A<0) is now unclipped: .5 r, gradient .5 r / 5
    close(loss, (-1.2 - e(-0.3) - 1.2 + 0.5 * e(-0.4) + 0.5 * e(0.5)) / 5)
    close(grad[1][0], 0.5 * e(-0.4) / 5)
    close(stats["clip/frac_low"].item(), 0.0)
    close(stats["clip/frac"].item(), 2 / 5)
    close(stats["clip/seq_frac"].item(), 0.5)


def test_gspo_low_clip_counts_tokens_of_the_sequence():
    logp = torch.zeros(3, 4, dtype=torch.float64)
    old = torch.zeros(3, 4, dtype=torch.float64)
    old[0, :2] = 0.2  # s0 = e^-.2 = .82 < .9 with A<0 -> low clip, 2 tokens
    old[1, :] = 0.2  # s1 = .82 but A>0 -> low side does not bind
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    _, stats = policy_loss("gspo", logp=logp, old_logp=old, advantages=torch.tensor([-1.0, 1.0, 1.0]),
                           mask=mask, eps_low=0.1, eps_high=0.1)
    close(stats["clip/frac_low"].item(), 2 / 9)
    close(stats["clip/frac_high"].item(), 0.0)
    close(stats["clip/seq_frac"].item(), 1 / 3)


def test_strict_inequality_on_band_edge():
    logp = torch.tensor([[math.log(1.25)]], dtype=torch.float64)
    _, stats = policy_loss("ppo", logp=logp, old_logp=torch.zeros(1, 1, dtype=torch.float64),
                           advantages=torch.tensor([1.0], dtype=torch.float64), mask=torch.ones(1, 1),
                           eps_high=0.25)
    assert stats["clip/frac"].item() == 0.0


@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "gspo", "gspo_token"])
def test_dual_clip(name):
    # one token, A = -1, r = e^1.5 = 4.48: plain surrogate -A r = 4.48, dual clip caps it at -A c = 3
    logp = torch.tensor([[-0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-2.0]], dtype=torch.float64)
    kw = dict(old_logp=old, advantages=torch.tensor([-1.0], dtype=torch.float64), mask=torch.ones(1, 1))
    loss, _ = policy_loss(name, logp=logp, **kw)
    loss.backward()
    close(loss.item(), e(1.5))
    close(logp.grad.item(), e(1.5))  # -A r
    logp.grad = None
    loss, _ = policy_loss(name, logp=logp, dual_clip_c=3.0, **kw)
    loss.backward()
    close(loss.item(), 3.0)
    assert logp.grad.item() == 0.0
    # A > 0 is untouched by the dual clip: r clipped to 1+eps_high
    loss, _ = policy_loss(name, logp=logp, old_logp=old, advantages=torch.tensor([1.0], dtype=torch.float64),
                          mask=torch.ones(1, 1), dual_clip_c=3.0)
    close(loss.item(), -(1 + LOSSES[name].eps_high))


# ----------------------------------------------------------------------------- stats, KL


def test_ratio_and_kl_old_stats_by_hand():
    _, _, stats = run("ppo")
    d = [0.2, -0.3, 0.5, -0.4, 0.5]
    mean_d = sum(d) / 5
    close(stats["ratio/mean"].item(), sum(e(x) for x in d) / 5)
    close(stats["ratio/min"].item(), e(-0.4))
    close(stats["ratio/max"].item(), e(0.5))
    close(stats["ratio/token_log_std"].item(), math.sqrt(sum((x - mean_d) ** 2 for x in d) / 5))
    a, b = 0.4 / 3, 0.1 / 2
    close(stats["ratio/seq_log_std"].item(), abs(a - b) / 2)
    close(stats["ratio/seq_mean"].item(), (e(a) + e(b)) / 2)
    # kl/old = mean of r - 1 - log r with r = e^d (k3 of KL(old || new); the tokens are the old policy's)
    close(stats["kl/old"].item(), sum(e(x) - 1 - x for x in d) / 5)
    for v in stats.values():
        assert v.dim() == 0 and not v.requires_grad


def test_kl_old_direction_on_one_token():
    # r = 2: r - 1 - log r = 0.30685; the reversed estimator 1/r - 1 + log r would give 0.19315
    _, stats = policy_loss("grpo", logp=torch.tensor([[math.log(2.0)]]), old_logp=torch.zeros(1, 1),
                           advantages=torch.ones(1), mask=torch.ones(1, 1))
    close(stats["kl/old"].item(), 1 - math.log(2.0), 1e-6)


def test_kl_estimators_by_hand():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    dr = [-0.5, 1.0]  # ref - logp
    close_grid(kl_penalty(logp, ref, "k1").tolist(), [[0.5, -1.0]])
    close_grid(kl_penalty(logp, ref, "k2").tolist(), [[0.125, 0.5]])
    close_grid(kl_penalty(logp, ref, "k3").tolist(), [[e(x) - x - 1 for x in dr]])
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k4")


def test_kl_term_in_loss_and_its_gradient():
    logp, old, adv, mask = example()
    ref = logp.detach() - 0.1  # delta_ref = -0.1 on every token
    loss, stats = policy_loss("ppo", logp=logp, old_logp=old, advantages=adv, mask=mask, kl_coef=0.5,
                              ref_logp=ref)
    loss.backward()
    k3 = e(-0.1) + 0.1 - 1
    pg = (-1.2 - e(-0.3) - 1.2 + 0.4 + 0.5 * e(0.5)) / 5
    close(loss.item(), pg + 0.5 * k3)
    close(stats["loss/kl"].item(), 0.5 * k3)
    close(stats["loss/policy"].item(), pg)
    # d k3 / d logp = 1 - exp(delta_ref), token-mean over 5, times kl_coef
    dk = 0.5 * (1 - e(-0.1)) / 5
    close_grid(logp.grad.tolist(), [[dk, -e(-0.3) / 5 + dk, dk], [dk, 0.5 * e(0.5) / 5 + dk, 0]])


def test_kl_for_gspo_is_seq_mean_of_token_means():
    logp, old, adv, mask = example()
    ref = logp.detach() + torch.tensor([[0.0, 0.0, 0.3], [0.6, 0.0, 0.0]], dtype=torch.float64)
    loss, stats = policy_loss("gspo", logp=logp, old_logp=old, advantages=adv, mask=mask, kl_coef=1.0,
                              ref_logp=ref, kl_estimator="k2")
    # row 0: (0 + 0 + .3^2/2) / 3, row 1: (.6^2/2 + 0) / 2, averaged over rows
    close(stats["loss/kl"].item(), (0.045 / 3 + 0.18 / 2) / 2)


# ----------------------------------------------------------------------------- empty rows, padding, dtype


def need(name):
    # dr_grpo's aggregation needs the rollout's length cap
    return {"max_new_tokens": 4} if name == "dr_grpo" else {}


@pytest.mark.parametrize("name", list(LOSSES))
def test_empty_row_changes_nothing(name):
    logp, old, adv, mask = example()
    loss, stats = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, **need(name))
    # append a response with no token, full of garbage
    logp2 = torch.cat([logp.detach(), torch.tensor([[-math.inf, 5.0, 7.0]], dtype=torch.float64)])
    logp2.requires_grad_(True)
    old2 = torch.cat([old, torch.tensor([[0.0, -9.0, math.inf]], dtype=torch.float64)])
    adv2 = torch.cat([adv, torch.tensor([100.0], dtype=torch.float64)])
    mask2 = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    loss2, stats2 = policy_loss(name, logp=logp2, old_logp=old2, advantages=adv2, mask=mask2, **need(name))
    loss2.backward()
    close(loss2.item(), loss.item(), 1e-12)
    assert torch.isfinite(logp2.grad).all() and (logp2.grad[2] == 0).all()
    for k in stats:
        close(stats2[k].item(), stats[k].item(), 1e-12)


@pytest.mark.parametrize("name", list(LOSSES))
def test_all_masked_batch_gives_connected_zero(name):
    logp = torch.full((2, 3), -math.inf, requires_grad=True)
    loss, stats = policy_loss(name, logp=logp, old_logp=torch.zeros(2, 3), advantages=torch.ones(2),
                              mask=torch.zeros(2, 3), kl_coef=0.1, ref_logp=torch.zeros(2, 3), **need(name))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert (logp.grad == 0).all()
    assert all(v.item() == 0.0 for v in stats.values())


@pytest.mark.parametrize("name", [n for n, spec in LOSSES.items() if not spec.minibatch_wide])
def test_the_parts_statistics_merge_into_the_whole_minibatchs(name):
    """A minibatch's stats from its parts (micro-batches: each part's loss over the whole minibatch's counts),
    merged from the parts' sufficient statistics, are its stats from one call over all its rows."""
    g = torch.Generator().manual_seed(3)
    B, T = 6, 4
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[4] = False  # an empty response
    kw = dict(advantages=torch.randn(B, generator=g, dtype=torch.float64), rollout_logp=old - 0.1,
              correction="tis", opsm_threshold=0.05, kl_coef=0.1, entropy_coef=0.01,
              ref_logp=logp - 0.2, **need(name))
    ent = torch.rand(B, T, generator=g, dtype=torch.float64)
    _, whole = policy_loss(name, logp=logp, old_logp=old, mask=mask, entropy=ent, **kw)
    len_B = mask.sum(-1)
    units = float(len_B.sum()) if LOSSES[name].aggregation == "token-mean" else float((len_B > 0).sum())
    parts = []
    for rows in (torch.tensor([0, 1]), torch.tensor([2, 3, 4]), torch.tensor([5])):
        part_kw = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        _, st = policy_loss(name, logp=logp[rows], old_logp=old[rows], mask=mask[rows], entropy=ent[rows],
                            units=units, token_units=float(len_B.sum()), partials=True, **part_kw)
        parts.append(st)
    got = values(merged(parts))
    assert got.keys() == whole.keys() and {"mismatch/opsm_frac", "mismatch/is_weight_mean", "loss/entropy_bonus",
                                           "ratio/seq_log_std", "clip/frac"} <= set(got)
    for k in whole:
        close(got[k].item(), whole[k].item(), 1e-12)


def test_bf16_inputs_computed_in_float32():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    loss, stats = policy_loss("ppo", logp=logp, old_logp=logp.detach(), advantages=torch.tensor([1.0]),
                              mask=torch.ones(1, 2))
    assert loss.dtype == torch.float32 and stats["ratio/mean"].dtype == torch.float32
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16
    assert torch.allclose(logp.grad.float(), torch.full((1, 2), -0.5))  # -A r / N with r = 1


# ----------------------------------------------------------------------------- aggregation


def test_agg_loss_modes_by_hand():
    loss_BT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    close(agg_loss(loss_BT, mask, "token-mean").item(), (1 + 2 + 4) / 3, 1e-6)
    close(agg_loss(loss_BT, mask, "seq-mean-token-mean").item(), (1.5 + 4) / 2, 1e-6)
    close(agg_loss(torch.tensor([1.0, 3.0, 100.0]), mask, "seq-mean").item(), 2.0, 1e-6)
    with pytest.raises(ValueError, match="aggregation"):
        agg_loss(loss_BT, mask, "sum")


# ----------------------------------------------------------------------------- registry, validation


def test_registry_matches_contract_table():
    assert list(LOSSES) == ["ppo", "grpo", "dapo", "gspo", "gspo_token", "cispo", "sapo", "gmpo", "dr_grpo", "luspo",
                            "vespo", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "rollout_is", "dro"]
    want = {"ppo": (0.2, 0.2, "token-mean"), "grpo": (0.2, 0.2, "seq-mean-token-mean"),
            "dapo": (0.2, 0.28, "token-mean"), "gspo": (3e-4, 4e-4, "seq-mean"),
            "gspo_token": (3e-4, 4e-4, "seq-mean-token-mean"), "cispo": (None, 4.0, "token-mean"),
            "sapo": (None, None, "seq-mean-token-mean"), "gmpo": (0.4, 0.4, "seq-mean"),
            "dr_grpo": (0.2, 0.2, "seq-mean-token-sum-norm"), "luspo": (3e-4, 4e-4, "seq-mean"),
            "vespo": (None, None, "token-mean"), "dppo_tv": (0.15, 0.15, "token-mean"),
            "dppo_kl": (0.05, 0.05, "token-mean"), "clip_cov": (0.2, 0.2, "token-mean"),
            "kl_cov": (None, None, "token-mean"), "rollout_is": (0.2, 0.2, "token-mean"),
            "dro": (None, None, "token-mean")}
    own = {"sapo": {"tau_pos": 1.0, "tau_neg": 1.05}, "vespo": {"k_pos": 2.0, "lam_pos": 3.0, "k_neg": 3.0,
                                                                "lam_neg": 2.0},
           "dppo_tv": {"trunc_c": 20.0}, "dppo_kl": {"trunc_c": 20.0},
           "clip_cov": {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
           "kl_cov": {"kl_cov_ratio": 2e-4, "kl_cov_coef": 1.0}, "dro": {"dro_beta": 0.1}}
    for name, spec in LOSSES.items():
        assert (spec.eps_low, spec.eps_high, spec.aggregation) == want[name]
        assert dict(spec.defaults) == own.get(name, {})
        # a paper, or the public code that defines it (rollout_is: SkyRL's)
        assert spec.name == name and ("arxiv.org" in spec.paper or "github.com" in spec.paper)
    assert BASE_DEFAULTS == {"kl_coef": 0.0, "kl_estimator": "k3"} and DUAL_CLIP_C.default is None
    with pytest.raises(ValueError, match="already"):
        register_loss("ppo", ratio="token", loss="x", aggregation="token-mean", params=clip_band(0.2, 0.2),
                      paper="p")
    with pytest.raises(ValueError, match="aggregation"):
        register_loss("new", ratio="token", loss="x", aggregation="sum", params=clip_band(0.2, 0.2), paper="p")
    with pytest.raises(ValueError, match="not declared"):
        register_loss("new", ratio="token", loss="x", aggregation="token-mean", paper="p",
                      params=(LossParam("undeclared", 1.0, "A parameter loss_params.py does not know."),))
    with pytest.raises(ValueError, match="not declared"):  # a declared name with a range of its own
        register_loss("new", ratio="token", loss="x", aggregation="token-mean", paper="p",
                      params=(dataclasses.replace(DUAL_CLIP_C, low=0.0),))
    with pytest.raises(ValueError, match="outside their declared ranges"):
        register_loss("new", ratio="token", loss="x", aggregation="token-mean", paper="p",
                      params=clip_band(1.5, 0.2))
    assert "new" not in LOSSES


@pytest.mark.parametrize(
    "name, kwargs, err, match",
    [
        ("trpo", {}, ValueError, "ppo"),
        ("ppo", {"clip_eps": 0.2}, TypeError, "clip_eps.*eps_high"),
        ("ppo", {"eps_low": 1.0}, ValueError, "eps_low"),
        ("ppo", {"eps_low": -0.1}, ValueError, "eps_low"),
        ("ppo", {"eps_high": -0.1}, ValueError, "eps_high"),
        ("ppo", {"kl_coef": 0.1}, ValueError, "ref_logp"),
        ("ppo", {"kl_estimator": "k9"}, ValueError, "kl_estimator"),
        ("ppo", {"dual_clip_c": 0.5}, ValueError, "dual_clip_c"),
        ("cispo", {"dual_clip_c": 3.0}, ValueError, "dual_clip_c"),
        ("gspo", {"advantages": torch.ones(2, 3)}, ValueError, "gspo_token"),
        ("ppo", {"advantages": torch.ones(3)}, ValueError, "advantages"),
        ("ppo", {"mask": torch.ones(2, 4)}, ValueError, "mask"),
        ("ppo", {"old_logp": torch.zeros(2, 2)}, ValueError, "old_logp"),
        ("ppo", {"kl_coef": 0.1, "ref_logp": torch.zeros(3, 3)}, ValueError, "ref_logp"),
    ],
)
def test_bad_inputs_raise(name, kwargs, err, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.ones(2),
                mask=torch.ones(2, 3))
    args.update(kwargs)
    with pytest.raises(err, match=match):
        policy_loss(name, **args)
