"""Checkpoints and resume: a run killed with ``kill -9`` or stopped by SIGTERM/SIGINT
continues as the same MLflow run to the same metric history as an uninterrupted run; orphans are marked
KILLED; signals end commands with 130/143 and no traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest
import torch

from gspo_bench.tracking import lifecycle
from gspo_bench.train import interrupts
from gspo_bench.train import checkpoint
from gspo_bench.config import ConfigError, load_config
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides

# wall times and throughputs differ from run to run; everything else must match to the digit
VOLATILE = ("time/", "throughput/")


def histories(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = mlflow.MlflowClient(uri)
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
            for k in keys if not k.startswith(VOLATILE)}


def runs_of(uri: str, experiment: str) -> list:
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


# -- in process: every piece of state (PPO's critic and two optimisers, DAPO's dynamic sampling, a stale
# sampler's queue, the collapse detector) survives a stop at a step boundary ---------------------------------
def _cfg(mixed_task, uri, experiment, **train):
    o = tiny_overrides(mixed_task, uri, rollout={"staleness": 1},
                       train={"steps": 5, "eval_every": 2, "checkpoint_every": 2, **train},
                       tracking={"tracking_uri": uri, "experiment": experiment})
    return load_config("smoke", overrides={**o, "algos": ["ppo", "dapo"]})


class _SignalAt:
    """A callback that delivers ``signum`` to this process at the end of RL step ``step`` of ``algo``."""

    def __init__(self, algo: str, step: int, signum=signal.SIGTERM):
        self.algo, self.step, self.signum = algo, step, signum

    def __call__(self, module):
        if module.name == self.algo and module.rl_step == self.step:
            os.kill(os.getpid(), self.signum)


def test_a_stopped_run_resumes_to_the_uninterrupted_history(mixed_task, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    quiet = dict(log=lambda *a, **k: None)
    straight = {r.algo: r for r in run(_cfg(mixed_task, uri, "straight"), **quiet)}
    assert all(r.status == "FINISHED" for r in straight.values())

    # SIGTERM at the end of dapo's step 3 (ppo finished before it): checkpoint at 3, KILLED, Interrupted
    hook = _SignalAt("dapo", 3)
    original = checkpoint.Checkpointer.after_step

    def after_step(self, module):
        hook(module)
        original(self, module)

    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", after_step)
    with interrupts.handle_signals(echo=lambda m: None), pytest.raises(interrupts.Interrupted) as info:
        run(_cfg(mixed_task, uri, "stopped"), **quiet)
    e = info.value
    assert e.signum == signal.SIGTERM and e.exit_code == 143 and e.checkpoint_step == 3
    assert [(r.algo, r.status) for r in e.results] == [("ppo", "FINISHED"), ("dapo", "KILLED")]
    [killed] = [r for r in runs_of(uri, "stopped") if r.data.tags["algo"] == "dapo"]
    assert killed.info.status == "KILLED" and killed.data.tags["gspo_bench.checkpoint_step"] == "3"
    assert "SIGTERM at RL step 3" in killed.data.tags["killed_reason"]
    state, problems = checkpoint.load(mlflow.MlflowClient(uri), killed.info.run_id)
    assert state["rl_step"] == 3 and problems == []

    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", original)
    lines: list[str] = []
    resumed = {r.algo: r for r in run(_cfg(mixed_task, uri, "stopped"), resume=True, log=lines.append)}
    # ppo had finished: --resume trains it no more and reads its result back; dapo continues its own run
    [ppo_run] = [r for r in runs_of(uri, "stopped") if r.data.tags["algo"] == "ppo"]
    assert f"[resume] ppo seed 0: already FINISHED (run {ppo_run.info.run_id}): skipped" in lines
    assert resumed["ppo"].earlier and resumed["ppo"].run_id == ppo_run.info.run_id
    assert not resumed["dapo"].earlier and resumed["dapo"].run_id == killed.info.run_id
    # what the summary shows of it is what the run logged: the first step's reward, the last step's metrics
    assert resumed["ppo"].first["reward/mean"] == pytest.approx(straight["ppo"].first["reward/mean"])
    assert resumed["ppo"].last["clip/frac"] == pytest.approx(straight["ppo"].last["clip/frac"])
    runs = runs_of(uri, "stopped")
    assert sorted((r.data.tags["algo"], r.info.status) for r in runs) == [("dapo", "FINISHED"), ("ppo", "FINISHED")]
    assert "killed_reason" not in mlflow.MlflowClient(uri).get_run(killed.info.run_id).data.tags
    assert checkpoint.load(mlflow.MlflowClient(uri), killed.info.run_id) == (None, [])  # finished: nothing left
    for algo in ("ppo", "dapo"):
        want = histories(uri, straight[algo].run_id)
        assert histories(uri, resumed[algo].run_id) == want, algo
        assert resumed[algo].eval_end == straight[algo].eval_end and resumed[algo].eval_log == straight[algo].eval_log
    assert {"collapse/events", "dynamic/kept_groups", "critic/grad_norm"} & set(want)  # the state really mattered


def test_an_orphaned_running_run_is_marked_killed_and_never_averaged(mixed_task, tmp_path, monkeypatch):
    from gspo_bench.reporting.leaderboard import load_runs, summarise

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("orphans")
    orphan = client.create_run(exp, tags={"algo": "grpo", "seed": "0", "preset": "smoke", "tuning": "default",
                                          "gspo_bench.host": socket.gethostname(), "gspo_bench.pid": str(dead.pid),
                                          "gspo_bench.config": "x"})
    client.log_metric(orphan.info.run_id, "eval/pass1", 0.9, step=0)
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, uri, tracking={"experiment": "orphans"}),
                                          "algos": ["grpo"]})
    [res] = run(cfg, log=lambda *a, **k: None)
    got = client.get_run(orphan.info.run_id)
    assert got.info.status == "KILLED" and f"pid {dead.pid}" in got.data.tags["killed_reason"]
    assert res.status == "FINISHED" and res.run_id != orphan.info.run_id
    rows = summarise(load_runs(uri, "orphans"))
    assert sorted((r["status"], r["n"]) for r in rows) == [("FINISHED", 1), ("KILLED", 1)]
    [fin] = [r for r in rows if r["status"] == "FINISHED"]
    assert fin["warm_pass1"] != 0.9  # the orphan's numbers are counted, never averaged in


def test_orphan_rules(monkeypatch):
    class Run:
        def __init__(self, status, **tags):
            self.info = type("I", (), {"status": status})()
            self.data = type("D", (), {"tags": tags})()

    me = socket.gethostname()
    alive = Run("RUNNING", **{"gspo_bench.host": me, "gspo_bench.pid": str(os.getpid()),
                              "gspo_bench.pid_start": lifecycle._start_time(os.getpid())})
    assert lifecycle.orphan_reason(alive) is None
    reused = Run("RUNNING", **{"gspo_bench.host": me, "gspo_bench.pid": str(os.getpid()),
                               "gspo_bench.pid_start": "1"})  # our pid, another process's start time
    assert "is gone" in lifecycle.orphan_reason(reused)
    now = 1_000_000.0
    far = Run("RUNNING", **{"gspo_bench.host": "node-7", "gspo_bench.pid": "12", "gspo_bench.heartbeat": str(now - 60)})
    assert lifecycle.orphan_reason(far, now=now) is None  # another host, beating a minute ago: alive
    assert "no step from host node-7" in lifecycle.orphan_reason(far, now=now + lifecycle.ORPHAN_AFTER_S)
    assert lifecycle.orphan_reason(Run("RUNNING")) is None  # not ours (no owner tags): left alone
    assert lifecycle.orphan_reason(Run("FINISHED", **far.data.tags), now=now * 2) is None


def test_atomic_save_keeps_the_old_checkpoint_when_a_write_fails(tmp_path):
    path = tmp_path / "ckpt" / "last.pt"
    checkpoint.atomic_save({"rl_step": 1, "w": torch.ones(3)}, path)
    with pytest.raises(Exception):
        checkpoint.atomic_save({"rl_step": 2, "bad": lambda: None}, path)  # not picklable: fails mid-write
    assert torch.load(path, weights_only=True)["rl_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left behind


def test_a_remote_artifact_store_gets_the_last_two_checkpoints_as_artifacts(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("remote")).info.run_id
    assert checkpoint.load(client, run_id) == (None, [])
    monkeypatch.setattr(checkpoint, "_local_dir", lambda uri: None)  # as with an mlflow server's artifacts
    for step in (2, 4, 6):
        where = checkpoint.save(client, run_id, _state(step))
    assert where.startswith("artifact checkpoint/step-000006.pt")
    assert [a.path for a in client.list_artifacts(run_id, "checkpoint")] == ["checkpoint/step-000004.pt",
                                                                            "checkpoint/step-000006.pt"]
    got, problems = checkpoint.load(client, run_id, "h")
    assert got["rl_step"] == 6 and torch.equal(got["weights"]["w"], torch.arange(3.0)) and problems == []


# -- checkpoints verified on load, the last two kept -------------------------------------------------------------
def _state(step: int, config_hash: str = "h", **settings) -> dict:
    """A checkpoint with every key ``capture`` writes (small values)."""
    return {"version": checkpoint.VERSION, "config_hash": config_hash, "settings": settings, "rl_step": step,
            "elapsed_s": 1.0, "weights": {"w": torch.arange(3.0)}, "optimizers": [], "records": {}, "sampler": {},
            "verify_timeouts": 0, "callbacks": {}, "rng": {}}


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random bytes":
        path.write_bytes(os.urandom(len(data)))
    else:  # a dict without rl_step, saved as a checkpoint is
        state = torch.load(path, weights_only=True)
        del state["rl_step"]
        torch.save(state, path)


CORRUPTIONS = ("truncated", "empty", "random bytes", "no rl_step")


@pytest.mark.parametrize("how, why", [("truncated", "unreadable (RuntimeError: PytorchStreamReader"),
                                      ("empty", "unreadable (empty file)"),
                                      ("random bytes", "unreadable ("),
                                      ("no rl_step", "not a whole checkpoint: missing rl_step")])
def test_a_corrupt_newest_checkpoint_is_named_and_the_one_before_it_loads(tmp_path, how, why):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("c", artifact_location=str(tmp_path / "art"))).info.run_id
    for step in (2, 4, 6):
        checkpoint.save(client, run_id, _state(step))
    folder = tmp_path / "art" / run_id / "artifacts" / "checkpoint"
    assert sorted(p.name for p in folder.iterdir()) == ["step-000004.pt", "step-000006.pt"]  # the last two kept
    _corrupt(folder / "step-000006.pt", how)
    state, problems = checkpoint.load(client, run_id, "h")
    assert state["rl_step"] == 4
    [(name, reason)] = problems
    assert name == "step-000006.pt" and reason.startswith(why), reason


def test_a_checkpoint_of_other_settings_is_refused_naming_what_differs():
    mine = {"train.lr": 0.001, "loss.eps_high": 0.28, "seeds": [0]}
    theirs = _state(4, "other", **{**mine, "train.lr": 0.002})
    assert checkpoint.verify(theirs, "mine", mine) == "written with other settings: train.lr 0.002 here 0.001"
    assert checkpoint.verify(_state(4, "mine"), "mine", mine) is None
    assert checkpoint.verify({**_state(4), "version": 99}, "h").startswith("format version 99")
    assert checkpoint.verify([1, 2], "h") == "not a gspo-bench checkpoint (it holds a list)"
    assert checkpoint.verify({**_state(4), "rl_step": -1}, "h") == "rl_step -1 is not an RL step"


def _killed_run(mixed_task, uri, experiment, monkeypatch, at: int = 4):
    """A grpo run of 6 steps, checkpointed every step and stopped by SIGTERM at the end of step ``at``."""
    hook, original = _SignalAt("grpo", at), checkpoint.Checkpointer.after_step

    def after_step(self, module):
        hook(module)
        original(self, module)

    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", after_step)
    with interrupts.handle_signals(echo=lambda m: None), pytest.raises(interrupts.Interrupted):
        run(_grpo(mixed_task, uri, experiment), log=lambda *a, **k: None)
    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", original)
    [killed] = runs_of(uri, experiment)
    return killed


def _grpo(mixed_task, uri, experiment, **train):
    o = tiny_overrides(mixed_task, uri, train={"steps": 6, "eval_every": 2, "checkpoint_every": 1, **train},
                       tracking={"tracking_uri": uri, "experiment": experiment})
    return load_config("smoke", overrides={**o, "algos": ["grpo"]})


def _checkpoints(uri, run_id) -> Path:
    from mlflow.utils.file_utils import local_file_uri_to_path

    return Path(local_file_uri_to_path(mlflow.MlflowClient(uri).get_run(run_id).info.artifact_uri)) / "checkpoint"


@pytest.mark.slow
def test_resume_falls_back_past_each_corruption_to_the_same_history(mixed_task, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    [straight] = run(_grpo(mixed_task, uri, "straight"), log=lambda *a, **k: None)
    for how in CORRUPTIONS:
        killed = _killed_run(mixed_task, uri, how, monkeypatch)
        folder = _checkpoints(uri, killed.info.run_id)
        assert sorted(p.name for p in folder.iterdir()) == ["step-000003.pt", "step-000004.pt"]
        _corrupt(folder / "step-000004.pt", how)
        lines: list[str] = []
        [res] = run(_grpo(mixed_task, uri, how), log=lines.append, resume=True)
        assert res.run_id == killed.info.run_id and res.status == "FINISHED", how
        assert any(f"checkpoint step-000004.pt of run {killed.info.run_id} is unusable" in ln for ln in lines), lines
        assert any("from its checkpoint at RL step 3 (the newest usable one)" in ln for ln in lines), lines
        assert histories(uri, res.run_id) == histories(uri, straight.run_id), how


@pytest.mark.slow
def test_no_usable_checkpoint_is_one_line_and_restart_runs_it_afresh_as_the_same_run(mixed_task, tmp_path,
                                                                                     monkeypatch):
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    [straight] = run(_grpo(mixed_task, uri, "straight"), log=lambda *a, **k: None)
    killed = _killed_run(mixed_task, uri, "broken", monkeypatch)
    folder = _checkpoints(uri, killed.info.run_id)
    for path, how in zip(sorted(folder.iterdir()), ("empty", "no rl_step")):
        _corrupt(path, how)
    with pytest.raises(ConfigError) as info:
        run(_grpo(mixed_task, uri, "broken"), log=lambda *a, **k: None, resume=True)
    msg = str(info.value)
    assert "\n" not in msg and f"run {killed.info.run_id} (grpo seed 0) has no usable checkpoint" in msg
    assert "step-000003.pt: unreadable (empty file)" in msg and "missing rl_step" in msg and "--restart" in msg
    assert [r.info.status for r in runs_of(uri, "broken")] == ["KILLED"]  # nothing left RUNNING, nothing lost

    [res] = run(_grpo(mixed_task, uri, "broken"), log=lambda *a, **k: None, resume=True, restart=True)
    assert res.run_id == killed.info.run_id and res.status == "FINISHED"
    assert [r.info.status for r in runs_of(uri, "broken")] == ["FINISHED"]
    assert histories(uri, res.run_id) == histories(uri, straight.run_id)  # one value per step, as uninterrupted


@pytest.mark.slow
def test_a_checkpoint_from_another_config_is_refused_on_resume(mixed_task, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    killed = _killed_run(mixed_task, uri, "mine", monkeypatch)
    folder = _checkpoints(uri, killed.info.run_id)
    # the newest checkpoint as a run with another learning rate writes it: its settings and their digest
    state = torch.load(folder / "step-000004.pt", weights_only=True)
    state["settings"], state["config_hash"] = {**state["settings"], "train.lr": 5e-4}, "0" * 16
    torch.save(state, folder / "step-000004.pt")
    (folder / "step-000003.pt").unlink()
    with pytest.raises(ConfigError, match=r"step-000004.pt: written with other settings: train.lr 0.0005 here "):
        run(_grpo(mixed_task, uri, "mine"), log=lambda *a, **k: None, resume=True)


def test_checkpoint_every_must_be_a_non_negative_int():
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigError, match="train.checkpoint_every"):
            load_config("smoke", overrides={"train": {"checkpoint_every": bad}})


# -- through the command line, as a user (or a scheduler) does it ------------------------------------------------
CLI = [sys.executable, "-m", "gspo_bench", "run", "--preset", "smoke", "--algos", "grpo", "--steps", "4",
       "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2", "--no-progress"]


def _cli(tmp_path, experiment, *extra, cli=CLI, **popen):
    return subprocess.Popen(cli + ["--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--experiment", experiment,
                                   *extra], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)


def _held(tmp_path, experiment, *extra, env=None):
    """The run held after its first checkpoint (``hold_at_checkpoint.py``), and the file that says it is held:
    a signal then lands mid-run on a machine of any speed. Touch ``<that file>.go`` to let it go on."""
    marker = tmp_path / f"{experiment}.held"
    held = [sys.executable, str(Path(__file__).with_name("hold_at_checkpoint.py")), *CLI[3:]]
    proc = _cli(tmp_path, experiment, *extra, cli=held, env={**(env or os.environ), "GSPO_HOLD": str(marker)})
    return proc, marker


def _wait_for(predicate, proc, what: str, timeout: float = 600.0):
    t0 = time.time()
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-2000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def straight_cli(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    proc = _cli(tmp, "straight")
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    uri = f"sqlite:///{tmp}/m.db"
    [r] = runs_of(uri, "straight")
    return histories(uri, r.info.run_id)


def test_kill_9_then_resume_gives_the_same_history_in_one_run(straight_cli, tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    proc, held = _held(tmp_path, "crash")
    _wait_for(held.exists, proc, "its first checkpoint")
    proc.send_signal(signal.SIGKILL)
    # EOF on its output comes at once: the run's verifier worker holds none of its streams, and it exits too
    proc.communicate(timeout=60)
    [r] = runs_of(uri, "crash")
    # killed mid-run, while held at its first checkpoint (RL step 2)
    assert r.info.status == "RUNNING" and r.data.tags["gspo_bench.checkpoint_step"] == held.read_text() == "2"

    again = _cli(tmp_path, "crash", "--resume")
    out, err = again.communicate(timeout=900)
    assert again.returncode == 0, err[-3000:]
    assert f"continuing run {r.info.run_id} from its checkpoint" in out
    [done] = runs_of(uri, "crash")  # one MLflow run, FINISHED, none RUNNING
    assert done.info.run_id == r.info.run_id and done.info.status == "FINISHED"
    got = histories(uri, done.info.run_id)
    assert got == straight_cli  # every metric at every step, to the digit
    assert got["eval/pass1"][-1][0] == 4


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def test_kill_9_of_an_asynchronous_trainer_then_resume_logs_every_step_once(tmp_path):
    """The trainer of an asynchronous run (its sampler a worker process of its own, partial rollouts on) killed
    with SIGKILL after its first checkpoint: its worker ends by itself, and --resume continues the one run to
    FINISHED with every step logged once, the rollouts in flight sampled again."""
    uri = f"sqlite:///{tmp_path}/m.db"
    extra = ("--steps", "4", "--set", "train.checkpoint_every=1", "--set", "rollout.max_staleness=1", "--set",
             "rollout.partial=true")
    proc, held = _held(tmp_path, "async-crash", *extra)
    _wait_for(held.exists, proc, "its first checkpoint")
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    t0 = time.time()
    while any(map(_running, workers)) and time.time() - t0 < 30:
        time.sleep(0.2)
    assert workers and not any(map(_running, workers)), "a worker of the killed trainer is still running"
    [r] = runs_of(uri, "async-crash")
    assert r.info.status == "RUNNING" and r.data.tags["gspo_bench.checkpoint_step"] == held.read_text() == "1"

    again = _cli(tmp_path, "async-crash", *extra, "--resume")
    out, err = again.communicate(timeout=900)
    assert again.returncode == 0, err[-3000:]
    [done] = runs_of(uri, "async-crash")
    assert done.info.run_id == r.info.run_id and done.info.status == "FINISHED"
    got = histories(uri, done.info.run_id)
    for key in ("reward/mean", "train/loss", "async/staleness_mean", "async/partial_frac"):
        assert [s for s, _ in got[key]] == list(range(1, 5)), (key, got[key])  # every step once
    assert done.data.tags["async"] == "true" and done.data.tags["partial"] == "true"


def _running(pid: int) -> bool:
    """``pid`` is a process that has not ended (a zombie waiting for its parent has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# what a SLURM job step sees: Lightning then takes the job for a SLURM one (its own SIGTERM/SIGUSR1 handling)
SLURM = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "gspo", "SLURM_JOB_ID": "4242", "SLURM_NODELIST": "localhost",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}


def test_sigterm_of_a_preempted_slurm_job_stops_with_143_and_the_run_resumes(straight_cli, tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    proc, held = _held(tmp_path, "term", env={**os.environ, **SLURM})
    _wait_for(held.exists, proc, "its first checkpoint")
    proc.send_signal(signal.SIGTERM)
    Path(f"{held}.go").touch()  # on to the end of its next step, where the signal stops it
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err + out
    assert "stopped by SIGTERM" in out and "--resume" in out.split("resume: ", 1)[1]
    [r] = runs_of(uri, "term")
    assert r.info.status == "KILLED" and "SIGTERM" in r.data.tags["killed_reason"]
    step = int(r.data.tags["gspo_bench.checkpoint_step"])
    # Lightning's own SIGTERM handling (a SLURM job) stops it as the next step begins: the resume point is the
    # checkpoint it was held at
    assert str(step) == held.read_text() and f"checkpoint at RL step {step}" in out

    again = _cli(tmp_path, "term", "--resume")
    out, err = again.communicate(timeout=900)
    assert again.returncode == 0, err[-3000:]
    [done] = runs_of(uri, "term")
    assert done.info.run_id == r.info.run_id and done.info.status == "FINISHED"
    assert histories(uri, done.info.run_id) == straight_cli


def test_sigint_during_the_warm_start_exits_130_without_a_traceback(tmp_path):
    env = {**os.environ, "GSPO_BENCH_CACHE": str(tmp_path / "empty-cache")}
    proc = _cli(tmp_path, "ws", env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    _wait_for(lambda: any("warm start: supervised" in ln for ln in lines), proc, "the warm start")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err
    assert "stopped by SIGINT during the warm start of seed 0" in out
    assert not runs_of(f"sqlite:///{tmp_path}/m.db", "ws")  # nothing was started, nothing left RUNNING
    assert not [p for p in Path(tmp_path / "empty-cache").rglob(".tmp-*")]


# -- through the command: a stopped `run --algos ...` resumed with --resume trains only what had not finished ----
@pytest.mark.parametrize("signum, algos, seeds, stop", [
    (signal.SIGTERM, "grpo,dapo,gspo", "1", ("dapo", 0, 2)),  # one seed: grpo finished, dapo stopped, gspo not begun
    (signal.SIGINT, "grpo,dapo", "2", ("grpo", 1, 2)),  # two seeds: seed 0 finished, seed 1's grpo stopped
], ids=["sigterm-one-seed", "sigint-two-seeds"])
def test_a_stopped_run_resumed_trains_only_what_had_not_finished(tmp_path, monkeypatch, capsys, signum, algos,
                                                                  seeds, stop):
    from gspo_bench.cli.main import main

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--preset", "smoke", "--algos", algos, "--seeds", seeds, "--steps", "4", "--set",
            "train.checkpoint_every=2", "--no-progress", "--tracking-uri", uri, "--experiment", "e"]
    original = checkpoint.Checkpointer.after_step

    def after_step(self, module):
        original(self, module)
        if (module.name, module.seed, module.rl_step) == stop:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", after_step)
    assert main(argv) == (143 if signum == signal.SIGTERM else 130)
    out = capsys.readouterr().out
    resume = out.split("resume: python -m gspo_bench ", 1)[1].split()
    assert resume == argv + ["--resume"]
    before = {(r.data.tags["algo"], r.data.tags["seed"]): r for r in runs_of(uri, "e")}
    finished = {cell for cell, r in before.items() if r.info.status == "FINISHED"}
    stopped = (stop[0], str(stop[1]))
    assert before[stopped].info.status == "KILLED" and finished and stopped not in finished

    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", original)
    assert main(resume) == 0
    out = capsys.readouterr().out
    cells = {(a, str(s)) for a in algos.split(",") for s in range(int(seeds))}
    after = {(r.data.tags["algo"], r.data.tags["seed"]): r for r in runs_of(uri, "e")}
    assert set(after) == cells and len(runs_of(uri, "e")) == len(cells)  # one run per cell: nothing repeated
    assert all(r.info.status == "FINISHED" for r in after.values())
    for a, s in finished:  # not trained again: the same run, ended when it first ended
        assert f"[resume] {a} seed {s}: already FINISHED (run {before[a, s].info.run_id}): skipped" in out
        assert after[a, s].info.end_time == before[a, s].info.end_time
    at = before[stopped].data.tags["gspo_bench.checkpoint_step"]
    assert f"continuing run {before[stopped].info.run_id} from its checkpoint at RL step {at}" in out
    # the summary covers every cell, the ones read back marked as such
    rows = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert len(rows) == len(cells)
    assert sum("FINISHED (earlier)" in ln for ln in rows) == len(finished)
