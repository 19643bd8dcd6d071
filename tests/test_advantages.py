"""Hand-computed checks of gspo_bench.core.advantages against docs/algorithms.md, and its estimator registry
through the config to a real rollout."""

import math

import pytest
import torch

from gspo_bench.config import ConfigError, RolloutConfig, load_config
from gspo_bench.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    explained_variance,
    gae,
    group_is_degenerate,
    group_zscore,
    overlong_penalty,
    register_advantage,
    token_rewards,
    whiten,
)
from gspo_bench.core.names import ADVANTAGE_ESTIMATOR_NAMES
from gspo_bench.models import build_builtin
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.tasks import Task, TaskSpec, generate_arith


def close_list(got, want, tol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=tol), (got, want)


def close_grid(got, want, tol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        close_list(g, w, tol)


# ----------------------------------------------------------------------------- group z-score


def test_group_zscore_contract_check():
    adv = group_zscore(torch.tensor([1.0, 0.0, 1.0, 0.0]), group_size=4)
    close_list(adv.tolist(), [1.0, -1.0, 1.0, -1.0], 1e-5)


def test_group_zscore_population_std_and_eps():
    # rewards [0, 1, 2]: mean 1, population std sqrt(2/3) (the sample std would be 1)
    adv = group_zscore(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), group_size=3)
    sd = math.sqrt(2 / 3) + 1e-6
    close_list(adv.tolist(), [-1 / sd, 0.0, 1 / sd], 1e-12)


def test_group_zscore_two_groups_and_scale_none():
    r = torch.tensor([1.0, 0.0, 3.0, 5.0, 5.0, 5.0])
    # group 1 [1, 0, 3]: mean 4/3, population std sd; group 2 is constant -> 0
    m = 4 / 3
    sd = math.sqrt(((1 - m) ** 2 + m**2 + (3 - m) ** 2) / 3)
    close_list(group_zscore(r, 3).tolist(), [(1 - m) / (sd + 1e-6), -m / (sd + 1e-6), (3 - m) / (sd + 1e-6),
                                             0, 0, 0])
    close_list(group_zscore(r, 3, scale="none").tolist(), [1 - m, -m, 3 - m, 0, 0, 0])
    # groups are consecutive runs: pairs [1, 0], [3, 5], [5, 5]
    close_list(group_zscore(r, 2, scale="none").tolist(), [0.5, -0.5, -1.0, 1.0, 0.0, 0.0])


def test_group_zscore_rejects_bad_input():
    with pytest.raises(ValueError, match="groups of 4"):
        group_zscore(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale"):
        group_zscore(torch.zeros(4), 2, scale="mad")
    with pytest.raises(ValueError, match="group_size"):
        group_zscore(torch.zeros(4), 0)
    with pytest.raises(ValueError, match="baseline"):
        group_zscore(torch.zeros(4), 2, baseline="median")
    with pytest.raises(ValueError, match="scale"):
        group_zscore(torch.zeros(4), 2, scale="std")  # the z-score is scale "group"


# ----------------------------------------------------------------------------- baselines and scales


def test_default_is_the_group_zscore_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(24, generator=g)
    # the expression as it always was: (R - mean) / (population std + 1e-6), per group of 4
    r_NG = r.view(-1, 4)
    want = ((r_NG - r_NG.mean(-1, keepdim=True)) / (r_NG.std(-1, unbiased=False, keepdim=True) + 1e-6)).reshape(-1)
    assert torch.equal(group_zscore(r, 4), want)
    assert torch.equal(group_zscore(r, 4, scale="group", baseline="group_mean"), want)


def test_leave_one_out_by_hand():
    # rewards [1, 0, 1, 0]: A_i = R_i - mean of the other three: 1 - 1/3, 0 - 2/3, ...
    close_list(group_zscore(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4, scale="none", baseline="leave_one_out").tolist(),
               [2 / 3, -2 / 3, 2 / 3, -2 / 3])
    # = G / (G - 1) (R_i - mean R) = 4/3 * [.5, -.5, .5, -.5]; with the group scale, / (std = .5)
    close_list(group_zscore(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4, baseline="leave_one_out").tolist(),
               [(2 / 3) / (0.5 + 1e-6), -(2 / 3) / (0.5 + 1e-6), (2 / 3) / (0.5 + 1e-6), -(2 / 3) / (0.5 + 1e-6)])
    # G = 3: [3, 0, 0] -> 3 - 0, 0 - 1.5, 0 - 1.5
    close_list(group_zscore(torch.tensor([3.0, 0.0, 0.0]), 3, scale="none", baseline="leave_one_out").tolist(),
               [3.0, -1.5, -1.5])


def test_batch_scale_by_hand():
    # two groups of 2: [1, 0] centred [.5, -.5]; [4, 0] centred [2, -2]
    r = torch.tensor([1.0, 0.0, 4.0, 0.0], dtype=torch.float64)
    # population std over the batch of the centred values: sqrt((.25 + .25 + 4 + 4) / 4) = sqrt(2.125)
    sd = math.sqrt(2.125)
    close_list(group_zscore(r, 2, scale="batch").tolist(), [0.5 / (sd + 1e-6), -0.5 / (sd + 1e-6),
                                                            2 / (sd + 1e-6), -2 / (sd + 1e-6)], 1e-12)
    # the group scale would give [1, -1, 1, -1] instead: the batch scale keeps the groups' relative sizes
    close_list(group_zscore(r, 2).tolist(), [1, -1, 1, -1], 1e-5)
    # leave-one-out with the batch scale: the baseline's G/(G-1) = 2 times the centred value, same divisor
    close_list(group_zscore(r, 2, scale="batch", baseline="leave_one_out").tolist(),
               [1 / (sd + 1e-6), -1 / (sd + 1e-6), 4 / (sd + 1e-6), -4 / (sd + 1e-6)], 1e-12)


def test_batch_scale_sums_over_ranks():
    # two "ranks" holding one group each give the single-process answer when all_sum adds both shares
    r = torch.tensor([1.0, 0.0, 4.0, 0.0], dtype=torch.float64)
    shares = [r[:2], r[2:]]
    c = [x - x.mean() for x in shares]
    totals = {"n": 4.0, "s": float(sum(x.sum() for x in c)), "q": float(sum(x.square().sum() for x in c))}

    def all_sum_for(rank):
        calls = iter(["n", "s", "q"])
        return lambda t: torch.tensor(totals[next(calls)], dtype=torch.float64)

    got = torch.cat([group_zscore(x, 2, scale="batch", all_sum=all_sum_for(i)) for i, x in enumerate(shares)])
    assert torch.allclose(got, group_zscore(r, 2, scale="batch"), atol=1e-12)


def test_group_is_degenerate_uses_a_tolerance():
    r = torch.tensor([1.0, 1.0 + 1e-9, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    # group 0 differs by 1e-9: not equal, but degenerate within tol
    assert group_is_degenerate(r, 4).tolist() == [True, False, True]
    assert group_is_degenerate(r, 4, tol=0.0).tolist() == [False, False, True]
    with pytest.raises(ValueError):
        group_is_degenerate(r, 5)


# ----------------------------------------------------------------------------- overlong shaping


def test_overlong_penalty_by_hand():
    # max_len 100, buffer 20: zero up to 80, then -(L - 80)/20
    lengths = torch.tensor([10, 80, 81, 90, 100, 110])
    close_list(overlong_penalty(lengths, 100, 20).tolist(), [0.0, 0.0, -0.05, -0.5, -1.0, -1.5])
    close_list(overlong_penalty(lengths, 100, 20, penalty=2.0).tolist(), [0.0, 0.0, -0.1, -1.0, -2.0, -3.0])


@pytest.mark.parametrize("max_len, buffer", [(100, 0), (100, -5), (10, 20)])
def test_overlong_penalty_rejects_bad_buffer(max_len, buffer):
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([5]), max_len, buffer)


# ----------------------------------------------------------------------------- PPO rewards and GAE


def test_token_rewards_places_score_on_last_response_token():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]])
    close_grid(token_rewards(scores, mask).tolist(),
               [[0, 1, 0, 0], [0, 0, 0, 2], [0, 0, 0, 0], [0, 0, 4, 0]])
    kl = torch.full((4, 4), 0.2)
    # minus kl_coef * kl = 0.1 on every response token only
    close_grid(token_rewards(scores, mask, kl, kl_coef=0.5).tolist(),
               [[-0.1, 0.9, 0, 0], [-0.1, -0.1, -0.1, 1.9], [0, 0, 0, 0], [0, -0.1, 3.9, 0]])
    with pytest.raises(ValueError, match="kl_BT"):
        token_rewards(scores, mask, kl_coef=0.5)


def test_gae_single_row_gamma1_lam095():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]], requires_grad=True)
    adv, ret = gae(rewards, values, torch.ones(1, 3))
    # t2: d = 1 + 0 - .7 = .3, A = .3 | t1: d = .7 - .6 = .1, A = .1 + .95*.3 = .385
    # t0: d = .6 - .5 = .1, A = .1 + .95*.385 = .46575
    close_grid(adv.tolist(), [[0.46575, 0.385, 0.3]])
    close_grid(ret.tolist(), [[0.96575, 0.985, 1.0]])
    assert not adv.requires_grad and not ret.requires_grad  # values are constants


def test_gae_gamma_and_lambda_both_used():
    adv, _ = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3),
                 gamma=0.9, lam=0.5)
    # t2: .3 | t1: d = .9*.7 - .6 = .03, A = .03 + .45*.3 = .165 | t0: d = .9*.6 - .5 = .04, A = .04 + .45*.165
    close_grid(adv.tolist(), [[0.04 + 0.45 * 0.165, 0.165, 0.3]])


def test_gae_ragged_right_padded_batch():
    rewards = torch.tensor([[0.0, 0.0, 2.0, 5.0], [0.0, -1.0, 7.0, 7.0]])
    values = torch.tensor([[1.0, 1.0, 1.0, 9.0], [0.2, 0.4, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask)
    # row 0: t2 d = 2 - 1 = 1 | t1 d = 0, A = .95 | t0 d = 0, A = .9025 (padding reward 5 and value 9 ignored)
    # row 1: t1 d = -1 + 0 - .4 = -1.4 | t0 d = .4 - .2 = .2, A = .2 + .95 * -1.4 = -1.13
    close_grid(adv.tolist(), [[0.9025, 0.95, 1.0, 0.0], [-1.13, -1.4, 0.0, 0.0]])
    close_grid(ret.tolist(), [[1.9025, 1.95, 2.0, 0.0], [-0.93, -1.0, 0.0, 0.0]])


def test_gae_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


# ----------------------------------------------------------------------------- whiten, explained variance


def test_whiten_by_hand():
    x = torch.tensor([[2.0, 4.0, 100.0], [6.0, -50.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # response values 2, 4, 6: mean 4, Bessel variance (4 + 0 + 4) / 2 = 4, std 2
    close_grid(whiten(x, mask).tolist(), [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    close_grid(whiten(x, mask, shift_mean=False).tolist(), [[3.0, 4.0, 0.0], [5.0, 0.0, 0.0]])


def test_explained_variance_by_hand():
    mask = torch.tensor([[1, 1, 1, 0]])
    ret = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    close_list([explained_variance(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), ret, mask).item()], [1.0])
    close_list([explained_variance(torch.zeros(1, 4), ret, mask).item()], [0.0])
    # residual [0, 0, -1]: variance 2/9; returns variance 2/3 -> 1 - 1/3
    close_list([explained_variance(torch.tensor([[1.0, 2.0, 4.0, 0.0]]), ret, mask).item()], [2 / 3])
    # constant returns: undefined, reported as 0 (never NaN)
    ev = explained_variance(torch.tensor([[0.0, 1.0, 2.0, 0.0]]), torch.ones(1, 4), mask)
    assert ev.dim() == 0 and ev.item() == 0.0


# ----------------------------------------------------------------------------- the estimator registry


def test_group_is_registered_and_the_config_knows_every_registered_name():
    assert ADVANTAGE_ESTIMATORS["group"] is group_zscore
    # the config checks names torch-free, against the list the registry extends
    assert ADVANTAGE_ESTIMATOR_NAMES == list(ADVANTAGE_ESTIMATORS)
    assert RolloutConfig().advantage_estimator == "group"


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="'group' is registered already"):
        register_advantage("group")(lambda rewards_B, group_size, **kw: rewards_B)


@pytest.fixture
def leave_one_out():
    """A toy estimator ``toy_loo``: ``A_i = R_i - mean_{j != i} R_j``, one loop per response, no scaling; it
    records the keywords it was called with. Unregistered afterwards."""
    calls = []

    @register_advantage("toy_loo")
    def toy_loo(rewards_B, group_size, *, scale, baseline, all_sum):
        calls.append({"scale": scale, "baseline": baseline, "all_sum": all_sum})
        r = rewards_B.tolist()
        out = []
        for i, x in enumerate(r):
            start = i - i % group_size
            others = [y for j, y in enumerate(r[start:start + group_size], start) if j != i]
            # A_i = R_i - mean of the other G - 1 rewards of its group
            out.append(x - sum(others) / len(others))
        return torch.tensor(out)

    try:
        yield calls
    finally:
        ADVANTAGE_ESTIMATORS.pop("toy_loo", None)
        if "toy_loo" in ADVANTAGE_ESTIMATOR_NAMES:
            ADVANTAGE_ESTIMATOR_NAMES.remove("toy_loo")


@pytest.fixture(scope="module")
def tiny():
    """The smoke preset's model (tiny-dense) and a small arith task."""
    model, tok = build_builtin("tiny-dense", 0)
    train, eval_ = generate_arith(0, min_digits=1, max_digits=2, n_train=40, n_eval=8)
    return model.eval(), tok, Task(TaskSpec(name="arith-small", kind="arith"), train, eval_)


def rollout_with(tiny, rewards, **settings):
    """One real rollout of 2 prompts x 3 samples on transformers' generate, the verifier replaced by
    ``rewards``."""
    model, tok, task = tiny
    s = RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=4, engine="hf", dynamic_sampling=False,
                      overlong_buffer=None, advantage_scale="group", **settings)
    dm = RolloutDataModule(task, tok, s, steps=1, seed=0, policy=model, eval_prompts=4)
    dm.producer.score = lambda texts, answers: torch.tensor(rewards, dtype=torch.float32)
    torch.manual_seed(0)
    return dm.rollout(0)


def test_a_registered_estimator_chosen_by_config_reaches_the_rollout(tiny, leave_one_out):
    cfg = load_config("smoke", overrides={"rollout": {"advantage_estimator": "toy_loo"}})
    assert cfg.rollout.advantage_estimator == "toy_loo"
    batch = rollout_with(tiny, [1.0, 0.0, 0.0, 0.5, 2.0, 3.5], advantage_estimator="toy_loo")
    # [1, 0, 0]: 1 - 0, 0 - 1/2, 0 - 1/2; [0.5, 2, 3.5]: 0.5 - 2.75, 2 - 2, 3.5 - 1.25
    assert torch.equal(batch.advantages, torch.tensor([1.0, -0.5, -0.5, -2.25, 0.0, 2.25]))
    # it gets the config's baseline and scale, and no cross-process sum on one process
    assert leave_one_out == [{"scale": "group", "baseline": "group_mean", "all_sum": None}]


def test_the_default_estimator_is_the_group_zscore_bit_for_bit(tiny):
    rewards = [1.0, 0.0, 0.0, 0.5, 2.0, 3.5]
    batch = rollout_with(tiny, rewards)
    assert torch.equal(batch.advantages, group_zscore(torch.tensor(rewards), 3))
    loo = rollout_with(tiny, rewards, advantage_baseline="leave_one_out")
    assert torch.equal(loo.advantages, group_zscore(torch.tensor(rewards), 3, baseline="leave_one_out"))


def test_an_unknown_estimator_is_a_config_error_naming_the_registered_ones(leave_one_out):
    with pytest.raises(ConfigError) as e:
        load_config("smoke", overrides={"rollout": {"advantage_estimator": "median"}})
    assert str(e.value) == "rollout.advantage_estimator='median' is not allowed (allowed: group, toy_loo)"
    ADVANTAGE_ESTIMATORS.pop("toy_loo")
    ADVANTAGE_ESTIMATOR_NAMES.remove("toy_loo")
    with pytest.raises(ConfigError, match="allowed: group"):
        RolloutConfig(advantage_estimator="toy_loo")  # unregistered: unknown again
