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


def test_a_writable_sqlite_file_in_a_read_only_folder_is_refused_as_the_folder(tmp_path):
    # SQLite writes its journal beside the file: the file opening for writes is not enough (run and report
    # both refuse such a store through writable_uri)
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a read-only folder without root")
    src, mnt, db = tmp_path / "src", tmp_path / "ro", tmp_path / "m.db"
    src.mkdir(), mnt.mkdir()
    (src / "m.db").write_bytes(b""), db.write_bytes(b"")
    check = ("from gspo_bench.config import ConfigError\nfrom gspo_bench.tracking import stores\n"
             f"try:\n    stores.writable_uri('sqlite:///{mnt}/m.db')\nexcept ConfigError as e:\n    print(e)")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount --bind -o ro {src} {mnt} && mount --bind {db} "
                           f"{mnt}/m.db && {sys.executable} -c \"$CHECK\""], env={**_env(tmp_path), "CHECK": check},
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == (f"tracking URI 'sqlite:///{mnt}/m.db': cannot write '{mnt}' (Read-only file "
                                   "system)"), proc.stdout + proc.stderr


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


# -- the one store check -----------------------------------------------------------------------------------------
SECRET = "s3cr3tpw"
# every command that opens a tracking store or an Optuna storage, with the store it is pointed at (URI)
STORE_COMMANDS = {
    "run": lambda uri: ["run", "--preset", "smoke", "--no-warmstart", "--no-progress", "--tracking-uri", uri],
    "suite --dry-run": lambda uri: ["suite", "--scenarios", "smoke", "--seeds", "1", "--dry-run", "--tracking-uri", uri],
    "tune": lambda uri: ["tune", "--algo", "gspo", "--preset", "smoke", "--no-progress", "--tracking-uri", uri],
    "tune --storage": lambda uri: ["tune", "--algo", "gspo", "--preset", "smoke", "--no-progress", "--storage", uri],
    "leaderboard": lambda uri: ["leaderboard", "--tracking-uri", uri],
    "report": lambda uri: ["report", "--tracking-uri", uri, "--out", "rep"],
    "report --storage": lambda uri: ["report", "--storage", uri, "--out", "rep"],
    "claims": lambda uri: ["claims", "--tracking-uri", uri, "--out", "claims.md"],
    "collapse-check": lambda uri: ["collapse-check", "--tracking-uri", uri],
}


def _one_error_line(capsys, argv, tmp_path, monkeypatch) -> str:
    """Run the CLI in ``tmp_path`` (where a healthy ``mlflow.db`` serves the flags not under test); exit 2,
    one line, no secret, nothing written but that store."""
    from gspo_bench.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(argv)
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2, text
    assert len(text.splitlines()) == 1, text
    assert SECRET not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no --out folder, no new store, no mlruns
    return text


@pytest.fixture
def healthy_stores(tmp_path):
    """A working tracking store and Optuna storage in ``tmp_path``, for the flag a case does not point elsewhere."""
    mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").create_experiment(
        "gspo_bench", artifact_location=str(tmp_path / "artifacts"))
    import optuna

    optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    return tmp_path


@pytest.mark.parametrize("command", list(STORE_COMMANDS))
def test_every_command_that_opens_a_store_ends_a_closed_postgres_port_in_one_line_exit_2(
        command, healthy_stores, capsys, monkeypatch):
    # nothing listens on port 1: refused at once, where MLflow's own engine retried for almost two minutes
    uri = f"postgresql://alice:{SECRET}@127.0.0.1:1/runs"
    t0 = time.monotonic()
    text = _one_error_line(capsys, STORE_COMMANDS[command](uri), healthy_stores, monkeypatch)
    assert time.monotonic() - t0 < 60
    role = "Optuna storage" if "--storage" in command else "tracking store"
    assert f"{role} postgresql://alice:***@127.0.0.1:1/runs does not answer" in text, text
    assert "Connection refused" in text


@pytest.mark.parametrize("command", list(STORE_COMMANDS))
def test_every_command_that_opens_a_store_ends_a_file_that_is_not_a_database_in_one_line_exit_2(
        command, healthy_stores, capsys, monkeypatch):
    (healthy_stores / "notes.db").write_text("these are notes, not a database\n" * 100)
    text = _one_error_line(capsys, STORE_COMMANDS[command]("sqlite:///notes.db"), healthy_stores, monkeypatch)
    assert "sqlite:///notes.db cannot be opened: file is not a database" in text, text
    assert (healthy_stores / "notes.db").read_text().startswith("these are notes")  # untouched


def _serve(handler_answer):
    """An HTTP server on a free loopback port answering every request with ``handler_answer(handler)``; yields
    its URL and stops it."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            handler_answer(self)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_a_tracking_server_that_refuses_the_credentials_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    def unauthorised(h):
        h.send_response(401)
        h.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
        h.end_headers()

    httpd = _serve(unauthorised)
    try:
        url = f"http://alice:{SECRET}@127.0.0.1:{httpd.server_address[1]}"
        for argv in (STORE_COMMANDS["leaderboard"](url), STORE_COMMANDS["run"](url)):
            text = _one_error_line(capsys, argv, tmp_path, monkeypatch)
            assert f"tracking store http://alice:***@127.0.0.1:{httpd.server_address[1]} cannot be opened: it " \
                   "refused the credentials (HTTP 401)" in text, text
    finally:
        httpd.shutdown()


def test_a_store_that_takes_the_connection_and_never_answers_stops_within_the_connect_timeout(
        tmp_path, capsys, monkeypatch):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes connections into the backlog; nobody ever reads them
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        text = _one_error_line(capsys, [*STORE_COMMANDS["run"](url), "--set", "tracking.connect_timeout_s=1"],
                               tmp_path, monkeypatch)
        assert time.monotonic() - t0 < 30
        assert f"tracking store {url} does not answer" in text and "timed out" in text, text
    finally:
        silent.close()


def test_an_unknown_host_and_a_schema_mlflow_cannot_migrate_are_one_line_each(tmp_path, capsys, monkeypatch):
    import sqlite3

    text = _one_error_line(capsys, STORE_COMMANDS["leaderboard"](f"postgresql://bob:{SECRET}@no-such-host.invalid/r"),
                           tmp_path, monkeypatch)
    assert "tracking store postgresql://bob:***@no-such-host.invalid/r does not answer" in text, text
    mlflow.MlflowClient(f"sqlite:///{tmp_path}/old.db").search_experiments()
    with sqlite3.connect(tmp_path / "old.db") as db:  # a store written by an MLflow this one does not know
        db.execute("UPDATE alembic_version SET version_num = '0123456789ab'")
    for argv in (STORE_COMMANDS["leaderboard"]("sqlite:///old.db"), STORE_COMMANDS["run"]("sqlite:///old.db")):
        text = _one_error_line(capsys, argv, tmp_path, monkeypatch)
        assert "tracking store sqlite:///old.db cannot be opened: Detected out-of-date database schema" in text


def test_the_connect_timeout_is_checked_and_defaults_to_five_seconds():
    assert load_config("smoke").tracking.connect_timeout_s == 5
    for bad in (0, 0.5, 301, float("nan"), True, "soon"):
        with pytest.raises(ConfigError, match="tracking.connect_timeout_s"):
            load_config("smoke", overrides={"tracking": {"connect_timeout_s": bad}})
