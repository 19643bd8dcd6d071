"""Trajectories, token in and token out, and their round trip through the rollout layout
(gspo_bench.rollout.trajectory)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from tests.conftest import examples
from hypothesis import strategies as st

from gspo_bench.models import build_builtin
from gspo_bench.rollout.engine import Generation, eos_ids, fast_generate, hf_generate
from gspo_bench.rollout.trajectory import Segment, Trajectory, collate, trajectories_from

PROMPTS = ["1+2=", "33+44=", "5+60=", "9+9=", "12+7=", "0+0="]


@pytest.fixture(scope="module")
def ends_early():
    """tiny-dense whose LM head favours eos and never picks pad (a bias both samplers apply), so responses
    end at different lengths while prompts pad to different widths."""
    model, tok = build_builtin("tiny-dense", 0)
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = 3.0
        head.bias[tok.pad_token_id] = -30.0
    model.lm_head = head
    return model.eval(), tok


def assert_same_layout(batch, gen: Generation):
    assert batch.prompt_len == gen.prompt_len
    for name in ("input_ids", "attention_mask", "response_mask", "rollout_logp"):
        got, want = getattr(batch, name), getattr(gen, name)
        assert (got is None) == (want is None), name
        if want is not None:
            assert got.dtype == want.dtype and torch.equal(got, want), (name, got, want)


def truncated_rows(gen: Generation, model, tok, max_new_tokens: int) -> torch.Tensor:
    # as the datamodule decides it: the cap reached without an eos
    lengths = gen.response_mask.sum(-1)
    last = gen.input_ids[:, gen.prompt_len:].gather(1, (lengths.long() - 1).clamp(min=0)[:, None])[:, 0]
    return (lengths >= max_new_tokens) & ~torch.isin(last, torch.tensor(eos_ids(model, tok)))


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_a_real_generation_round_trips_exactly(ends_early, engine):
    model, tok = ends_early
    torch.manual_seed(0)
    if engine == "fast":
        gen = fast_generate(model, tok, PROMPTS, max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    else:
        gen = hf_generate(model, tok, PROMPTS, max_new_tokens=8)
    lengths = gen.response_mask.sum(-1)
    assert gen.rollout_logp is not None and len(set(lengths.tolist())) > 1  # ragged responses
    assert len(set(gen.attention_mask[:, :gen.prompt_len].sum(-1).tolist())) > 1  # and ragged prompts
    truncated = truncated_rows(gen, model, tok, 8)
    trajs = trajectories_from(gen, version=3, truncated=truncated)
    assert [len(t.segments) for t in trajs] == [1] * len(PROMPTS)
    assert [t.model_tokens for t in trajs] == lengths.long().tolist()
    assert [t.text(tok) for t in trajs] == gen.texts
    assert [t.finish_reason for t in trajs] == ["length" if x else "stop" for x in truncated.tolist()]
    assert "length" in {t.finish_reason for t in trajs} and "stop" in {t.finish_reason for t in trajs}
    # the prompt is the tokenizer's, without its padding
    assert [list(t.prompt_ids) for t in trajs] == tok(PROMPTS, add_special_tokens=False)["input_ids"]
    batch = collate(trajs, tok.pad_token_id)
    assert_same_layout(batch, gen)
    # one model segment per row: the loss mask is the response mask, every response token is version 3
    assert torch.equal(batch.loss_mask, gen.response_mask)
    assert torch.equal(batch.versions, torch.where(gen.response_mask > 0, 3, -1))


def test_without_the_samplers_log_probs_there_are_none(ends_early):
    model, tok = ends_early
    gen = hf_generate(model, tok, PROMPTS[:3], max_new_tokens=4, return_logp=False)
    trajs = trajectories_from(gen, version=0)
    assert all(t.behaviour_logp is None and t.finish_reason == "stop" for t in trajs)
    assert_same_layout(collate(trajs, tok.pad_token_id), gen)


def test_a_multi_turn_trajectory_by_hand():
    PAD = 0
    # the model answers, a tool's output comes back, the model ends after new weights arrived (version 4)
    turns = Trajectory((5, 6), [Segment.model([10, 11], [-0.5, -0.25], version=3), Segment.environment([20, 21, 22]),
                                Segment.model([12], [-1.0], version=4)], reward=1.0, finish_reason="stop")
    short = Trajectory((7,), [Segment.model([13], [-2.0], version=4)], finish_reason="length")
    assert turns.response_ids == [10, 11, 20, 21, 22, 12]
    assert turns.loss_mask == [1, 1, 0, 0, 0, 1]
    assert turns.behaviour_logp == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0]
    assert turns.versions == [3, 3, -1, -1, -1, 4]
    assert turns.model_tokens == 3
    b = collate([turns, short], PAD)
    assert b.prompt_len == 2
    assert b.input_ids.tolist() == [[5, 6, 10, 11, 20, 21, 22, 12],
                                    [0, 7, 13, 0, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 1],
                                         [0, 1, 1, 0, 0, 0, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 1, 1, 1, 1],
                                        [1, 0, 0, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[1, 1, 0, 0, 0, 1],
                                    [1, 0, 0, 0, 0, 0]]
    assert b.versions.tolist() == [[3, 3, -1, -1, -1, 4],
                                   [4, -1, -1, -1, -1, -1]]
    assert b.rollout_logp.tolist() == [[-0.5, -0.25, 0.0, 0.0, 0.0, -1.0],
                                       [-2.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    # a wider block on request (to match another layout); a model segment without log-probs: none for the batch
    wide = collate([short], PAD, prompt_len=3, response_len=2)
    assert wide.input_ids.tolist() == [[0, 0, 7, 13, 0]] and wide.versions.tolist() == [[4, -1]]
    no_logp = Trajectory((7,), [Segment.model([13], None, version=[2]), Segment.environment([9])])
    assert no_logp.behaviour_logp is None and collate([turns, no_logp], PAD).rollout_logp is None


def test_segments_and_layouts_are_checked():
    with pytest.raises(ValueError, match="2 versions"):
        Segment.model([1, 2], version=[0])
    with pytest.raises(ValueError, match="2 log-probs"):
        Segment.model([1, 2], [-1.0])
    with pytest.raises(ValueError, match="neither log-probs nor versions"):
        Segment((1,), "environment", (-1.0,))
    with pytest.raises(ValueError, match="'tool' is not allowed"):
        Segment((1,), "tool")
    with pytest.raises(ValueError, match="at least one"):
        collate([], 0)
    gappy = Generation(torch.tensor([[4, 5, 6, 7]]), torch.tensor([[1, 1, 1, 0]]), 2,
                       torch.tensor([[0.0, 1.0]]), None, [""])
    with pytest.raises(ValueError, match="response is not right-padded"):
        trajectories_from(gappy)


@st.composite
def layouts(draw):
    """A generation in the rollout layout with random ragged rows: ids from a small vocabulary that holds the pad
    id (a sampled pad inside a response stays), log-probs or none, extra padding columns on either side."""
    PAD = 0
    B = draw(st.integers(1, 4))
    prompts = [draw(st.lists(st.integers(0, 9), max_size=5)) for _ in range(B)]
    responses = [draw(st.lists(st.integers(0, 9), max_size=5)) for _ in range(B)]
    with_logp = draw(st.booleans())
    extra_p, extra_t = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    P = max(len(p) for p in prompts) + extra_p
    T = max(len(r) for r in responses) + extra_t
    ids = torch.full((B, P + T), PAD, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    rmask = torch.zeros((B, T))
    logp = torch.zeros((B, T))
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        ids[b, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[b, P - len(p):P + len(r)] = 1
        rmask[b, :len(r)] = 1.0
        logp[b, :len(r)] = torch.tensor(draw(st.lists(st.floats(-30.0, 0.0, width=32), min_size=len(r),
                                                       max_size=len(r))))
    gen = Generation(ids, attn, P, rmask, logp if with_logp else None, [""] * B)
    return gen, extra_p, extra_t


@settings(max_examples=examples(50), deadline=None)
@given(layouts(), st.integers(0, 1000))
def test_any_ragged_layout_round_trips(layout, version):
    gen, extra_p, extra_t = layout
    trajs = trajectories_from(gen, version=version)
    P, T = gen.prompt_len, gen.response_mask.shape[1]
    assert_same_layout(collate(trajs, 0, prompt_len=P, response_len=T), gen)
    if not (extra_p or extra_t):  # the narrowest layout is the default
        assert_same_layout(collate(trajs, 0), gen)
