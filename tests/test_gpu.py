"""The GPU check: what a CUDA machine must run, as ``pytest -m gpu`` (every test here skips on a CPU).

Each test runs the command line in this process, as a user would type it, with the fast engine (vLLM's own GPU
checks are in ``test_gpu_presets.py`` and ``test_vllm_engine.py``, and skip with their reason where vLLM is not
installed), then reads the runs back from MLflow:

- the two GPU presets at full model size for a few steps, each algorithm's metrics logged at every step, the
  MoE one with routing replay r3 (the trainer replays the sampler's expert choices);
- the default preset learning: greedy pass@1 after the run above where it started, for every algorithm;
- all algorithms through the smoke preset.

Each prints one ``gpu-figure`` line (seconds per step, tokens/s, peak GPU memory) for the results page; run
with ``-s`` to see them. ``GSPO_BENCH_GPU_KEEP=<folder>`` keeps each test's MLflow store there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import mlflow
import pytest
import torch

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(tmp_path, monkeypatch, name: str, *args: str) -> mlflow.MlflowClient:
    """``run <args>`` in this process on the GPU, into a store of its own; the client reading it back."""
    from gspo_bench.cli.main import main

    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/m.db"
    torch.cuda.reset_peak_memory_stats()
    code = main(["run", *args, "--experiment", name, "--tracking-uri", uri, "--no-progress",
                 "--set", "train.accelerator=gpu"])
    peak = torch.cuda.max_memory_allocated() / 2**30
    keep = os.environ.get("GSPO_BENCH_GPU_KEEP")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "m.db", Path(keep) / f"{name}.db")
    assert code == 0, f"run {' '.join(args)} exited {code}"
    client = mlflow.MlflowClient(uri)
    for r in _runs(client, name):
        step = _median(client, r, "time/step_s")
        tps = _median(client, r, "throughput/gen_tokens_per_s")
        print(f"gpu-figure {name}/{r.data.tags['algo']}: {step:.3f} s/step, {tps:.0f} generated tokens/s "
              f"(medians), peak GPU memory of the command {peak:.1f} GiB, {torch.cuda.get_device_name()}")
    return client


def _runs(client: mlflow.MlflowClient, name: str):
    return client.search_runs([client.get_experiment_by_name(name).experiment_id])


def _history(client, run, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def _median(client, run, key: str) -> float:
    values = sorted(_history(client, run, key))
    return values[len(values) // 2] if values else float("nan")


def _every_step(client, run, key: str, steps: int) -> None:
    got = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
    assert got == list(range(1, steps + 1)), (run.data.tags["algo"], key, got)


@needs_cuda
@pytest.mark.parametrize("preset, model", [("gpu-dense", "dense-0.5b"), ("gpu-moe", "moe-0.16b")])
def test_a_gpu_preset_runs_at_full_size_with_the_fast_engine(tmp_path, monkeypatch, preset, model):
    moe = preset == "gpu-moe"
    # the MoE preset with routing replay r3: the trainer replays the experts the sampler chose
    replay = ("--set", "moe.routing_replay=r3") if moe else ()
    client = _run(tmp_path, monkeypatch, preset, "--preset", preset, "--engine", "fast", "--algos", "grpo,gspo",
                  "--steps", "2", "--set", "train.eval_every=2", "--set", "train.eval_prompts=32", *replay)
    runs = _runs(client, preset)
    assert sorted((r.data.tags["algo"], r.info.status) for r in runs) == [("grpo", "FINISHED"), ("gspo", "FINISHED")]
    for r in runs:
        assert (r.data.tags["model"], r.data.tags["engine"], r.data.params["train.precision"]) == (
            model, "fast", "bf16-mixed")
        for key in ("reward/mean", "clip/frac", "time/step_s", "throughput/gen_tokens_per_s", "mismatch/kl"):
            _every_step(client, r, key, 2)
        # a bf16 sampler against the bf16-mixed trainer: a gap, and a small one
        assert 0 < max(_history(client, r, "mismatch/kl")) < 1e-2
        if moe:
            assert r.data.tags["routing_replay"] == "r3"
            for key in ("moe/routing_mismatch", "moe/expert_flip_rate"):
                _every_step(client, r, key, 2)
            # the two sides round apart, so a few tokens' top-k differ, and only a few
            assert 0 < max(_history(client, r, "moe/routing_mismatch")) < 0.05


@needs_cuda
def test_the_default_preset_learns_on_a_gpu(tmp_path, monkeypatch):
    client = _run(tmp_path, monkeypatch, "default-gpu", "--preset", "default", "--algos", "grpo")
    for r in _runs(client, "default-gpu"):
        assert r.info.status == "FINISHED"
        first, *_, last = _history(client, r, "eval/pass1")
        # from the warm start's band (40-43 %), 40 RL steps lift greedy pass@1 well clear of it (CPU: +20 points)
        assert last > first + 0.1, (r.data.tags["algo"], first, last)


@needs_cuda
def test_every_algorithm_finishes_the_smoke_preset_on_a_gpu(tmp_path, monkeypatch):
    from gspo_bench.algorithms.base import ALGORITHMS

    client = _run(tmp_path, monkeypatch, "smoke-gpu", "--preset", "smoke", "--algos", "all")
    runs = _runs(client, "smoke-gpu")
    assert sorted(r.data.tags["algo"] for r in runs) == sorted(ALGORITHMS)
    for r in runs:
        assert r.info.status == "FINISHED", r.data.tags["algo"]
        assert "eval/pass1" in r.data.metrics and "clip/frac" in r.data.metrics


@needs_cuda
def test_the_compiled_engine_replays_cuda_graphs_and_samples_what_the_eager_engine_does():
    import time

    from gspo_bench.models import build_builtin
    from gspo_bench.rollout import compiled
    from gspo_bench.rollout.engine import fast_generate
    from tests.conftest import sharpen

    model, tok = build_builtin("tiny-dense", 4)
    sharpen(model)  # peaked next-token distributions: greedy picks are far from ties that rounding could flip
    model = model.cuda().eval()
    prompts = [p for p in ["1+2=", "33+44=", "Hello", "7*8-2="] for _ in range(16)]
    before = compiled.compile_seconds()["captures"]
    a = fast_generate(model, tok, prompts, max_new_tokens=24, greedy=True, compiled=True)
    assert compiled.compile_seconds()["captures"] > before  # the steps went through CUDA graphs
    b = fast_generate(model, tok, prompts, max_new_tokens=24, greedy=True)
    assert a.texts == b.texts
    seconds = {}
    for name, flag in (("eager", False), ("graphs", True)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g = fast_generate(model, tok, prompts, max_new_tokens=24, greedy=True, compiled=flag)
        torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - t0
    tokens = int(g.response_mask.sum())
    print(f"gpu-figure decode tiny-dense x {len(prompts)} rows: {tokens / seconds['eager']:.0f} tokens/s eager, "
          f"{tokens / seconds['graphs']:.0f} with CUDA graphs, {torch.cuda.get_device_name()}")
