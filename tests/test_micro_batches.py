"""Micro-batches (``train.micro_batch_tokens``, the shared RL step in ``algorithms/base.py``): one minibatch
backpropagated in parts gives the gradients (the critic's too) and every metric of the whole minibatch, for
every registered algorithm; a NaN in one part skips the whole minibatch; a bad value is one line, exit 2.
Two processes with micro-batches against one without are in ``test_distributed.py``."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_bench import algorithms
from gspo_bench.algorithms.base import StepTrace, micro_batches, minibatch_units
from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError, load_config
from gspo_bench.core.losses import LOSSES
from gspo_bench.core.metrics import StepStats
from gspo_bench.rollout.producer import RolloutBatch
from tests.conftest import nan_loss_on_call, saved_builtin
from tests.test_fastlm import grouped_batch

# the minibatch: all 8 rows of ``grouped_batch`` (groups sharing a prompt), shuffled. Rows 0-7 have prompts of
# 3, 7, 1, 5, 3, 7, 1, 3 tokens and responses of 6, 2, 1, 4, 3, 5, 2, 1; groups {0, 4, 7}, {1, 5}, {2, 6}, {3}.
# The packed forward computes a group's prompt once, so a part costs its responses plus each group's prompt once:
# the groups cost 3+6+3+1 = 13, 7+2+5 = 14, 1+1+2 = 4, 5+4 = 9.
ROWS = torch.tensor([3, 0, 5, 7, 1, 6, 2, 4])
# micro_batch_tokens -> parts. 20: {1, 5} + {2, 6} (18), {0, 4, 7} (13), {3} (9). 8: the groups over 8 go row by
# row, largest response first: [5] (12), [1] (9), [0] (9), [4, 7] (3+3+1), [3] (9), then {2, 6} (4) fits none
LIMITS = {20: 3, 8: 6}


def test_micro_batches_pack_first_fit_decreasing_under_the_limit():
    rows = torch.tensor([5, 1, 4, 0])
    # no groups: rows of 4, 4, 3 and 3 tokens under 7 make two full parts (in order, they would make three)
    parts = micro_batches(rows, 7, prompt=[1, 1, 1, 1], response=[3, 3, 2, 2])
    assert [p.tolist() for p in parts] == [[5, 4], [1, 0]]
    assert [p.tolist() for p in micro_batches(rows, 0, [1] * 4, [3] * 4)] == [rows.tolist()]  # off: one part
    assert [p.tolist() for p in micro_batches(rows, 100, [1] * 4, [3] * 4)] == [rows.tolist()]
    assert [len(p) for p in micro_batches(rows, 1, [1] * 4, [3] * 4)] == [1] * 4  # each row over the limit alone


def test_a_groups_prompt_counts_once_per_part_so_parts_hold_more_rows():
    rows = torch.arange(6) + 10
    prompt, response = [3] * 6, [2, 2, 2, 2, 5, 2]
    # groups {0, 2, 5} (3 + 6 = 9), {1, 3} (3 + 4 = 7), {4} (3 + 5 = 8): one part each under 10
    parts = micro_batches(rows, 10, prompt, response, groups=[0, 1, 0, 1, 2, 0])
    assert [p.tolist() for p in parts] == [[10, 12, 15], [14], [11, 13]]
    # every row paying its own prompt (5, 5, 5, 5, 8, 5 tokens): four parts
    assert [p.tolist() for p in micro_batches(rows, 10, prompt, response)] == [[14], [10, 11], [12, 13], [15]]


def test_a_group_fills_the_room_earlier_parts_left_rather_than_open_its_own():
    # 4 groups of 4 rows, prompts of 12 tokens, responses of 32: a group alone costs 12 + 4 x 32 = 140, so two
    # whole groups (280) never share a part of 256 and whole groups would take 4 parts, as would cutting the rows
    # in order (5 rows of 44 per part). Filled row by row: [g0 x 4, g1 x 3] (248), [g1, g2 x 4, g3] (228),
    # [g3 x 3] (108)
    groups = [g for g in range(4) for _ in range(4)]
    parts = micro_batches(torch.arange(16), 256, [12] * 16, [32] * 16, groups=groups)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15]]


def test_a_group_over_the_limit_goes_row_by_row_to_parts_that_hold_its_prompt_first():
    rows = torch.tensor([7, 8, 9, 6])
    # one group of 3 + 10 = 13 > 8. Largest response first: row 1 (3 + 4 = 7) opens a part; row 2 (3 + 3) would
    # make 10 there and opens one; row 0 (2) fits beside row 2 (8); row 3 (1) fits beside row 1 (8)
    parts = micro_batches(rows, 8, [3] * 4, [2, 4, 3, 1], groups=[0, 0, 0, 0])
    assert [p.tolist() for p in parts] == [[8, 6], [7, 9]]


def test_the_minibatch_packs_into_the_parts_its_comment_counts():
    from tests.test_fastlm import grouped_batch
    from gspo_bench.algorithms.base import part_sizes

    ids, attn, P = grouped_batch(5)
    batch = RolloutBatch(ids, attn, P, attn[:, P:].float(), None, torch.zeros(8), torch.zeros(8), None,
                         [""] * 8, [""] * 8)
    sizes = part_sizes(batch, ROWS, shared=True)
    assert sizes["prompt"] == [5, 3, 7, 3, 7, 1, 1, 3] and sizes["response"] == [4, 6, 5, 1, 2, 2, 1, 3]
    assert sizes["groups"] == [3, 0, 1, 0, 1, 2, 2, 0]
    assert [sorted(p.tolist()) for p in micro_batches(ROWS, 20, **sizes)] == [[1, 2, 5, 6], [0, 4, 7], [3]]
    assert [sorted(p.tolist()) for p in micro_batches(ROWS, 8, **sizes)] == [[5], [1], [0], [4, 7], [3], [2, 6]]
    assert len(micro_batches(ROWS, 8, **part_sizes(batch, ROWS, shared=False))) == 6  # 12, 9 x 3, then 6+2, 4+3


def test_minibatch_units_count_tokens_and_non_empty_responses():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert minibatch_units(mask) == {"token": 3.0, "sequence": 2.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return saved_builtin("tiny-dense", tmp_path_factory.mktemp("tiny-dense"))


def one_minibatch(algo: str, limit: int, model_dir: str):
    """The gradients, metrics and traced log-probs of one minibatch of every row, and the forwards it took.

    The KL to a reference, a tis correction and off-policy sequence masking are on, and the old and sampler
    log-probs are moved off the policy's, so clips bind, weights differ from 1 and some sequences are masked.
    """
    cls = algorithms.get(algo)
    cfg = load_config("smoke", overrides={"loss": {"kl_coef": 0.05},
                                          "rollout": {"correction": "tis", "opsm_threshold": 0.0},
                                          "train": {"micro_batch_tokens": limit or None}})
    ids, attn, P = grouped_batch(5)
    mask = attn[:, P:].float()
    B, T = mask.shape
    torch.manual_seed(0)
    module = cls(cfg, model_dir, 0, cfg.resolve(algo, cls.recipe, T))
    if algo == "ppo":  # a nonzero value head, so the critic's trunk has a gradient too
        torch.nn.init.normal_(module.critic.head.weight, std=0.5)
    module.manual_backward = lambda loss: loss.backward()  # no Trainer here: a plain backward
    forwards, real_forward = [], module.minibatch_forward

    def counted_forward(batch, prep, rows, accumulate=False):
        forwards.append(len(rows))
        return real_forward(batch, prep, rows, accumulate)

    module.minibatch_forward = counted_forward
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    adv = torch.randn(B) if cls.group_advantages else None
    batch = RolloutBatch(ids, attn, P, mask, None, rewards, rewards, adv, [""] * B, [""] * B)
    prep = module.prepare(batch, StepStats())
    prep["old_logp"] = (prep["old_logp"] + 0.2 * torch.randn(B, T)) * mask
    batch.rollout_logp = (prep["old_logp"] + 0.2 * torch.randn(B, T)) * mask
    module.trace = StepTrace(old_logp=prep["old_logp"])
    stats = StepStats()
    finite = module.minibatch_backward(batch, prep, ROWS, stats, None)
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return finite, grads, stats.reduce(), module.trace.minibatches, forwards


# clip_cov and kl_cov pick tokens from the whole minibatch's statistics: they refuse micro-batches (a test below)
@pytest.mark.parametrize("algo", [n for n, s in LOSSES.items() if not s.minibatch_wide])
def test_micro_batches_give_the_whole_minibatchs_gradients_and_metrics(algo, model_dir):
    finite, grads, metrics, trace, forwards = one_minibatch(algo, 0, model_dir)
    assert finite and forwards == [len(ROWS)]
    assert {"train/loss", "loss/policy", "loss/kl", "clip/frac", "ratio/token_log_std", "ratio/seq_max",
            "mismatch/is_weight_mean", "mismatch/opsm_frac", "policy/entropy"} <= set(metrics)
    assert metrics["ratio/min"] < 0.9 and metrics["ratio/max"] > 1.1  # the ratios have left 1
    if algo == "ppo":
        assert "critic/value_loss" in metrics
        assert any(n.startswith("critic.trunk.") and g.abs().max() > 0 for n, g in grads.items())
    assert any(n.startswith("policy.") and g.abs().max() > 0 for n, g in grads.items())
    for limit, n_parts in LIMITS.items():
        ok, split, split_metrics, split_trace, split_forwards = one_minibatch(algo, limit, model_dir)
        assert ok and len(split_forwards) == n_parts, split_forwards
        assert split.keys() == grads.keys()
        for name, g in grads.items():
            gap = float((split[name] - g).abs().max())
            assert gap <= 1e-5 * float(g.abs().max()) + 1e-8, f"{name}: {gap:.2e} off at {limit} tokens"
        assert split_metrics.keys() == metrics.keys()
        for key, value in metrics.items():
            # float32 rounding of forwards of other batch shapes, through a sequence's exp(sum of log-ratios)
            # (vespo, gmpo): 1.5e-5 relative measured on one thread
            assert split_metrics[key] == pytest.approx(value, rel=5e-5, abs=1e-7), key
        [(rows, logp)], [(split_rows, split_logp)] = trace, split_trace
        assert torch.equal(rows, ROWS) and sorted(split_rows.tolist()) == sorted(rows.tolist())
        # the trace pairs each row with its own log-probs, in whatever order the parts took them
        back = {r: i for i, r in enumerate(split_rows.tolist())}
        torch.testing.assert_close(split_logp[[back[r] for r in rows.tolist()]], logp, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return saved_builtin("tiny-moe", tmp_path_factory.mktemp("tiny-moe"))


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_micro_batches_on_an_moe_model_give_the_whole_minibatchs_gradients(algo, moe_dir):
    """The parts after the first add the experts' stacked weight gradients into .grad expert by expert
    (core/accumulate.py): the sum is the one pass's, for the experts, the routers and the rest."""
    finite, grads, _, _, forwards = one_minibatch(algo, 0, moe_dir)
    assert finite and forwards == [len(ROWS)]
    experts = [n for n, g in grads.items() if ".experts." in n]
    assert experts and all(grads[n].dim() == 3 and grads[n].abs().max() > 0 for n in experts)
    ok, split, _, _, split_forwards = one_minibatch(algo, 8, moe_dir)
    assert ok and len(split_forwards) == LIMITS[8] and split.keys() == grads.keys()
    for name, g in grads.items():
        gap = float((split[name] - g).abs().max())
        assert gap <= 1e-5 * float(g.abs().max()) + 1e-8, f"{name}: {gap:.2e} off in {LIMITS[8]} parts"


def test_a_nan_in_one_micro_batch_skips_the_whole_minibatch(model_dir, monkeypatch):
    """The second of three parts has a NaN loss: the first part's gradient is dropped, the third is not
    backpropagated, and the minibatch's loss reads NaN."""
    nan_loss_on_call(monkeypatch, 2)
    finite, grads, metrics, _, forwards = one_minibatch("grpo", 20, model_dir)
    assert not finite and len(forwards) == 3
    assert grads == {}  # nothing left for clip_and_step, which then skips the step
    assert math.isnan(metrics["train/loss"])


@pytest.mark.parametrize("value, needle", [("-1", "train.micro_batch_tokens=-1 must be an int >= 1, or null (off)"),
                                           ("0", "train.micro_batch_tokens=0 must be an int >= 1, or null (off)"),
                                           ("1.5", "train.micro_batch_tokens takes int or null, got float 1.5"),
                                           ("many", "train.micro_batch_tokens takes int or null, got str 'many'"),
                                           ("true", "train.micro_batch_tokens takes int or null, got bool True")])
def test_a_bad_micro_batch_tokens_is_one_line_exit_2(value, needle, tmp_path, capsys):
    code = main(["run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress",
                 "--set", f"train.micro_batch_tokens={value}"])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and len(text.splitlines()) == 1 and "error" in text and needle in text, text
    assert not (tmp_path / "m.db").exists()


def test_micro_batches_refuse_fsdp_and_take_null_as_off():
    assert load_config("smoke").train.micro_batch_tokens is None
    assert load_config("smoke", overrides={"train": {"micro_batch_tokens": 512}}).train.micro_batch_tokens == 512
    assert load_config("smoke", overrides={"train": {"micro_batch_tokens": None}}).train.micro_batch_tokens is None
    for bad in (0, -8, 2.5, True):  # what a config file can hold, checked where the dataclass is built
        with pytest.raises(ConfigError, match="train.micro_batch_tokens=.* must be an int >= 1, or null"):
            load_config("smoke", overrides={"train": {"micro_batch_tokens": bad}})
    with pytest.raises(ConfigError, match="micro_batch_tokens needs one process or --strategy ddp"):
        load_config("smoke", overrides={"train": {"micro_batch_tokens": 512, "strategy": "fsdp"}})


@pytest.mark.parametrize("model_name, replay", [("tiny-dense", "none"), ("tiny-moe", "r3"), ("tiny-moe", "r2")])
def test_the_recompute_and_reference_passes_run_in_micro_batches_with_the_same_log_probs(tmp_path, model_name,
                                                                                       replay):
    """``prepare``'s passes over the whole rollout (old log-probs, the reference's, the router's own routes) go
    part by part under ``train.micro_batch_tokens``, each part no larger than the update's, with the log-probs
    and routes of the all-at-once pass."""
    from gspo_bench.rollout.routing import empty_grid

    saved_builtin(model_name, tmp_path)
    ids, attn, P = grouped_batch(5)
    mask = attn[:, P:].float()
    B, T = mask.shape
    results = {}
    for limit in (0, 8):
        cls = algorithms.get("grpo")
        cfg = load_config("smoke", overrides={"loss": {"kl_coef": 0.05}, "moe": {"routing_replay": replay},
                                              "rollout": {"old_logp_source": "recompute"},
                                              "train": {"micro_batch_tokens": limit or None}})
        torch.manual_seed(0)
        module = cls(cfg, str(tmp_path), 0, cfg.resolve("grpo", cls.recipe, T))
        seen, real = [], module.response_logp

        def counted(model, batch, rows=None, **kw):
            seen.append(len(batch) if rows is None else len(rows))
            return real(model, batch, rows=rows, **kw)

        module.response_logp = counted
        routes = None
        if replay == "r3":  # the sampler's experts: random, so replaying them differs from the router's own
            routes = empty_grid(module.policy, B, ids.shape[1])
            routes.random_(0, module.policy.config.num_experts)
        batch = RolloutBatch(ids, attn, P, mask, None, torch.zeros(B), torch.zeros(B), torch.randn(B),
                             [""] * B, [""] * B, routes=routes)
        prep = module.prepare(batch, StepStats())
        results[limit] = (prep, seen)
    (whole, seen_whole), (parts, seen_parts) = results[0], results[8]
    assert seen_whole == [B] * len(seen_whole)
    assert len(seen_parts) == 6 * len(seen_whole) and max(seen_parts) < B  # every pass in 6 parts (LIMITS)
    for key in ("old_logp", "ref_logp"):
        torch.testing.assert_close(parts[key], whole[key], atol=1e-5, rtol=1e-5)
    if replay != "none":
        assert torch.equal(parts["routes"], whole["routes"])


def test_a_part_on_the_transformers_path_runs_only_to_its_own_longest_row(model_dir):
    """``train.forward=hf`` (padded rows): a part of the rollout whose rows are all shorter than its longest
    runs over fewer columns, with the log-probs, entropy and gradients of the rollout-wide width, padded back to
    (b, T) with zeros."""
    cls = algorithms.get("grpo")
    cfg = load_config("smoke", overrides={"train": {"forward": "hf"}})
    ids, attn, P = grouped_batch(5)
    mask = attn[:, P:].float()
    B, T = mask.shape
    module = cls(cfg, model_dir, 0, cfg.resolve("grpo", cls.recipe, T))
    batch = RolloutBatch(ids, attn, P, mask, None, torch.zeros(B), torch.zeros(B), torch.randn(B), [""] * B,
                         [""] * B)
    short = (mask.sum(-1) < mask.sum(-1).max()).nonzero()[:, 0]  # every row but the longest
    widths = []  # the columns each forward of the decoder stack takes
    module.policy.base_model.register_forward_pre_hook(
        lambda _, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    logp, ent = module.response_logp(module.policy, batch, short, with_entropy=True, entropy_grad=True)
    assert logp.shape == ent.shape == (len(short), T)
    longest = int(mask[short].sum(-1).max())
    assert widths == [P + longest]  # the part's own length, not the rollout's P + T
    assert torch.equal(logp[:, longest:], torch.zeros(len(short), T - longest))
    (logp.sum() + ent.sum()).backward()
    trimmed = {n: p.grad.clone() for n, p in module.policy.named_parameters()}
    module.policy.zero_grad(set_to_none=True)
    # the same rows at the rollout's full width, straight through the engine's forward
    from gspo_bench.rollout.engine import response_logp

    full_logp, full_ent = response_logp(module.policy, ids[short], attn[short], P, with_entropy=True, forward="hf",
                                        entropy_grad=True)
    assert widths[-1] == P + T
    torch.testing.assert_close(logp, full_logp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, full_ent, rtol=1e-5, atol=1e-6)
    (full_logp.sum() + full_ent.sum()).backward()
    for n, p in module.policy.named_parameters():
        torch.testing.assert_close(trimmed[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
