"""Shared fixtures: a cache dir per session, a tiny task with a mixed reward, an MLflow store."""

from __future__ import annotations

import fcntl
import os
import tempfile
import warnings

# Inductor's on-disk cache does not key its C++ kernels on ATEN_CPU_CAPABILITY (torch 2.13): kernels built for
# the machine's vector instructions fail to compile in a later run under ATEN_CPU_CAPABILITY=default that
# shares the cache. A run under a chosen kernel set (docs/cpus.md) keeps its own cache, unless told where; set
# before torch is imported, which (under pytest) fixes the cache's place.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{os.getuid()}_{os.environ['ATEN_CPU_CAPABILITY']}")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

from gspo_bench.tasks import register_verifier  # noqa: E402

# Under pytest-xdist (``-n 2``: the README's test command) each worker process takes one core: one thread for
# torch here and for the processes a test starts, unless the test sets its own
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
CORES = max(1, min(2, os.cpu_count() or 1))  # the threads of a process that has the machine to itself
torch.set_num_threads(1 if XDIST_WORKER else CORES)
warnings.filterwarnings("ignore")


# Property tests run ``examples(n)`` cases: n in the everyday run, 10x under the nightly profile
# (``python -m pytest --hypothesis-profile=nightly``; docs/testing.md)
hypothesis_settings.register_profile("nightly", max_examples=1000)


def examples(n: int) -> int:
    """A property test's number of cases: ``n``, scaled by the loaded profile (hypothesis's default runs 100)."""
    return max(1, n * hypothesis_settings.default.max_examples // 100)


@register_verifier("test_even_length")
def _even_length(completion: str, answer: str) -> float:
    """A reward random weights can earn: about half of any group's completions get 1."""
    return float(len(completion) % 2 == 0)


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    # every test shares one cache per session (warm starts are reused), never ~/.cache; session-scoped, so that
    # module-scoped fixtures (which run before any function-scoped one) use it too: a warm start found in
    # ~/.cache may have been trained under other kernels (another CPU, another ATEN_CPU_CAPABILITY)
    with pytest.MonkeyPatch.context() as mp:
        # xdist's workers share it (each has a base folder of its own under one parent): a warm start one
        # trains, the other finds (the cache locks a warm start while it is built)
        base = tmp_path_factory.getbasetemp()
        mp.setenv("GSPO_BENCH_CACHE", str((base.parent if XDIST_WORKER else base) / "cache"))
        yield


@pytest.fixture(autouse=True)
def _alone(request, tmp_path_factory, monkeypatch):
    """Under xdist, a test marked ``alone`` runs with no other test beside it (its peak memory, or a timing that
    another test's load would shift): it takes a lock that every other test shares, exclusively. Fixtures of
    wider scope set up outside it. Holding the machine, it also uses its cores (up to 2 threads, here and in the
    processes it starts): the other worker waits meanwhile, so one thread would leave a core idle."""
    if not XDIST_WORKER:
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with open(tmp_path_factory.getbasetemp().parent / "alone.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        threads = torch.get_num_threads()
        if alone:
            monkeypatch.setenv("OMP_NUM_THREADS", str(CORES))
            torch.set_num_threads(CORES)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            fcntl.flock(lock, fcntl.LOCK_UN)


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


def saved_builtin(name: str, folder, seed: int = 0) -> str:
    """Built-in model ``name`` (seed ``seed``) with its tokenizer, saved in Hugging Face format in ``folder``, as a
    checkpoint a module loads with ``from_pretrained``; returns the folder."""
    from gspo_bench.models import build_builtin

    model, tok = build_builtin(name, seed)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


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


def bf16_logp_rms(model: str, sides: int) -> float:
    """The root mean square by which bfloat16 rounding moves a sampled token's log-prob in the built-in ``model``
    (random weights, not sharpened), between two computations of which ``sides`` round to bfloat16 (1: a bf16
    sampler against a float32 trainer; 2: against a bf16-mixed trainer). From the precision and the model's
    shape, not from a measurement on one CPU, whose kernels round in their own order:

    bfloat16 keeps 8 significant bits, so a rounding is a relative error of at most u = 2^-8. A bf16 side rounds
    about k = 8 times per layer at the residual stream's scale (the q, k, v and output projections, the MLP's or
    experts' gate/up and down projections, the two residual adds). Independent roundings add in quadrature, so
    after L layers its final hidden state h is off by a relative sqrt(k L) u, in no particular direction. A logit
    z_j = e_j . h (tied embeddings) then moves by sqrt(k L) u sigma_z, where sigma_z, the logits' spread over the
    vocabulary, is initializer_range * sqrt(hidden) (||h|| = sqrt(hidden) after the final RMSNorm,
    e_j ~ N(0, initializer_range^2)). Near-uniform probabilities leave log p_y moving with z_y alone, and the
    sides' errors are independent: rms = sqrt(sides k L) u sigma_z. tiny-dense, one side: 5.0e-3 nats;
    moe-0.16b, two: 0.024; dense-0.5b, two: 0.053.
    """
    from gspo_bench.models.builtin import BUILTIN_MODELS, char_tokenizer

    config = BUILTIN_MODELS[model].make_config(char_tokenizer())
    u, k = 2.0 ** -8, 8
    sigma_z = config.initializer_range * config.hidden_size ** 0.5
    return (sides * k * config.num_hidden_layers) ** 0.5 * u * sigma_z


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


def nan_loss_on_call(monkeypatch, n: int) -> None:
    """Make the ``n``-th call (1-based) of the policy loss in the RL step return NaN, the others as they are."""
    import gspo_bench.algorithms.base as base

    real, calls = base.policy_loss, {"n": 0}

    def nth_is_nan(*a, **k):
        loss, st = real(*a, **k)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == n else loss), st

    monkeypatch.setattr(base, "policy_loss", nth_is_nan)
