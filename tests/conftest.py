"""Shared fixtures: a cache dir per session, a tiny task with a mixed reward, an MLflow store."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from gspo_bench.tasks import register_verifier

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
warnings.filterwarnings("ignore")


@register_verifier("test_even_length")
def _even_length(completion: str, answer: str) -> float:
    """A reward random weights can earn: about half of any group's completions get 1."""
    return float(len(completion) % 2 == 0)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # every test shares one cache per session (warm starts are reused), never ~/.cache
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    # load_dataset("json"/"parquet") writes an Arrow cache; keep it out of ~/.cache
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


@pytest.fixture(scope="session")
def mixed_task(tmp_path_factory):
    """Addition prompts scored by the even-length verifier, so groups have reward variance untrained."""
    path = tmp_path_factory.mktemp("tasks") / "mixed.yaml"
    path.write_text(
        "name: mixed\nkind: arith\nverifier: test_even_length\nmax_new_tokens: 6\n"
        "params: {min_digits: 1, max_digits: 2, n_train: 500, n_eval: 16}\n"
    )
    return str(path)


@pytest.fixture(scope="session")
def tracking_uri(tmp_path_factory):
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def tiny_overrides(task: str, uri: str, **extra) -> dict:
    """A run small enough for a unit test: 4 prompts x 4 samples, 2 steps, no warm start."""
    o = {
        "task": task,
        "warmstart": {"enabled": False},
        "rollout": {"prompts_per_step": 4, "group_size": 4},
        "train": {"steps": 2, "minibatches": 2, "eval_every": 1, "eval_prompts": 8, "eval_samples": 2,
                  "progress": False, "lr": 1e-3},
        "tracking": {"tracking_uri": uri},
    }
    for k, v in extra.items():
        o[k] = {**o.get(k, {}), **v} if isinstance(v, dict) else v
    return o


def sharpen(model):
    """Random init gives near-uniform next-token distributions (entropy ~ log V); scale a few weights in place so
    attention and the LM head are peaked, and a wrong position, mask or routing shows up clearly."""
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.mul_(3.0)
            layer.self_attn.k_norm.weight.mul_(3.0)
            layer.self_attn.o_proj.weight.mul_(5.0)
            if hasattr(layer.mlp, "experts"):
                layer.mlp.experts.down_proj.mul_(5.0)
                layer.mlp.gate.weight.mul_(5.0)
            else:
                layer.mlp.down_proj.weight.mul_(5.0)
    return model


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (``GSPO_BENCH_CI=1``, set by ``.ci/run``, which installs every part) a skipped test is a failure,
    unless it needs a GPU (``gpu`` marker): a missing server or extra must not pass unnoticed."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("GSPO_BENCH_CI") and report.skipped and "gpu" not in item.keywords \
            and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome, report.longrepr = "failed", f"skipped in CI, where every part is installed: {reason}"


@pytest.fixture(scope="session")
def vllm_ready():
    """vLLM importable here; a test that needs it skips saying why, except in CI (``GSPO_BENCH_CI=1``), which
    installs it and so fails instead."""
    from gspo_bench.rollout import vllm_engine

    reason = vllm_engine.missing_reason()
    if reason:
        if os.environ.get("GSPO_BENCH_CI"):
            pytest.fail(f"CI installs vLLM, yet: {reason}")
        pytest.skip(reason)
