"""The tracking store as a shared and fallible resource: concurrent writers on a fresh store, an artifact
folder that takes no files, the retry budget, and a tracking server that dies mid-run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import requests

from gspo_bench.tracking import stores
from gspo_bench.config import ConfigError, load_config
from tests.mlflow_server import running_server

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "gspo_bench", "run", "--preset", "smoke", "--no-warmstart", "--no-progress", *args]


# -- concurrent writers ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_three_runs_started_together_on_a_fresh_store_all_finish(tmp_path):
    # MLflow creates an empty database's tables on first contact; processes doing that together collided
    # ("duplicate column name: step") and the experiment was created twice (a unique-constraint error)
    uri = f"sqlite:///{tmp_path}/fresh.db"
    procs = [subprocess.Popen(_cli("--algos", algo, "--steps", "2", "--tracking-uri", uri, "--experiment", "together"),
                              cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for algo in ("grpo", "gspo", "dapo")]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    client = mlflow.MlflowClient(uri)
    [exp] = [e for e in client.search_experiments() if e.name == "together"]
    runs = client.search_runs([exp.experiment_id])
    assert sorted((r.data.tags["algo"], r.info.status) for r in runs) == [
        ("dapo", "FINISHED"), ("grpo", "FINISHED"), ("gspo", "FINISHED")]


def test_run_and_tune_take_the_same_lock_for_a_store_and_a_second_process_waits_for_it(tmp_path):
    from gspo_bench.tuning import study

    assert study.store_lock is stores.store_lock  # tune's storage opens under the lock run's store takes
    url = f"sqlite:///{tmp_path}/shared.db"
    child = ("import sys, time; from gspo_bench.tracking import stores\n"
             f"with stores.store_lock({url!r}): print(time.time(), flush=True)")
    with stores.store_lock(url):
        proc = subprocess.Popen([sys.executable, "-c", child], env=_env(tmp_path), stdout=subprocess.PIPE, text=True)
        time.sleep(3.0)  # the child is up and waiting by now
        released = time.time()
    got = float(proc.communicate(timeout=60)[0])
    assert got >= released


# -- the artifact folder ---------------------------------------------------------------------------------------
def test_an_artifact_folder_that_takes_no_files_is_a_config_error_before_any_run(tmp_path, monkeypatch):
    (tmp_path / "mlruns").write_text("a file where MLflow's default folder would go")
    monkeypatch.chdir(tmp_path)
    client, exp = stores.open_store(f"sqlite:///{tmp_path}/m.db", "new")
    with pytest.raises(ConfigError, match="artifact location .*mlruns.* cannot take files"):
        stores.check_artifact_location(client, exp, "new")
    stores.check_artifact_location(client, exp, "new", override=str(tmp_path / "elsewhere"))  # writable: fine


@pytest.mark.slow
def test_a_read_only_working_directory_ends_in_one_line_exit_2_and_no_run(tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a read-only folder without root")
    src, mnt = tmp_path / "src", tmp_path / "ro"
    src.mkdir(), mnt.mkdir()
    uri = f"sqlite:///{tmp_path}/m.db"
    inner = " ".join(_cli("--algos", "grpo", "--steps", "1", "--tracking-uri", uri))
    # a user and mount namespace of its own: a read-only bind mount, as root or not
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount --bind -o ro {src} {mnt} && cd {mnt} && {inner}"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert out.splitlines() == [f"gspo-bench: error: artifact location '{mnt}/mlruns' of the new experiment "
                                "(MLflow's default: ./mlruns in the working directory) cannot take files (Read-only "
                                "file system): run from a writable folder, or set tracking.artifact_location "
                                "(--set tracking.artifact_location=/writable/dir) for a new experiment"]
    client = mlflow.MlflowClient(uri)
    assert not [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


# -- a tracking server that stops answering ----------------------------------------------------------------------
@pytest.mark.parametrize("budget, retries, timeout", [(60, 4, 9), (10, 2, 2), (1, 0, 1), (600, 7, 59)])
def test_the_retry_budget_bounds_waits_and_timeouts_together(budget, retries, timeout):
    got = stores.retry_settings(budget)
    assert got["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == str(retries)
    assert got["MLFLOW_HTTP_REQUEST_TIMEOUT"] == str(timeout)
    # urllib3 waits 0, 2, 4, ... s before retries 1, 2, 3 (factor 1, no jitter): 2**r - 2 in all
    waits = 2 ** retries - 2 if retries else 0
    assert waits + (retries + 1) * timeout <= budget


def test_the_retry_budget_is_checked_and_defaults_to_a_minute():
    assert load_config("smoke").tracking.retry_budget_s == 60
    for bad in (0, -5, "soon", True, float("inf")):
        with pytest.raises(ConfigError, match="tracking.retry_budget_s"):
            load_config("smoke", overrides={"tracking": {"retry_budget_s": bad}})


def test_unreachable_knows_a_refused_connection_from_other_errors():
    with pytest.raises(requests.exceptions.ConnectionError) as refused:
        requests.get("http://127.0.0.1:9/health", timeout=2)  # the discard port: nothing listens
    wrapped = mlflow.exceptions.MlflowException(f"API request to http://127.0.0.1:9 failed with exception "
                                                f"{refused.value}")
    assert stores.unreachable(refused.value) and stores.unreachable(wrapped)
    assert not stores.unreachable(ValueError("loss is NaN")) and not stores.unreachable(None)


@pytest.mark.slow
def test_a_tracking_server_that_dies_mid_run_costs_the_budget_then_resume_continues(tmp_path):
    root = tmp_path / "server"
    budget = 8
    cmd = _cli("--algos", "grpo", "--steps", "40", "--set", "train.eval_every=20", "--set",
               "train.checkpoint_every=2", "--set", f"tracking.retry_budget_s={budget}", "--experiment", "dies")
    with running_server(root) as server:
        port = server.port
        client = mlflow.MlflowClient(server.url)
        proc = subprocess.Popen(cmd + ["--tracking-uri", server.url], cwd=tmp_path, env=_env(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        while True:  # the run has checkpointed at least once
            exp = client.get_experiment_by_name("dies")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if runs and int(runs[0].data.tags.get("gspo_bench.checkpoint_step", "0")) >= 2:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.5)
        run_id = runs[0].info.run_id
        os.killpg(server.proc.pid, signal.SIGKILL)  # the server dies (its whole process group)
        killed_at = time.monotonic()
        out, _ = proc.communicate(timeout=600)
        took = time.monotonic() - killed_at
    assert proc.returncode == 1, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"gspo-bench: error: tracking server {server.url} stopped answering"), out[-3000:]
    assert "--resume" in last and "Traceback" not in out
    # one call's budget, and a few seconds for a step in flight: no second round of retries on the way out
    assert took < 2 * budget + 20, f"took {took:.0f} s to stop"

    with running_server(root, port=port) as server:  # back, on the same store and artifacts
        again = subprocess.run(cmd + ["--tracking-uri", server.url, "--resume"], cwd=tmp_path, env=_env(tmp_path),
                               capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert f"continuing run {run_id} from its checkpoint" in again.stdout
        client = mlflow.MlflowClient(server.url)
        [run] = client.search_runs([client.get_experiment_by_name("dies").experiment_id])
        assert run.info.run_id == run_id and run.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run_id, "reward/mean")) == list(range(1, 41))
