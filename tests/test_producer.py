"""The rollout producer (gspo_bench.rollout.producer): weights handed in with their version, versions on every
sampled token, the bounded buffer, the engine handles, and a rollout that depends on its key only."""

from __future__ import annotations

import copy

import pytest
import torch

from gspo_bench.config import RolloutConfig
from gspo_bench.models import build_builtin
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.rollout.draws import RequestDraws, StreamDraws
from gspo_bench.rollout.engines import EngineSetup
from gspo_bench.rollout.producer import EngineHandle, RolloutProducer
from gspo_bench.rollout.trajectory import NO_VERSION
from gspo_bench.tasks import Task, TaskSpec, generate_arith


@pytest.fixture(scope="module")
def policy():
    model, tok = build_builtin("tiny-dense", 0)
    return model.eval(), tok


@pytest.fixture(scope="module")
def task():
    train, eval_ = generate_arith(0, min_digits=1, max_digits=2, n_train=200, n_eval=16)
    return Task(TaskSpec(name="arith-small", kind="arith"), train, eval_)


def settings(**kw) -> RolloutConfig:
    s = dict(prompts_per_step=2, group_size=3, max_new_tokens=4, engine="fast", dynamic_sampling=False,
             overlong_buffer=None, advantage_scale="group")
    return RolloutConfig(**{**s, **kw})


def producer(task, policy, model=None, seed=0, **kw) -> RolloutProducer:
    _, tok = policy
    s = settings(**kw)
    handle = EngineHandle(s, tok, seed=seed, kind="train", engine=None, setup=EngineSetup(s, seed=seed),
                          stream=StreamDraws())
    return RolloutProducer(task, tok, s, seed=seed, handle=handle, model=model if model is not None else policy[0])


def test_every_sampled_token_carries_the_version_that_drew_it(task, policy):
    p = producer(task, policy)
    p.sync_weights(policy[0].state_dict(), 4)
    batch = p.rollout(4)
    on = batch.response_mask.bool()
    assert (batch.versions[on] == 4).all() and (batch.versions[~on] == NO_VERSION).all()
    # k rollouts stale: the weights k versions back, never before the warm start
    stale = producer(task, policy, staleness=2)
    for version, want in ((0, 0), (1, 0), (2, 0), (3, 1)):
        stale.sync_weights(policy[0].state_dict(), version)
        assert stale.sampled_version() == want
        versions = stale.rollout(version).versions
        assert set(versions.unique().tolist()) <= {want, NO_VERSION} and (versions == want).any()


def test_weights_handed_in_are_copied_unless_they_are_the_models_own(task, policy):
    mine = copy.deepcopy(policy[0])
    p = producer(task, policy, model=mine)
    p.sync_weights(mine.state_dict(), 1)  # its own tensors: nothing to load
    assert p.version == 1
    other = copy.deepcopy(policy[0])
    with torch.no_grad():
        for t in other.parameters():
            t.add_(0.01)
    p.sync_weights(other.state_dict(), 2)
    assert p.version == 2 and p.model is mine
    assert all(torch.equal(a, b) for a, b in zip(mine.parameters(), other.parameters()))
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(mine.parameters(), other.parameters()))


def test_the_buffer_is_bounded_and_hands_out_the_step_asked_for(task, policy):
    p = producer(task, policy)
    p.produce(0)
    with pytest.raises(RuntimeError, match="buffer is full"):
        p.produce(1)
    with pytest.raises(RuntimeError, match="step 0's rollout, not step 1's"):
        p.take(1)
    assert len(p.take(0)) == 6 and not p.buffer
    with pytest.raises(RuntimeError, match="no rollout waits"):
        p.take(1)


def test_with_a_generator_per_request_a_rollout_depends_on_its_key_only(task, policy):
    a = producer(task, policy, seeding="request")
    b = producer(task, policy, seeding="request")
    torch.manual_seed(0)
    first = a.rollout(3)
    torch.manual_seed(123)  # torch's global state plays no part
    b.rollout(0)  # nor what the producer sampled before
    second = b.rollout(3)
    assert torch.equal(first.input_ids, second.input_ids) and torch.equal(first.rollout_logp, second.rollout_logp)
    # another seed, other draws
    other = producer(task, policy, seed=1, seeding="request").rollout(3)
    assert not torch.equal(other.input_ids, first.input_ids)
    # the stream, by contrast, continues: the same step sampled twice gives other tokens
    s = producer(task, policy)
    assert not torch.equal(s.rollout(3).input_ids, s.rollout(3).input_ids)


def test_the_handles_draws_follow_the_seeding(task, policy):
    _, tok = policy
    stream = StreamDraws()
    for seeding, kind in (("stream", StreamDraws), ("request", RequestDraws)):
        s = settings(seeding=seeding)
        h = EngineHandle(s, tok, seed=7, kind="eval", engine=None, setup=EngineSetup(s), stream=stream)
        draws = h.draws(2, 0, rows=[5])
        assert isinstance(draws, kind)
        if kind is StreamDraws:
            assert draws is stream  # rollouts and evaluations share the run's one stream
        else:
            assert draws.key == (7, "eval", 2, 0) and draws.row(0) == 5


def test_the_datamodule_hands_the_producer_the_policy_weights_before_each_rollout(task, policy):
    model, tok = policy
    dm = RolloutDataModule(task, tok, settings(), steps=3, seed=0, policy=model)
    assert dm.producer.model is model and dm.eval_engine is not dm.producer.handle
    batch = dm.rollout(2)
    assert dm.producer.version == 2 and (batch.versions[batch.response_mask.bool()] == 2).all()
    before = torch.get_rng_state()
    dm.rollout(0)
    assert torch.equal(torch.get_rng_state(), before)  # the rollout drew from the run's stream only


def test_engines_are_handed_token_ids_laid_out_as_the_tokenizer_pads_text(task, policy):
    from gspo_bench.rollout.engine import encode_prompts, fast_generate, left_padded, prompt_ids

    model, tok = policy
    p = producer(task, policy)
    seen = []
    engine = p.handle.get(model)
    real = engine.sample
    engine.sample = lambda model, tokenizer, prompts, **kw: seen.append(prompts) or real(model, tokenizer, prompts,
                                                                                          **kw)
    batch = p.rollout(0)
    rows, _ = p.prompts_for(0, 0)
    want = prompt_ids(tok, [r["prompt"] for r in rows for _ in range(3)])
    assert seen == [want] and all(isinstance(t, int) for t in want[0])  # ids in, never text
    assert batch.trajectories[0].prompt_ids == tuple(want[0])  # and the record keeps those very ids
    # the ids' left-padded batch is the tokenizer's own padding of the text
    text = ["1+2=", "13+45=", "7*8="]
    enc, _ = encode_prompts(model, tok, text)
    laid = left_padded(prompt_ids(tok, text), tok.pad_token_id)
    assert torch.equal(enc["input_ids"], laid["input_ids"]) and torch.equal(enc["attention_mask"],
                                                                            laid["attention_mask"])
    torch.manual_seed(0)
    a = fast_generate(model, tok, text, max_new_tokens=4)
    torch.manual_seed(0)
    b = fast_generate(model, tok, prompt_ids(tok, text), max_new_tokens=4)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
