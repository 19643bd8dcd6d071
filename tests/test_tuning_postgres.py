"""``tune`` on a real PostgreSQL server (``tests/pg_server.py``; skipped, saying why, where none can run).

Two ``python -m gspo_bench tune`` workers share one study at once; one is killed (SIGKILL) in the middle of
a long trial. Through Optuna's API afterwards: the dead trial is FAIL through the heartbeat (not RUNNING
forever) and was retried with the same parameters by the survivor; no trial is lost or duplicated; the
best-params YAML holds the best COMPLETE trial's parameters; the URL's password is in no file or log.
Also: a driver-less ``postgresql://`` URL connects with psycopg 3 (a missing driver is a one-line error), and
workers opening a fresh database at the same moment do not race in ``CREATE TABLE``.

Like the worker tests of ``test_tuning.py``: ``arith`` without a warm start (zero reward, plumbing only), the
smoke preset, 2 RL steps a trial, except the doomed worker's (200 steps: it is still training when killed).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from gspo_bench.config import ConfigError
from gspo_bench.tuning.study import RUN_ATTR, driver_url, open_storage
from tests.pg_server import pg_server  # noqa: F401  (a fixture)

TINY = {"warmstart": {"enabled": False}, "rollout": {"prompts_per_step": 4, "group_size": 4},
        "train": {"steps": 2, "minibatches": 2, "eval_every": 1, "eval_prompts": 8, "eval_samples": 2, "lr": 1e-3}}
STUDY = "shared-pg"
SURVIVOR_TRIALS = 6  # enough that the survivor still starts trials once the dead one's heartbeat is stale
SURVIVOR_STEPS = 5  # and long enough ones: with 5 trials of 2 steps it could finish within the 2 s grace period
DOOMED_STEPS = 200  # its trial runs far longer than the test waits before the kill
State = optuna.trial.TrialState


def _worker(tmp: Path, url: str, name: str, trials: int, steps: int) -> subprocess.Popen:
    """``python -m gspo_bench tune`` on the shared study, heartbeat 1 s, its log in ``<name>.log``."""
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "task": "arith", "train": {**TINY["train"], "steps": steps}}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "gspo_bench", "tune", "--algo", "gspo", "--preset", "smoke", "--config", str(cfg),
           "--study", STUDY, "--storage", url, "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--out",
           str(tmp / "tuning"), "--no-progress", "--heartbeat", "1", "--trials", str(trials)]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=open(tmp / f"{name}.log", "w"), stderr=subprocess.STDOUT)


def _log(tmp: Path, name: str) -> str:
    return (tmp / f"{name}.log").read_text(errors="replace")


def _finished_by(log: str) -> list[int]:
    """The trial numbers a worker reported done (its ``tune: trial N (...)`` progress lines)."""
    return [int(n) for n in re.findall(r"^tune: trial (\d+) \(", log, re.MULTILINE)]


def _doomed_trial(tmp: Path, url: str, doomed: subprocess.Popen, survivor: subprocess.Popen):
    """The doomed worker's trial, once it is RUNNING with its MLflow run and a few RL steps in (only its
    trials report past step ``SURVIVOR_STEPS``)."""
    storage = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and doomed.poll() is None and survivor.poll() is None:
        time.sleep(0.5)
        if storage is None:
            if not any("tune: study" in _log(tmp, n) for n in ("doomed", "survivor")):
                continue  # until a worker has made the tables: our own CREATE TABLE would race theirs
            storage = optuna.storages.RDBStorage(url)
        study = optuna.load_study(study_name=STUDY, storage=storage)
        for t in study.get_trials(deepcopy=False, states=(State.RUNNING,)):
            if RUN_ATTR in t.user_attrs and max(t.intermediate_values, default=0) > SURVIVOR_STEPS:
                return t
    return None


@pytest.mark.slow
def test_two_workers_on_postgres_a_killed_one_is_retried_nothing_lost_best_written(pg_server, tmp_path):
    url, password = pg_server.url, pg_server.password
    doomed = _worker(tmp_path, url, "doomed", SURVIVOR_TRIALS, DOOMED_STEPS)
    survivor = _worker(tmp_path, url, "survivor", SURVIVOR_TRIALS, SURVIVOR_STEPS)
    try:
        running = _doomed_trial(tmp_path, url, doomed, survivor)
        assert running is not None, _log(tmp_path, "doomed")[-3000:] + _log(tmp_path, "survivor")[-3000:]
        doomed.send_signal(signal.SIGKILL)  # mid-trial
        doomed.wait()
        assert survivor.wait(timeout=300) == 0, _log(tmp_path, "survivor")[-3000:]
    finally:
        for proc in (doomed, survivor):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    doomed_log, survivor_log = _log(tmp_path, "doomed"), _log(tmp_path, "survivor")
    doomed_done, survivor_done = _finished_by(doomed_log), _finished_by(survivor_log)
    assert running.number not in doomed_done and len(survivor_done) == SURVIVOR_TRIALS

    study = optuna.load_study(study_name=STUDY, storage=url)
    trials = study.get_trials()
    by_state = {s: [t for t in trials if t.state == s] for s in State}
    # nothing lost or duplicated: numbers 0..n-1, none left RUNNING or WAITING, each finished by one worker
    assert [t.number for t in trials] == list(range(len(trials)))
    assert not by_state[State.RUNNING] and not by_state[State.WAITING]
    assert sorted(doomed_done + survivor_done + [running.number]) == list(range(len(trials)))
    done = by_state[State.COMPLETE] + by_state[State.PRUNED]
    assert len(done) == SURVIVOR_TRIALS + len(doomed_done) and len(trials) == len(done) + 1

    # the killed trial: FAIL through the heartbeat, retried once, same parameters, completed by the survivor
    [dead] = by_state[State.FAIL]
    assert dead.number == running.number
    [retry] = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retry.state == State.COMPLETE and retry.params == dead.params and retry.number in survivor_done
    assert retry.user_attrs[RUN_ATTR] != dead.user_attrs[RUN_ATTR]

    # every sampled parameter set ends in exactly one finished trial (the dead one's in its retry)
    points = [tuple(sorted(t.params.items())) for t in done]
    assert len(set(points)) == len(done) and {tuple(sorted(t.params.items())) for t in trials} == set(points)

    # the best-params file holds the best COMPLETE trial's parameters
    best = study.best_trial
    assert best.state == State.COMPLETE and best.value == max(t.value for t in by_state[State.COMPLETE])
    text = (tmp_path / "tuning" / f"{STUDY}.yaml").read_text()
    written = yaml.safe_load(text)
    assert written["loss"] == best.params and written["algo"] == "gspo" and written["tuning"] == "tuned"
    assert f"trial {best.number}," in written["source"]

    # the password is masked wherever the URL is written: the YAML, both logs, the MLflow store
    masked = url.replace(password, "***")
    assert masked in written["source"] and masked in survivor_log
    for name, content in [("best-params YAML", text), ("doomed log", doomed_log), ("survivor log", survivor_log),
                          *((str(p), p.read_bytes().decode("latin-1")) for p in tmp_path.rglob("*") if p.is_file())]:
        assert password not in content, name


# -- the URL and the first start ----------------------------------------------------------------------------------
def test_a_driverless_url_means_psycopg3_and_a_missing_driver_is_one_masked_line(monkeypatch):
    import importlib.util

    real, missing = importlib.util.find_spec, set()
    monkeypatch.setattr(importlib.util, "find_spec",  # psycopg 3 installed, then not (nor psycopg2)
                        lambda n, *a: None if n in missing else object() if n == "psycopg" else real(n, *a))
    assert driver_url("postgresql://u:pw1234@h:5432/db") == "postgresql+psycopg://u:pw1234@h:5432/db"
    assert driver_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    for kept in ("sqlite:///optuna.db", "postgresql+psycopg2://u@h/db", "mysql+pymysql://u@h/db"):
        assert driver_url(kept) == kept
    missing.update({"psycopg", "psycopg2"})
    with pytest.raises(ConfigError) as err:
        open_storage("postgresql://u:pw1234@h:5432/db")
    text = str(err.value)
    assert "postgres extra" in text and "pw1234" not in text and "u:***@h" in text and "\n" not in text


def test_open_storage_reads_a_driverless_url_with_psycopg3(pg_server):
    storage = open_storage(pg_server.url.replace("postgresql+psycopg://", "postgresql://"))
    assert storage.engine.url.drivername == "postgresql+psycopg"
    with pytest.raises(ConfigError, match="cannot be opened") as err:  # a wrong password: one line, masked
        open_storage(pg_server.url.replace(pg_server.password, "wrong-secret"))
    text = str(err.value)
    assert "wrong-secret" not in text and "***" in text and "password authentication failed" in text, text
    assert "\n" not in text


@pytest.mark.slow
def test_workers_opening_a_fresh_database_together_do_not_race(pg_server):
    """Three workers open an empty database at the same moment: all succeed. Without the advisory lock in
    ``open_storage``, 4 starts in 5 had one or two fail in CREATE TABLE ("pg_type_typname_nsp_index")."""
    url = pg_server.database("fresh")
    code = ("import sys, optuna, psycopg, sqlalchemy; from gspo_bench.tuning.study import open_storage; "
            "print('ready', flush=True); sys.stdin.readline(); open_storage(sys.argv[1], heartbeat=1); print('opened')")
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
             for _ in range(3)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 3  # all imported: now open together
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 3 and all("opened" in o for o in outs), outs
    assert optuna.get_all_study_summaries(url) == []  # the tables are there, and usable
