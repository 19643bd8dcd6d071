"""The rollout datamodule: sampling, merging, shaping, filtering, advantages (gspo_bench.rollout.datamodule)."""

from __future__ import annotations

import re
import statistics

import pytest
import torch

from gspo_bench.config import RolloutConfig
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.rollout.producer import merge_generations, select
from gspo_bench.rollout.engine import Generation, forward_response, left_padded
from gspo_bench.rollout.engines import Capabilities, InProcessEngine
from gspo_bench.models import build_builtin
from gspo_bench.tasks import SingleTurn, Task, TaskSpec, generate_arith


@pytest.fixture(scope="module")
def policy():
    model, tok = build_builtin("tiny-dense", 0)
    return model.eval(), tok


@pytest.fixture(scope="module")
def task():
    train, eval_ = generate_arith(0, min_digits=1, max_digits=2, n_train=200, n_eval=16)
    return Task(TaskSpec(name="arith-small", kind="arith"), train, eval_)


class Scripted(InProcessEngine):
    """An engine that hands back what ``fn(engine, model, tokenizer, prompts, **kw)`` makes (a hand-made
    generation)."""

    name = "scripted"
    capabilities = Capabilities(free_logp=False, records_routes=False)

    def __init__(self, fn):
        self.fn = fn

    def sample(self, model, tokenizer, prompts, **kw):
        return self.fn(self, model, tokenizer, prompts, **kw)


def make_dm(task, policy, seed=0, eval_samples=0, sampler=None, model_dir=None, resume=None, **kw):
    """``sampler``: an engine object to sample with (default: the ``engine`` named in ``kw``, hf)."""
    model, tok = policy
    # a resolved rollout config (no auto left), on transformers' generate
    s = dict(prompts_per_step=2, group_size=3, max_new_tokens=4, temperature=1.0, engine="hf",
             dynamic_sampling=False, overlong_buffer=None, advantage_scale="group")
    s.update(kw)
    return RolloutDataModule(task, tok, RolloutConfig(**s), steps=3, seed=seed, policy=model, eval_prompts=8,
                             eval_samples=eval_samples, engine=sampler, model_dir=model_dir, resume=resume)


def scripted(*rounds):
    """A stand-in for ``score`` that returns the given rewards, one list per generation round."""
    calls = []

    def score(texts, answers):
        r = rounds[len(calls)]
        assert len(r) == len(texts) == len(answers)
        calls.append(list(texts))
        return torch.tensor(r, dtype=torch.float32)

    score.calls = calls
    return score


def zscore_by_hand(rewards, G):
    out = []
    for i in range(0, len(rewards), G):
        g = rewards[i : i + G]
        mu, sd = statistics.fmean(g), statistics.pstdev(g)
        out += [(r - mu) / (sd + 1e-6) for r in g]
    return out


def prompts_of(tok, batch):
    return tok.batch_decode(batch.input_ids[:, : batch.prompt_len], skip_special_tokens=True)


def responses_of(tok, ids, mask, P):
    return [tok.decode([t for t, m in zip(r, mk) if m], skip_special_tokens=True)
            for r, mk in zip(ids[:, P:].tolist(), mask.tolist())]


# ----------------------------------------------------------------------------- merge_generations


def hand_generation(tok, prompts, responses, masks, logp):
    """``prompts``: text, or the token ids an engine is handed."""
    enc = left_padded(prompts, tok.pad_token_id) if prompts and not isinstance(prompts[0], str) else tok(
        prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    resp = torch.tensor(responses)
    rmask = torch.tensor(masks, dtype=torch.float32)
    return Generation(
        input_ids=torch.cat([enc["input_ids"], resp], 1),
        attention_mask=torch.cat([enc["attention_mask"], rmask.long()], 1),
        prompt_len=enc["input_ids"].shape[1],
        response_mask=rmask,
        rollout_logp=None if logp is None else torch.tensor(logp),
        texts=[tok.decode([t for t, m in zip(r, mk) if m], skip_special_tokens=True)
               for r, mk in zip(responses, masks)],
    )


def ids(tok, s):
    return tok(s, add_special_tokens=False)["input_ids"]


@pytest.fixture
def two_gens(policy):
    _, tok = policy
    E, PAD = tok.eos_token_id, tok.pad_token_id
    a = hand_generation(tok, ["1+2=", "3="], [[*ids(tok, "3"), E], ids(tok, "xy")], [[1, 1], [1, 1]],
                        [[-0.1, -0.2], [-0.3, -0.4]])
    b = hand_generation(tok, ["10+20=", "4+4="], [[*ids(tok, "30"), E], [*ids(tok, "8"), E, PAD]],
                        [[1, 1, 1], [1, 1, 0]], [[-1.0, -2.0, -3.0], [-4.0, -5.0, 0.0]])
    return a, b


def test_merge_generations_keeps_every_row(policy, two_gens):
    _, tok = policy
    a, b = two_gens
    assert (a.prompt_len, a.response_mask.shape[1], b.prompt_len, b.response_mask.shape[1]) == (4, 2, 6, 3)
    m = merge_generations([a, b], tok.pad_token_id)
    assert m.prompt_len == 6
    assert m.input_ids.shape == m.attention_mask.shape == (4, 9)
    assert m.response_mask.tolist() == [[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]]
    assert m.texts == ["3", "xy", "30", "8"]
    # the prompt block is what the tokenizer gives for all four prompts padded together
    all_prompts = ["1+2=", "3=", "10+20=", "4+4="]
    enc = tok(all_prompts, padding=True, add_special_tokens=False)
    assert m.input_ids[:, :6].tolist() == enc["input_ids"]
    assert m.attention_mask[:, :6].tolist() == enc["attention_mask"]
    assert m.attention_mask[:, 6:].tolist() == m.response_mask.long().tolist()
    assert tok.batch_decode(m.input_ids[:, :6], skip_special_tokens=True) == all_prompts
    assert responses_of(tok, m.input_ids, m.response_mask, 6) == ["3", "xy", "30", "8"]
    # responses are right-padded with pad
    assert m.input_ids[0, 6:].tolist() == [*ids(tok, "3"), tok.eos_token_id, tok.pad_token_id]
    assert m.input_ids[1, 6:].tolist() == [*ids(tok, "xy"), tok.pad_token_id]
    assert torch.equal(m.rollout_logp, torch.tensor(
        [[-0.1, -0.2, 0.0], [-0.3, -0.4, 0.0], [-1.0, -2.0, -3.0], [-4.0, -5.0, 0.0]]))


def test_merge_generations_logp_none_and_single(policy, two_gens):
    _, tok = policy
    a, b = two_gens
    b_none = Generation(b.input_ids, b.attention_mask, b.prompt_len, b.response_mask, None, b.texts)
    assert merge_generations([a, b_none], tok.pad_token_id).rollout_logp is None
    assert merge_generations([a], tok.pad_token_id) is a


def test_merged_rows_score_like_the_originals(policy, two_gens):
    # extra left padding must not change a row's log-probs (position ids follow the attention mask)
    model, tok = policy
    a, b = two_gens
    m = merge_generations([a, b], tok.pad_token_id)
    with torch.no_grad():
        la, _, _ = forward_response(model, a.input_ids, a.attention_mask, a.prompt_len)
        lb, _, _ = forward_response(model, b.input_ids, b.attention_mask, b.prompt_len)
        lm, _, _ = forward_response(model, m.input_ids, m.attention_mask, m.prompt_len)
    assert torch.allclose(lm[:2, :2] * m.response_mask[:2, :2], la * a.response_mask, atol=1e-5)
    assert torch.allclose(lm[2:] * m.response_mask[2:], lb * b.response_mask, atol=1e-5)


def test_select_rows(policy, two_gens):
    a, _ = two_gens
    s = select(a, torch.tensor([1]))
    assert s.texts == ["xy"] and s.input_ids.tolist() == a.input_ids[1:].tolist()
    assert torch.equal(s.rollout_logp, torch.tensor([[-0.3, -0.4]]))


# ----------------------------------------------------------------------------- scoring


def test_score_uses_the_task_verifier(task, policy):
    dm = make_dm(task, policy)
    got = dm.score(["5", " 7 \n", "x", ""], ["5", "7", "8", "0"])
    assert got.dtype == torch.float32
    assert got.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_score_goes_through_the_tasks_single_turn_environment(task, policy, monkeypatch):
    dm = make_dm(task, policy)
    assert isinstance(dm.producer.environment, SingleTurn) and dm.producer.environment.task is task
    asked = []

    def score(completions, answers, timeout):
        asked.append(timeout)
        return [0.0, 0.75], 1  # one completion past its time limit

    monkeypatch.setattr(dm.producer.environment, "score", score)
    assert dm.score(["a", "b"], ["1", "2"]).tolist() == [0.0, 0.75]
    assert asked == [dm.s.verify_timeout] and dm.timeouts == 1  # counted for verify/timeouts


# ----------------------------------------------------------------------------- rollout


def test_rollout_needs_a_policy(task, policy):
    _, tok = policy
    dm = RolloutDataModule(task, tok, RolloutConfig(2, 2, 4, engine="hf"), steps=1, seed=0)
    with pytest.raises(RuntimeError, match="policy"):
        dm.rollout(0)


def test_rollout_shapes_rewards_and_group_zscore(task, policy):
    model, tok = policy
    dm = make_dm(task, policy, old_logp_source="rollout")
    fake = [1.0, 0.0, 0.0, 0.5, 2.0, 3.5]
    dm.producer.score = scripted(fake)
    torch.manual_seed(0)
    batch = dm.rollout(1)
    B = 2 * 3
    assert len(batch) == B
    P, T = batch.prompt_len, batch.response_mask.shape[1]
    assert T <= 4
    assert batch.input_ids.shape == batch.attention_mask.shape == (B, P + T)
    assert batch.rollout_logp.shape == (B, T)
    assert batch.scores.tolist() == fake and batch.rewards.tolist() == fake
    assert batch.advantages.tolist() == pytest.approx(zscore_by_hand(fake, 3), abs=1e-5)
    # by hand: group 0 = [1, 0, 0] -> [sqrt2, -1/sqrt2, -1/sqrt2]; group 1 = [0.5, 2, 3.5] -> [-sqrt1.5, 0, sqrt1.5]
    assert batch.advantages.tolist() == pytest.approx([2 ** 0.5, -(0.5 ** 0.5), -(0.5 ** 0.5),
                                                       -(1.5 ** 0.5), 0.0, 1.5 ** 0.5], abs=1e-5)
    # the scorer saw the batch's texts, and each group is G samples of one prompt with its answer
    assert dm.producer.score.calls == [batch.texts]
    prompts = prompts_of(tok, batch)
    want = [r["prompt"] for r in dm.producer.prompts_for(1, 0)[0] for _ in range(3)]
    assert prompts == want
    for p, a in zip(prompts, batch.answers):
        x, y = map(int, re.match(r"(\d+)\+(\d+)=$", p).groups())
        assert a == str(x + y)
    assert responses_of(tok, batch.input_ids, batch.response_mask, P) == batch.texts
    # stats agree with the batch
    assert batch.stats["reward/mean"] == pytest.approx(sum(fake) / 6)
    assert batch.stats["response/length_mean"] == pytest.approx(float(batch.response_mask.sum(-1).mean()))
    assert "dynamic/dropped_groups" not in batch.stats
    # a training pass can differentiate through the batch (no inference tensors leak out)
    logp, _, _ = forward_response(model, batch.input_ids, batch.attention_mask, P)
    (logp * batch.response_mask).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_rollout_dr_grpo_scale_none(task, policy):
    dm = make_dm(task, policy, advantage_scale="none", max_new_tokens=2)
    dm.producer.score = scripted([1.0, 0.0, 0.0, 0.5, 2.0, 3.5])
    batch = dm.rollout(0)
    assert batch.advantages.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1.5, 0.0, 1.5], abs=1e-6)


def test_prompts_depend_only_on_seed_and_step(task, policy):
    _, tok = policy
    a, b, c = make_dm(task, policy, seed=5), make_dm(task, policy, seed=5), make_dm(task, policy, seed=6)
    for step in range(3):
        assert a.producer.prompts_for(step, 0) == b.producer.prompts_for(step, 0)
    assert a.producer.prompts_for(0, 0) != a.producer.prompts_for(1, 0)
    assert a.producer.prompts_for(0, 0) != c.producer.prompts_for(0, 0)
    # and through a real rollout of two separate datamodules (different sampling RNG state)
    for dm in (a, b):
        dm.producer.score = scripted([0.0] * 6)
    torch.manual_seed(0)
    ba = a.rollout(2)
    torch.manual_seed(1)
    bb = b.rollout(2)
    assert prompts_of(tok, ba) == prompts_of(tok, bb)
    assert ba.answers == bb.answers


def test_dynamic_sampling_drops_degenerate_groups(task, policy):
    _, tok = policy
    dm = make_dm(task, policy, group_size=4, max_new_tokens=3, dynamic_sampling=True, max_gen_batches=3)
    dm.producer.score = scripted(
        [1, 1, 1, 1, 1, 0, 0, 0],  # round 0: group 0 all equal (dropped), group 1 kept
        [0, 0, 0, 0, 0, 0, 0, 0],  # round 1: both dropped
        [0, 1, 0, 1, 1, 1, 1, 1],  # round 2: group 0 kept, fills the batch; group 1 dropped
    )
    batch = dm.rollout(0)
    assert len(dm.producer.score.calls) == 3
    assert len(batch) == 8
    assert batch.scores.tolist() == [1, 0, 0, 0, 0, 1, 0, 1]
    assert batch.advantages.tolist() == pytest.approx(zscore_by_hand([1, 0, 0, 0, 0, 1, 0, 1], 4), abs=1e-5)
    assert batch.stats["dynamic/dropped_groups"] == 4.0
    assert batch.stats["dynamic/gen_batches"] == 3.0
    assert batch.stats["dynamic/kept_groups"] == 2.0
    # reward/mean is over everything sampled (24 completions, 11 ones)
    assert batch.stats["reward/mean"] == pytest.approx(11 / 24)
    # the kept rows are round 0's second prompt and round 2's first, with their own texts
    want = [dm.producer.prompts_for(0, 0)[0][1]["prompt"]] * 4 + [dm.producer.prompts_for(0, 2)[0][0]["prompt"]] * 4
    assert prompts_of(tok, batch) == want
    assert batch.texts == dm.producer.score.calls[0][4:] + dm.producer.score.calls[2][:4]
    assert responses_of(tok, batch.input_ids, batch.response_mask, batch.prompt_len) == batch.texts


def test_dynamic_sampling_stops_once_full(task, policy):
    dm = make_dm(task, policy, group_size=2, max_new_tokens=2, dynamic_sampling=True, max_gen_batches=4)
    dm.producer.score = scripted([1, 0, 0, 1])
    batch = dm.rollout(0)
    assert len(dm.producer.score.calls) == 1
    assert batch.stats["dynamic/dropped_groups"] == 0.0 and batch.stats["dynamic/gen_batches"] == 1.0
    assert batch.advantages.tolist() == pytest.approx([1, -1, -1, 1], abs=1e-5)


def test_dynamic_sampling_tops_up_on_the_last_round(task, policy):
    dm = make_dm(task, policy, group_size=4, max_new_tokens=2, dynamic_sampling=True, max_gen_batches=2)
    dm.producer.score = scripted([1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 1, 0])
    batch = dm.rollout(0)
    # the batch is still full: the last round's degenerate group fills the gap
    assert len(batch) == 8
    assert batch.scores.tolist() == [1, 1, 1, 1, 1, 0, 1, 0]
    assert batch.advantages.tolist() == pytest.approx([0, 0, 0, 0, 1, -1, 1, -1], abs=1e-5)
    assert batch.stats["dynamic/kept_groups"] == 2.0 and batch.stats["dynamic/gen_batches"] == 2.0


def test_dynamic_sampling_topped_up_group_is_not_counted_as_dropped(task, policy):
    dm = make_dm(task, policy, group_size=4, max_new_tokens=2, dynamic_sampling=True, max_gen_batches=2)
    dm.producer.score = scripted([1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 1, 0])
    batch = dm.rollout(0)
    # round 0 drops two groups; round 1's degenerate group is trained on, so it was not dropped
    assert batch.stats["dynamic/dropped_groups"] == 2.0


def test_overlong_shaping(task, policy):
    dm = make_dm(task, policy, group_size=3, max_new_tokens=4, overlong_buffer=3, overlong_penalty=0.5)
    fake = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    dm.producer.score = scripted(fake)
    torch.manual_seed(0)
    batch = dm.rollout(0)
    lengths = batch.response_mask.sum(-1).tolist()
    # penalty = min(0, -(L - (4 - 3)) / 3) * 0.5: 0 for L <= 1, -1/6 at 2, -1/3 at 3, -1/2 at 4
    pen = [min(0.0, -(L - 1) / 3) * 0.5 for L in lengths]
    assert any(p < 0 for p in pen)
    assert batch.scores.tolist() == fake
    assert batch.rewards.tolist() == pytest.approx([s + p for s, p in zip(fake, pen)], abs=1e-6)
    assert batch.advantages.tolist() == pytest.approx(zscore_by_hand(batch.rewards.tolist(), 3), abs=1e-4)
    assert batch.stats["reward/shaped_mean"] == pytest.approx(sum(fake) / 6 + sum(pen) / 6, abs=1e-6)


# ----------------------------------------------------------------------------- evaluation


def test_evaluate_pass1_and_sampled_reward(task, policy):
    from gspo_bench.rollout.engine import hf_generate

    model, tok = policy
    dm = make_dm(task, policy, eval_samples=2)
    prompts = ["1+2=", "40+5=", "9+9="]
    greedy = hf_generate(model, tok, prompts, max_new_tokens=4, greedy=True).texts
    # make the first and last answers exactly what greedy decoding says, the middle one impossible
    answers = [greedy[0], "not-a-number", greedy[2]]
    out = dm.evaluator.evaluate(dm, model, {"prompt": prompts, "answer": answers})
    assert out["pass1"].shape == (3,)
    assert out["pass1"].tolist() == [1.0, 0.0, 1.0]
    assert out["reward"].shape == (6,)
    assert set(out["reward"].tolist()) <= {0.0, 1.0}
    # sampled pass@1: a sample counts when it fully verifies (here the same as the 0/1 reward)
    assert out["pass1_sampled"].tolist() == out["reward"].tolist()
    # under partial credit the mean reward and the sampled pass@1 part ways
    dm.producer.score = lambda texts, answers: torch.tensor([0.5, 1.0] * (len(texts) // 2))
    part = dm.evaluator.evaluate(dm, model, {"prompt": prompts, "answer": answers})
    assert part["reward"].mean().item() == 0.75 and part["pass1_sampled"].mean().item() == 0.5

    dm0 = make_dm(task, policy, eval_samples=0)
    out0 = dm0.evaluator.evaluate(dm0, model, {"prompt": prompts, "answer": answers})
    assert set(out0) == {"pass1"} and out0["pass1"].tolist() == [1.0, 0.0, 1.0]


def test_the_evaluator_batches_the_eval_rows(task, policy):
    model, tok = policy
    dm = RolloutDataModule(task, tok, RolloutConfig(2, 2, 4, engine="hf", dynamic_sampling=False, overlong_buffer=None), steps=1, seed=0, eval_prompts=5, eval_batch=2)
    batches = list(dm.evaluator.batches())
    assert [len(b["prompt"]) for b in batches] == [2, 2, 1]
    assert sum((b["prompt"] for b in batches), []) == list(task.eval["prompt"])[:5]
    assert sum((b["answer"] for b in batches), []) == list(task.eval["answer"])[:5]


def test_truncated_frac_counts_only_responses_without_eos(task, policy):
    _, tok = policy
    E, PAD = tok.eos_token_id, tok.pad_token_id

    def fake_generate(engine, model, tokenizer, prompts, **kw):
        assert len(prompts) == 3 and kw["max_new_tokens"] == 3
        return hand_generation(tok, prompts,
                               [[*ids(tok, "12"), E], ids(tok, "123"), [*ids(tok, "1"), E, PAD]],
                               [[1, 1, 1], [1, 1, 1], [1, 1, 0]], None)

    dm = make_dm(task, policy, prompts_per_step=1, group_size=3, max_new_tokens=3, sampler=Scripted(fake_generate))
    dm.producer.score = scripted([1.0, 0.0, 0.0])
    batch = dm.rollout(0)
    assert batch.texts == ["12", "123", "1"]
    # only the middle response hit the cap without finishing
    assert batch.stats["response/truncated_frac"] == pytest.approx(1 / 3)


def test_length_means_split_by_correctness(task, policy):
    _, tok = policy
    E, PAD = tok.eos_token_id, tok.pad_token_id

    def fake_generate(engine, model, tokenizer, prompts, **kw):
        # response lengths 3, 1, 2, 3
        return hand_generation(tok, prompts,
                               [[*ids(tok, "12"), E], [E, PAD, PAD], [*ids(tok, "1"), E, PAD], ids(tok, "123")],
                               [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], None)

    dm = make_dm(task, policy, prompts_per_step=1, group_size=4, max_new_tokens=3, sampler=Scripted(fake_generate))
    # correct = score >= 1: the first two; partial credit (0.5) counts as wrong
    dm.producer.score = scripted([1.0, 1.0, 0.5, 0.0])
    stats = dm.rollout(0).stats
    assert stats["response/length_mean"] == pytest.approx(9 / 4)
    # by hand: correct (3 + 1) / 2 = 2, wrong (2 + 3) / 2 = 2.5
    assert stats["response/length_correct_mean"] == pytest.approx(2.0)
    assert stats["response/length_wrong_mean"] == pytest.approx(2.5)
    # a step with no correct response leaves that key out (no NaN logged); the wrong mean is the overall one
    dm.producer.score = scripted([0.0, 0.5, 0.0, 0.99])
    stats = dm.rollout(1).stats
    assert "response/length_correct_mean" not in stats
    assert stats["response/length_wrong_mean"] == pytest.approx(9 / 4) == stats["response/length_mean"]
    # and one with no wrong response leaves the other out
    dm.producer.score = scripted([1.0, 1.0, 1.0, 1.0])
    stats = dm.rollout(2).stats
    assert "response/length_wrong_mean" not in stats
    assert stats["response/length_correct_mean"] == pytest.approx(9 / 4)
    assert all(v == v for v in stats.values())


def test_truncation_counts_every_eos_id_the_engine_stops_on(task, policy):
    # a model whose generation config ends a response on two ids: "9" ends it as eos does
    import copy

    model, tok = policy
    model = copy.deepcopy(model)
    nine = ids(tok, "9")[0]
    model.generation_config.eos_token_id = [tok.eos_token_id, nine]

    def fake_generate(engine, model, tokenizer, prompts, **kw):
        return hand_generation(tok, prompts, [[*ids(tok, "12"), nine], ids(tok, "123"), ids(tok, "129")],
                               [[1, 1, 1], [1, 1, 1], [1, 1, 1]], None)

    dm = make_dm(task, (model, tok), prompts_per_step=1, group_size=3, max_new_tokens=3,
                 sampler=Scripted(fake_generate))
    dm.producer.score = scripted([1.0, 0.0, 0.0])
    # rows 0 and 2 stopped on "9", an eos of this model: only row 1 was truncated
    assert dm.rollout(0).stats["response/truncated_frac"] == pytest.approx(1 / 3)


def test_an_algorithm_with_its_own_advantages_gets_none_from_the_rollout(task, policy):
    dm = make_dm(task, policy)
    dm.producer.group_advantages = False  # what PPO (GAE over its critic) sets
    batch = dm.rollout(0)
    assert batch.advantages is None and batch.rows(slice(0, 2)).advantages is None
    dm.producer.group_advantages = True
    assert dm.rollout(0).advantages.shape == (6,)


def test_the_vllm_engine_is_sized_for_the_tasks_longest_prompt_not_the_models_context(task, policy, monkeypatch,
                                                                                       tmp_path):
    """A model with Qwen3-0.6B's 40,960 positions: vLLM on a CPU would refuse a max_model_len that large (its KV
    cache outgrows the budget), so the engine gets the longest prompt of the task's rows plus max_new_tokens."""
    import copy

    from gspo_bench.rollout import vllm_engine

    got = {}
    monkeypatch.setattr(vllm_engine, "lease", lambda folder, **kw: got.update(kw))  # what builds it
    model, tok = policy
    wide = copy.copy(model.config)
    wide.max_position_embeddings = 40_960
    monkeypatch.setattr(model, "config", wide)
    dm = make_dm(task, policy, engine="vllm", max_new_tokens=7, model_dir=str(tmp_path))  # no copy saved for it
    dm.producer.handle.get(dm.policy).build(model, tok)
    prompts = [*task.train["prompt"], *task.eval["prompt"]]
    longest = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert 4 <= longest <= 6 and got["max_model_len"] == longest + 7


def test_resume_state_goes_in_through_load_state_dict(task, policy):
    from gspo_bench.core.rng import rng_state

    dm = make_dm(task, policy)
    dm.rollout(0)  # the stream has started: the checkpoint holds where it stands
    dm.producer.timeouts = 2
    state = {**dm.state_dict(), "rl_step": 2, "rng": rng_state()}
    assert set(dm.state_dict()) == {"sampler", "verify_timeouts", "draws"}
    fresh = make_dm(task, policy, resume=state)  # handed over at construction, loaded in its own setup
    assert (fresh.start_step, fresh.timeouts, fresh.resume_rng) == (0, 0, None)
    fresh.setup("fit")
    assert (fresh.start_step, fresh.timeouts, fresh.resume_rng) == (2, 2, state["rng"])
    assert (fresh.rank, fresh.world) == (0, 1)  # read from the process group (none here), never set from outside
    assert len(fresh.train_dataloader().dataset) == 1  # steps=3: only the last step is left
    torch.rand(3)  # the RNG moves on; the first rollout puts the checkpoint's back
    fresh.rollout(2)
    assert fresh.resume_rng is None
    # the draws' stream continues from the checkpoint's: the same rollout as a datamodule handed that state
    again = make_dm(task, policy)
    again.draws.load_state_dict(state["draws"])
    again.rollout(2)
    assert torch.equal(fresh.draws.generator("cpu").get_state(), again.draws.generator("cpu").get_state())
    assert not torch.equal(state["draws"]["cpu"], fresh.draws.generator("cpu").get_state())  # it drew from it
