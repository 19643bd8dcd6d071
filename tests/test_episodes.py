"""Multi-turn episodes (``rollout/episodes.py``): turns cut at a call's marker, environment answers appended as
ids the loss never sees, caps, metrics; the gradient on environment tokens' logits is exactly zero for every
algorithm; every algorithm trains on ``calc`` through the real loop."""

from __future__ import annotations

import re

import mlflow
import pytest
import torch

from gspo_bench import algorithms
from gspo_bench.algorithms.base import StepTrace
from gspo_bench.config import EnvConfig, load_config
from gspo_bench.core.metrics import StepStats
from gspo_bench.models.builtin import char_tokenizer
from gspo_bench.rollout.engine import Generation
from gspo_bench.rollout.episodes import as_generation, episode_stats, episodes_for, play, turn_end
from gspo_bench.rollout.producer import RolloutBatch
from gspo_bench.rollout.trajectory import collate
from gspo_bench.tasks import load_task
from gspo_bench.train.runner import run
from tests.conftest import saved_builtin, tiny_overrides
from tests.test_docs import ENV_ONLY, documented_metrics

TOK = char_tokenizer()
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class Scripted:
    """An engine stand-in: row r's turn k samples ``turns[r][k]`` (text; ``$`` = eos), its log-probs -0.1 per
    token, after checking that the context is the prompt and every segment so far, token for token."""

    def __init__(self, turns: list[list[str]]):
        self.turns, self.calls = turns, []

    def __call__(self, contexts, rows, turn, max_new):
        self.calls.append((list(rows), turn, max_new, [list(c) for c in contexts]))
        outs = [(ids(self.turns[r][turn].replace("$", "")) + ([EOS] if "$" in self.turns[r][turn] else []))[:max_new]
                for r in rows]
        T = max(len(o) for o in outs)
        P = max(len(c) for c in contexts)
        B = len(contexts)
        input_ids = torch.full((B, P + T), TOK.pad_token_id)
        attn = torch.zeros((B, P + T), dtype=torch.long)
        mask = torch.zeros((B, T))
        for b, (c, o) in enumerate(zip(contexts, outs)):
            input_ids[b, P - len(c):P] = torch.tensor(c)
            input_ids[b, P:P + len(o)] = torch.tensor(o)
            attn[b, P - len(c):P + len(o)] = 1
            mask[b, :len(o)] = 1
        # a stand-in for the MoE routes of every token the call read or wrote: its own id, on 1 layer, 1 slot
        routes = torch.where(attn.bool(), input_ids, -1)[None, :, :, None]
        return Generation(input_ids, attn, P, mask, -0.1 * mask, [""] * B, routes)


@pytest.fixture(scope="module")
def calc():
    return episodes_for(load_task("calc", 0), EnvConfig(max_turns=4, max_tool_tokens=4), TOK)


def test_a_turn_ends_at_the_first_closing_marker_or_eos():
    assert turn_end(TOK, ids("[1+2]=3]"), "]", {EOS}) == 5
    assert turn_end(TOK, ids("12") + [EOS], "]", {EOS}) is None
    assert turn_end(TOK, ids("1]2"), "]", {EOS}) == 2


def test_episodes_append_answers_as_environment_segments_token_in_token_out(calc):
    rows = [{"prompt": "24+99*13=", "answer": "1311"}, {"prompt": "1+2*3=", "answer": "7"}]
    # row 0: the solver, with tokens sampled past each call's marker (dropped); row 1: a malformed call, then
    # a wrong answer
    engine = Scripted([["[99*13]zz", "[24+1287]", "1311$"], ["[2*]", "8$"]])
    trajs = play(calc, TOK, rows, engine, max_new_tokens=48, eos=[EOS], version=3)
    t0, t1 = trajs
    assert [(s.source, TOK.decode(list(s.tokens))) for s in t0.segments] == [
        ("model", "[99*13]"), ("environment", "=128"), ("model", "[24+1287]"), ("environment", "=131"),
        ("model", "1311<eos>")]  # the answers cut to env.max_tool_tokens = 4
    assert (t0.reward, t0.finish_reason) == (1.0, "stop")
    assert t0.info == {"turns": 3, "tool_calls": 2, "tool_errors": 0, "turn_lengths": [7, 9, 5]}
    assert t0.loss_mask == [1] * 7 + [0] * 4 + [1] * 9 + [0] * 4 + [1] * 5
    assert t0.versions == [3] * 7 + [-1] * 4 + [3] * 9 + [-1] * 4 + [3] * 5
    assert t0.behaviour_logp == pytest.approx([-0.1] * 7 + [0.0] * 4 + [-0.1] * 9 + [0.0] * 4 + [-0.1] * 5)
    assert [(s.source, TOK.decode(list(s.tokens))) for s in t1.segments] == [
        ("model", "[2*]"), ("environment", "=err"), ("model", "8<eos>")]
    assert (t1.reward, t1.info["tool_errors"]) == (0.0, 1)
    # each round samples the episodes still going, from their whole history as ids
    assert [(rows_, turn) for rows_, turn, _, _ in engine.calls] == [([0, 1], 0), ([0, 1], 1), ([0], 2)]
    assert engine.calls[2][3][0] == ids("24+99*13=") + list(t0.segments[0].tokens) + list(
        t0.segments[1].tokens) + list(t0.segments[2].tokens) + list(t0.segments[3].tokens)
    stats = episode_stats(trajs, 4)
    assert stats["env/turns_mean"] == 2.5 and stats["env/tool_calls_mean"] == 1.5
    assert stats["env/tool_errors_frac"] == pytest.approx(1 / 3)
    # env tokens / response tokens, per trajectory, averaged: 8/29 and 4/10
    assert stats["env/env_tokens_frac"] == pytest.approx((8 / 29 + 4 / 10) / 2)
    assert stats["env/turn1_length_mean"] == 5.5 and stats["env/turn3_length_mean"] == 5
    gen, loss_mask = as_generation(trajs, TOK, TOK.pad_token_id)
    assert torch.equal(loss_mask[0, :29], torch.tensor(t0.loss_mask, dtype=torch.float32))
    assert gen.response_mask.sum().item() == 29 + 10
    # each token's routes come from the last round, which read every token before: in the layout, column by
    # column, they are the token's own (the stand-in's), and -1 on padding
    real = gen.attention_mask.bool()
    assert torch.equal(gen.routes[0, :, :, 0][real], gen.input_ids[real])
    assert bool((gen.routes[0, :, :, 0][~real] == -1).all())


def test_the_response_cap_counts_both_sides_and_the_turn_cap_ends_a_calling_model(calc):
    row = {"prompt": "24+99*13=", "answer": "1311"}
    [cut] = play(calc, TOK, [row], Scripted([["[99*13]", "[24+1287]", "131111111$"]]), max_new_tokens=22,
                 eos=[EOS])
    # 7 + 4 (the answer) + 9 + 2 (the answer, cut to the 2 tokens left): no room for a third turn
    assert cut.finish_reason == "length" and len(cut.response_ids) == 22 and cut.reward == 0.0
    assert cut.info["turn_lengths"] == [7, 9] and TOK.decode(list(cut.segments[-1].tokens)) == "=1"
    caller = Scripted([["[1+1]"] * 4])
    [t] = play(calc, TOK, [row], caller, max_new_tokens=48, eos=[EOS])
    assert t.finish_reason == "max_turns" and t.info["turns"] == 4 and t.reward == 0.0
    assert t.segments[-1].source == "model"  # no answer is appended after the last call


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return saved_builtin("tiny-dense", tmp_path_factory.mktemp("tiny-dense"))


@pytest.mark.parametrize("algo", algorithms.names())
def test_environment_tokens_logits_get_exactly_zero_gradient(algo, model_dir, calc):
    """The logits that predict environment tokens get a gradient of exactly 0 (and the model's tokens' do
    not), through the module's own forward and loss, with a KL to the reference and an entropy bonus on."""
    cls = algorithms.get(algo)
    cfg = load_config("smoke", overrides={"loss": {"kl_coef": 0.05, "entropy_coef": 0.01},
                                          "train": {"forward": "hf", "logit_chunk_tokens": 0}})
    rows = [{"prompt": "24+99*13=", "answer": "1311"}, {"prompt": "1+2*3=", "answer": "7"}] * 2
    engine = Scripted([["[99*13]", "[24+1287]", "1311$"], ["[2*3]", "[1+6]", "7$"],
                       ["[99*13]", "1287$"], ["[2*3]", "6$"]])
    trajs = play(calc, TOK, rows, engine, max_new_tokens=48, eos=[EOS])
    laid = collate(trajs, TOK.pad_token_id)
    B, T = laid.loss_mask.shape
    torch.manual_seed(0)
    module = cls(cfg, model_dir, 0, cfg.resolve(algo, cls.recipe, 48))
    module.manual_backward = lambda loss: loss.backward()
    rewards = torch.tensor([t.reward for t in trajs])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0]) if cls.group_advantages else None
    batch = RolloutBatch(laid.input_ids, laid.attention_mask, laid.prompt_len, laid.response_mask,
                         laid.rollout_logp, rewards, rewards, adv, [""] * B, [""] * B, loss_mask=laid.loss_mask,
                         versions=laid.versions, trajectories=trajs)
    prep = module.prepare(batch, StepStats())
    prep["old_logp"] = (prep["old_logp"] + 0.1 * torch.randn(B, T)) * laid.loss_mask
    module.trace = StepTrace(old_logp=prep["old_logp"])
    seen = []

    def keep(mod, args, out):  # the LM head's logits (B, P+T, V), their gradient kept
        if out.requires_grad:
            out.retain_grad()
            seen.append(out)

    hook = module.policy.get_output_embeddings().register_forward_hook(keep)
    try:
        assert module.minibatch_backward(batch, prep, torch.arange(B), StepStats(), None)
    finally:
        hook.remove()
    [logits] = seen
    P = laid.prompt_len
    grad_BT = logits.grad[:, P - 1:P - 1 + T].abs().amax(-1)  # the logits at P-1+t predict response token t
    env = (laid.response_mask > 0) & (laid.loss_mask == 0)
    assert env.sum() > 0 and torch.all(grad_BT[env] == 0), algo
    assert grad_BT[laid.loss_mask > 0].max() > 0, algo


def test_every_algorithm_trains_on_calc_through_the_loop(tmp_path, tracking_uri):
    o = tiny_overrides("calc", tracking_uri, rollout={"max_new_tokens": 24},
                       train={"steps": 1, "eval_every": 1, "eval_prompts": 4, "eval_samples": 1},
                       tracking={"experiment": "calc-all"})
    o["algos"] = algorithms.names()
    results = run(load_config("smoke", overrides=o), log=lambda *a: None)
    assert all(r.status == "FINISHED" for r in results), [(r.algo, r.error) for r in results if r.error]
    documented = {n for n, _ in documented_metrics() if n.startswith(ENV_ONLY)}
    client = mlflow.MlflowClient(tracking_uri)
    for r in results:
        logged = {k for k in client.get_run(r.run_id).data.metrics if k.startswith(ENV_ONLY)}
        # every env/* row of the metrics table is logged, and every env/* metric logged is in it
        assert {n for n in documented if "<" not in n} <= logged, r.algo
        assert all(k in documented or re.fullmatch(r"env/turn\d+_length_mean", k) for k in logged), logged
        assert r.last["env/turns_mean"] >= 1 and r.eval_end is not None
        # the fast engine's log-probs of the model's tokens are the trainer's recompute over the same ids
        assert r.last["mismatch/kl"] < 1e-4, (r.algo, r.last["mismatch/kl"])


def test_routing_replay_r3_replays_every_round_s_experts_on_calc(tracking_uri):
    """tiny-moe on calc under r3: the trainer's router, before any update, makes the sampler's choices on every
    token of the multi-turn trajectories (float32 on both sides), so the routes were laid out where they belong."""
    o = tiny_overrides("calc", tracking_uri, rollout={"max_new_tokens": 32}, moe={"routing_replay": "r3"},
                       train={"steps": 1, "eval_samples": 0}, tracking={"experiment": "calc-r3"})
    o["algos"], o["model"] = ["grpo"], {"name": "tiny-moe"}
    [r] = run(load_config("smoke", overrides=o), log=lambda *a: None)
    assert r.status == "FINISHED", r.error
    assert r.last["env/tool_calls_mean"] > 0 and r.last["moe/routing_mismatch"] < 0.01


@pytest.mark.parametrize("engine", ["compiled", "hf"])
def test_each_in_process_engine_plays_calc_token_in_token_out(engine, tracking_uri):
    """One RL step on calc with each engine (the fast one: every algorithm's run above). The sampler's log-probs of the model's tokens agree with the
    trainer's recompute over the same ids (``mismatch/kl``, both in float32). A context decoded and encoded
    again, or tokens laid in the wrong columns, would not."""
    o = tiny_overrides("calc", tracking_uri, rollout={"engine": engine, "max_new_tokens": 32, "correction": "tis"},
                       train={"steps": 1, "eval_samples": 0}, tracking={"experiment": f"calc-{engine}"})
    o["algos"] = ["grpo"]
    [r] = run(load_config("smoke", overrides=o), log=lambda *a: None)
    assert r.status == "FINISHED", r.error
    assert r.last["env/tool_calls_mean"] > 0 and r.last["env/env_tokens_frac"] > 0
    assert r.last["mismatch/kl"] < 1e-4, r.last["mismatch/kl"]


@pytest.mark.parametrize("algo", ["grpo", "gspo", "cispo"])
def test_micro_batches_on_multi_turn_trajectories_give_the_whole_minibatch_s_gradients(algo, model_dir, calc):
    """Trajectories of several segments, one of them truncated and masked out (``rollout.mask_truncated``), a
    token-level TIS correction on: the gradients of the minibatch backpropagated in micro-batches of at most 40
    tokens equal those of one pass."""
    cls = algorithms.get(algo)
    rows = [{"prompt": "24+99*13=", "answer": "1311"}, {"prompt": "1+2*3=", "answer": "7"}] * 2
    engine = Scripted([["[99*13]", "[24+1287]", "1311$"], ["[2*3]", "[1+6]", "7$"],
                       ["[99*13]", "1287$"], ["[2*3]", "66666666666666666666666"]])
    trajs = play(calc, TOK, rows, engine, max_new_tokens=26, eos=[EOS])
    assert [t.finish_reason for t in trajs] == ["length", "stop", "stop", "length"]
    laid = collate(trajs, TOK.pad_token_id)
    B, T = laid.loss_mask.shape
    grads = []
    for limit in (None, 40):
        cfg = load_config("smoke", overrides={"rollout": {"correction": "tis", "mask_truncated": True},
                                              "train": {"micro_batch_tokens": limit}})
        torch.manual_seed(0)
        module = cls(cfg, model_dir, 0, cfg.resolve(algo, cls.recipe, 26))
        module.manual_backward = lambda loss: loss.backward()
        rewards = torch.tensor([t.reward for t in trajs])
        batch = RolloutBatch(laid.input_ids, laid.attention_mask, laid.prompt_len, laid.response_mask,
                             laid.rollout_logp, rewards, rewards, torch.tensor([1.0, -1.0, 0.5, -0.5]), [""] * B,
                             [""] * B, loss_mask=laid.loss_mask, versions=laid.versions, trajectories=trajs,
                             truncated=torch.tensor([t.finish_reason == "length" for t in trajs]))
        prep = module.prepare(batch, StepStats())
        g = torch.Generator().manual_seed(1)
        prep["old_logp"] = (prep["old_logp"] + 0.1 * torch.randn(B, T, generator=g)) * laid.loss_mask
        assert torch.equal(prep["mask"][0], torch.zeros(T)) and prep["mask"][1].sum() > 0  # the truncated are out
        module.trace = StepTrace(old_logp=prep["old_logp"])
        assert module.minibatch_backward(batch, prep, torch.arange(B), StepStats(), None)
        grads.append({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
    whole, split = grads
    assert whole.keys() == split.keys() and whole
    for name, g in whole.items():
        assert float((split[name] - g).abs().max()) <= 1e-5 * float(g.abs().max()) + 1e-8, name
