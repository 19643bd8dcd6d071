"""The compiled decode step (gspo_bench.rollout.compiled) against the eager engine and a fresh forward."""

from __future__ import annotations

import pytest
import torch

from gspo_bench.models import build_builtin
from gspo_bench.rollout import compiled
from gspo_bench.rollout.engine import fast_generate, forward_response
from gspo_bench.rollout.engines import generate, resolve_engine
from tests.conftest import sharpen

# 16 rows (4 prompts x 4 samples): buckets 16 then 8 as rows finish
PROMPTS = [p for p in ["1+2=", "33+44=", "Hello", "7*8-2="] for _ in range(4)]


@pytest.fixture(scope="module")
def dense():
    model, tok = build_builtin("tiny-dense", 4)
    sharpen(model)
    with torch.no_grad():  # eos likelier, so rows end at different steps and the batch goes down a bucket
        model.lm_head.weight[tok.eos_token_id] *= 5
    return model.eval(), tok


def test_buckets_are_powers_of_two_from_eight_below_the_batch():
    assert [compiled.bucket(n, 128) for n in (1, 8, 9, 16, 17, 64, 65, 128)] == [8, 8, 16, 16, 32, 64, 128, 128]
    assert compiled.bucket(70, 96) == 96 and compiled.bucket(40, 96) == 64 and compiled.bucket(3, 5) == 5


def test_compiled_greedy_equals_eager_and_sampled_logp_equal_a_fresh_forward(dense):
    model, tok = dense
    before = compiled.compile_seconds()
    a = fast_generate(model, tok, PROMPTS, max_new_tokens=12, greedy=True, compiled=True)
    b = fast_generate(model, tok, PROMPTS, max_new_tokens=12, greedy=True)
    assert a.texts == b.texts and torch.equal(a.input_ids, b.input_ids)
    lengths = a.response_mask.sum(-1)
    assert (lengths < 10).sum() >= 8 and lengths.max() == 12  # 8 rows ended early: down to the 8-row bucket
    g = fast_generate(model, tok, PROMPTS, max_new_tokens=12, temperature=0.8, compiled=True,
                      generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fresh, _, _ = forward_response(model, g.input_ids, g.attention_mask, g.prompt_len, temperature=0.8)
    torch.testing.assert_close(g.rollout_logp, fresh * g.response_mask, atol=1e-4, rtol=1e-4)
    assert 0 < int((g.response_mask.sum(-1) < 12).sum()) < len(PROMPTS)
    after = compiled.compile_seconds()
    assert after["graphs"] > before["graphs"] and after["compile_s"] > before["compile_s"]


def test_another_model_of_the_same_shapes_reuses_the_graphs(dense):
    model, tok = dense
    fast_generate(model, tok, PROMPTS, max_new_tokens=12, greedy=True, compiled=True)
    graphs = compiled.compile_seconds()["graphs"]
    other, _ = build_builtin("tiny-dense", 5)
    a = fast_generate(other.eval(), tok, PROMPTS, max_new_tokens=12, greedy=True, compiled=True)
    b = fast_generate(other, tok, PROMPTS, max_new_tokens=12, greedy=True)
    assert a.texts == b.texts
    assert compiled.compile_seconds()["graphs"] == graphs


def test_the_engine_name_and_what_decodes_eagerly():
    moe, tok = build_builtin("tiny-moe", 0)
    dense_model, _ = build_builtin("tiny-dense", 0)
    assert resolve_engine("compiled", dense_model) == "compiled" == resolve_engine("compiled", moe)
    assert compiled.supported(dense_model, recording_routes=False)
    assert not compiled.supported(dense_model, recording_routes=True)
    assert not compiled.supported(moe, recording_routes=False)  # an MoE step's expert batches change shape
    graphs = compiled.compile_seconds()["graphs"]
    a = generate("compiled", moe.eval(), tok, PROMPTS[:4], max_new_tokens=4, greedy=True)
    assert a.texts == generate("fast", moe, tok, PROMPTS[:4], max_new_tokens=4, greedy=True).texts
    assert compiled.compile_seconds()["graphs"] == graphs


def _recording_capture(calls: dict):
    """What CUDA graph capture does, on a CPU: the capture runs the step once and keeps it (a closure over the
    capture's own buffers); a replay runs it again into the same output. A per-step input that did not reach
    those buffers would replay a stale step."""

    def capture(fn):
        calls["captures"] += 1
        out = fn()

        def replay():
            calls["replays"] += 1
            out.copy_(fn())

        return replay, out

    return capture


def test_a_captured_step_replays_over_its_own_buffers_and_samples_what_the_eager_engine_does(dense, monkeypatch):
    model, tok = dense
    calls = {"captures": 0, "replays": 0}
    monkeypatch.setattr(compiled, "capture_for", lambda device: _recording_capture(calls))
    before = compiled.compile_seconds()["captures"]
    a = fast_generate(model, tok, PROMPTS, max_new_tokens=12, greedy=True, compiled=True)
    b = fast_generate(model, tok, PROMPTS, max_new_tokens=12, greedy=True)
    assert a.texts == b.texts and torch.equal(a.input_ids, b.input_ids)
    # one capture per run of steps over the same cache: the 16-row bucket, then the 8-row one; a step after each
    # of the 11 samples but the last
    assert calls == {"captures": 2, "replays": 11}
    assert compiled.compile_seconds()["captures"] - before == 2
    g = fast_generate(model, tok, PROMPTS, max_new_tokens=12, temperature=0.8, compiled=True,
                      generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fresh, _, _ = forward_response(model, g.input_ids, g.attention_mask, g.prompt_len, temperature=0.8)
    torch.testing.assert_close(g.rollout_logp, fresh * g.response_mask, atol=1e-4, rtol=1e-4)


def test_a_step_on_a_cpu_is_called_not_captured(dense):
    model, _ = dense
    assert compiled.capture_for(torch.device("cpu")) is None
    assert compiled.capture_for(torch.device("cuda", 0)) is compiled.cuda_capture


def test_auto_picks_the_compiled_engine_on_a_gpu_for_a_dense_model_when_vllm_is_missing(monkeypatch):
    from gspo_bench.rollout.engines import vllm as vllm_engine

    monkeypatch.setattr(vllm_engine, "prefers_vllm", lambda model, device=None: False)
    moe, _ = build_builtin("tiny-moe", 0)
    dense_model, _ = build_builtin("tiny-dense", 0)
    assert resolve_engine("auto", dense_model, device="cuda") == "compiled"
    assert resolve_engine("auto", moe, device="cuda") == "fast"  # an MoE step cannot keep its shapes
    assert resolve_engine("auto", dense_model, device="cpu") == "fast"
    assert resolve_engine("auto", dense_model) == "fast"  # its weights are on the CPU
