"""``run`` and ``leaderboard`` against a real ``mlflow server`` (a SQLite backend, proxied artifacts), reached
as ``http://alice:<password>@127.0.0.1:<port>``: the way a team shares one tracking server.

The server has no auth and ignores the credentials; MLflow's client passes the URI to ``requests``, which sends
them as HTTP Basic auth. What is checked: the run comes back through the server whole (FINISHED, metric
histories, params, tags, the experiment's kind), its artifacts are stored by the server under its
``--artifacts-destination`` and downloaded through it, and the password is in nothing anyone can read later.

What ``run`` logs as artifacts (read from the code): ``config.yaml`` (``runs.open_run``),
``collapse_events.json`` (``callbacks.collapse``, at the end of training), ``ratios/step_NNNN.json``
(``callbacks.diagnostics.RatioSample``, at every evaluation step), and ``checkpoint/last.pt`` every
``train.checkpoint_every`` steps (1 here), which the server deletes again once the run is FINISHED. Figures
are ``report``'s, not ``run``'s (``test_redact`` covers ``report`` against a server).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import yaml

from gspo_bench.tracking.redact import MASK
from gspo_bench.tracking.ui import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, NOTE_TAG
from tests.mlflow_server import running_server

PASSWORD = "s3cretPW"
EXPERIMENT = "served"
STEPS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on a free 127.0.0.1 port: SQLite backend, proxied artifacts, one worker."""
    with running_server(tmp_path_factory.mktemp("server")) as s:
        s.secret_url = f"http://alice:{PASSWORD}@127.0.0.1:{s.port}"
        yield s


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory):
    env = {**os.environ, "GSPO_BENCH_CACHE": str(tmp_path_factory.mktemp("cache")), "OMP_NUM_THREADS": "1",
           "HF_DATASETS_CACHE": str(tmp_path_factory.mktemp("hf_datasets"))}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                 "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"):  # the CLI's own defaults apply
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def served(server, cli_env, tmp_path_factory):
    """``python -m gspo_bench run`` (gspo, 3 RL steps, no warm start) into the server, credentials in the URI;
    the run read back without them, and its artifacts downloaded through the server."""
    task = tmp_path_factory.mktemp("tasks") / "served.yaml"  # a built-in verifier: the CLI is another process
    task.write_text("name: served\nkind: arith\nverifier: exact\nmax_new_tokens: 6\n"
                    "params: {min_digits: 1, max_digits: 2, n_train: 500, n_eval: 16}\n")
    cwd = tmp_path_factory.mktemp("client")
    sets = ["warmstart.enabled=false", "rollout.prompts_per_step=4", "rollout.group_size=4", "train.eval_every=1",
            "train.eval_prompts=8", "train.eval_samples=2", "train.minibatches=2", "train.checkpoint_every=1",
            f"task={task}"]
    proc = subprocess.run(
        [sys.executable, "-m", "gspo_bench", "run", "--preset", "smoke", "--algos", "gspo", "--steps", str(STEPS),
         "--no-progress", "--tracking-uri", server.secret_url, "--experiment", EXPERIMENT,
         *[x for s in sets for x in ("--set", s)]],
        cwd=cwd, env=cli_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(server.url)  # no credentials: the server has none
    exp = client.get_experiment_by_name(EXPERIMENT)
    [run] = client.search_runs([exp.experiment_id])
    downloads = tmp_path_factory.mktemp("downloads")
    client.download_artifacts(run.info.run_id, "", str(downloads))
    return SimpleNamespace(proc=proc, cwd=cwd, client=client, exp=exp, run=run, downloads=downloads,
                           cache=Path(cli_env["GSPO_BENCH_CACHE"]))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _containing(root: Path, needle: str) -> list[str]:
    return [str(p) for p in _files(root) if needle.encode() in p.read_bytes()]


def test_the_run_comes_back_whole_through_the_server(served, server):
    run, client = served.run, served.client
    assert run.info.status == "FINISHED" and run.info.run_name == "gspo-s0"
    assert served.exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND  # the UI opens it on runs, not GenAI traces
    history = {k: sorted(m.step for m in client.get_metric_history(run.info.run_id, k))
               for k in ("reward/mean", "eval/pass1", "clip/frac")}
    assert history == {"reward/mean": [1, 2, 3], "eval/pass1": [0, 1, 2, 3], "clip/frac": [1, 2, 3]}
    assert {"time/wall_s", "ratio/seq_max", "policy/entropy"} <= set(run.data.metrics)
    params, tags = run.data.params, run.data.tags
    assert params["tracking.tracking_uri"] == f"http://alice:{MASK}@127.0.0.1:{server.port}"
    assert params["tracking.experiment"] == EXPERIMENT and params["train.steps"] == str(STEPS)
    assert {k: tags[k] for k in ("algo", "seed", "preset", "task", "model", "correction")} == {
        "algo": "gspo", "seed": "0", "preset": "smoke", "task": "served", "model": "tiny-dense", "correction": "none"}
    assert tags[NOTE_TAG].startswith("**gspo**: sequence-level ratio")
    console = served.proc.stdout
    # the page that opens on the runs table, on the server itself, without the credentials
    page = f"{server.url}/#/experiments/{served.exp.experiment_id}?workflowType=machine_learning"
    assert "FINISHED" in console and page in console.replace("\n", "")


def test_artifacts_live_on_the_server_not_in_the_clients_folder(served, server):
    run = served.run
    assert run.info.artifact_uri == f"mlflow-artifacts:/{served.exp.experiment_id}/{run.info.run_id}/artifacts"
    got = {str(p.relative_to(served.downloads)) for p in _files(served.downloads)}
    assert {"config.yaml", "collapse_events.json", "ratios/step_0003.json"} <= got, got
    # checkpoints were saved through the server at steps 1 and 2, and deleted when the run FINISHED
    assert run.data.tags["gspo_bench.checkpoint_step"] == "2"
    assert not any(p.startswith("checkpoint/") for p in got)
    config = yaml.safe_load((served.downloads / "config.yaml").read_text())
    assert config["algos"] == ["gspo"] and config["resolved"]["rollout"]["group_size"] == 4
    assert yaml.safe_load((served.downloads / "collapse_events.json").read_text()) == []
    stored = server.artifacts / served.exp.experiment_id / run.info.run_id / "artifacts"
    assert not list(stored.rglob("last.pt"))
    for rel in got:  # the bytes the server keeps are the bytes that came back
        assert (stored / rel).read_bytes() == (served.downloads / rel).read_bytes(), rel
    assert _files(served.cwd) == []  # no mlruns/, mlflow.db or artifact copy where the client ran


def test_the_password_is_in_nothing_written_or_printed(served, server):
    runs = [r for e in served.client.search_experiments() for r in served.client.search_runs([e.experiment_id])]
    for r in runs:
        recorded = {**r.data.params, **r.data.tags, "run_name": r.info.run_name or ""}
        assert not [k for k, v in recorded.items() if PASSWORD in k or PASSWORD in v], recorded
    assert PASSWORD not in served.proc.stdout + served.proc.stderr
    assert len(_files(served.downloads)) >= 3 and not _containing(served.downloads, PASSWORD)
    # the server's side: backend.db (and any -wal/-journal), its log, the artifacts it stores
    assert (server.root / "backend.db").is_file() and not _containing(server.root, PASSWORD)
    assert not _containing(served.cwd, PASSWORD) and not _containing(served.cache, PASSWORD)


def test_leaderboard_reads_the_server_through_a_uri_with_credentials(served, server, cli_env, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gspo_bench", "leaderboard", "--tracking-uri", server.secret_url, "--experiment",
         EXPERIMENT, "--format", "md"],
        cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| gspo " in proc.stdout and "served" in proc.stdout
    assert PASSWORD not in proc.stdout + proc.stderr
    assert _files(tmp_path) == []  # it prints; it writes nothing
