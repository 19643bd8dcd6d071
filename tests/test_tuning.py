"""``tune``: search spaces, a resumed study on the smoke preset, pruning, MLflow links, the best-params file,
tuned vs default on the leaderboard, the report's study figures, two workers on one storage, a killed worker,
and bad input.

In-process studies use the ``mixed_task`` (rewards without a warm start); the worker subprocesses cannot
see that test verifier, so they tune ``arith`` without a warm start (zero reward, plumbing only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml

from gspo_bench.algorithms import search_space
from gspo_bench.cli.main import main
from gspo_bench.config import load_config
from gspo_bench.reporting.leaderboard import collect
from gspo_bench.core.losses import LOSSES
from gspo_bench.tuning.study import COLLAPSE_PENALTY, RUN_ATTR, chosen_params, objective_value

TINY = {"warmstart": {"enabled": False}, "rollout": {"prompts_per_step": 4, "group_size": 4},
        "train": {"steps": 2, "minibatches": 2, "eval_every": 1, "eval_prompts": 8, "eval_samples": 2, "lr": 1e-3}}
DONE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
STUDY = "gspo-mixed"


def _yaml(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _trial_runs(uri: str, exp: str = "gspo_bench") -> list:
    client = mlflow.MlflowClient(uri)
    e = client.get_experiment_by_name(exp)
    return [] if e is None else client.search_runs([e.experiment_id])


# -- search spaces and the objective (no training) ---------------------------------------------------------------
@pytest.mark.parametrize("algo", list(LOSSES))
def test_search_space_ranges_and_overrides_load(algo):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    for _ in range(60):
        trial = study.ask()
        over = search_space(algo, trial)
        study.tell(trial, 0.0)
        load_config("smoke", overrides={**over, "algos": [algo]})  # every sample is a valid config
        # each sampled parameter lies in the algorithm's declared range, and only searched ones are sampled
        ranges = LOSSES[algo].search_ranges()
        assert set(over["loss"]) == set(LOSSES[algo].searched_by_default()) & set(ranges), over
        for name, value in over["loss"].items():
            low, high, _ = ranges[name]
            assert low <= value <= high, (name, value)
        lo, hi = over["loss"].get("eps_low"), over["loss"].get("eps_high")
        if algo in ("ppo", "grpo", "dapo"):
            spec = LOSSES[algo]
            assert 0.5 * spec.eps_low <= lo <= hi <= 1.5 * spec.eps_high  # clip-higher: eps_high >= eps_low
        elif algo in ("gspo", "gspo_token"):
            assert 1e-5 <= lo <= 1e-2 and 1e-5 <= hi <= 1e-2
        elif algo == "cispo":  # the lower bound stays off unless asked for
            assert lo is None and 0.5 <= hi <= 10
        elif algo == "sapo":  # temperatures around the published 1.0 / 1.05
            assert 0.25 <= over["loss"]["tau_pos"] <= 4 and 0.25 <= over["loss"]["tau_neg"] <= 4
    # fixed ranges (Optuna's importance refuses ranges that move between trials)
    assert len({str(t.distributions) for t in study.trials}) == 1
    if algo == "cispo":
        both = search_space(algo, optuna.trial.FixedTrial({"eps_low": 0.3, "eps_high": 2.0}), ["eps_low", "eps_high"])
        assert both == {"loss": {"eps_high": 2.0, "eps_low": 0.3}}


def test_chosen_params_defaults_lr_and_errors():
    from gspo_bench.config import ConfigError

    assert chosen_params(LOSSES["gspo"], None, False) == ("eps_low", "eps_high")
    assert chosen_params(LOSSES["cispo"], None, True) == ("eps_high", "lr")
    assert chosen_params(LOSSES["dapo"], ("eps_high",), False) == ("eps_high",)
    with pytest.raises(ConfigError, match="empty search space"):
        chosen_params(LOSSES["gspo"], (), False)
    with pytest.raises(ConfigError, match="eps_mid"):
        chosen_params(LOSSES["gspo"], ("eps_mid",), False)


def test_pruners_wait_for_the_halfway_step_except_threshold():
    from gspo_bench.tuning.study import make_pruner

    median, pct, thr = make_pruner("median", 40), make_pruner("percentile:25:1", 40), make_pruner("threshold:0.2", 40)
    assert (type(median).__name__, median._n_startup_trials, median._n_warmup_steps) == ("MedianPruner", 3, 20)
    assert (pct._n_startup_trials, pct._n_warmup_steps, pct._percentile) == (1, 20, 25.0)
    assert type(thr).__name__ == "ThresholdPruner" and type(make_pruner("none", 40)).__name__ == "NopPruner"


def test_objective_is_mean_of_last_two_evals_minus_collapse_penalty():
    curve = [(0, 0.9), (1, 0.2), (2, 0.4), (3, 0.6)]
    assert objective_value(curve, 0) == pytest.approx(0.5)
    assert objective_value(curve, 2) == pytest.approx(0.5 - 2 * COLLAPSE_PENALTY)
    assert objective_value([(0, 0.3), (1, 0.7)], 0) == pytest.approx(0.7)  # step 0 never counts


# -- one study, in this process ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def studied(tmp_path_factory, mixed_task):
    """3 trials, then the same command again with 1 more (a resumed study), on the smoke preset, lr searched too."""
    root = tmp_path_factory.mktemp("tune")
    cwd = os.getcwd()
    os.chdir(root)  # MLflow's artifact folder (./mlruns) lands here
    try:
        tiny = _yaml(root / "tiny.yaml", {**TINY, "task": mixed_task})
        uri, storage = f"sqlite:///{root}/mlflow.db", f"sqlite:///{root}/optuna.db"
        argv = ["tune", "--algo", "gspo", "--tune-lr", "--preset", "smoke", "--config", tiny, "--study", STUDY,
                "--storage", storage, "--tracking-uri", uri, "--out", str(root / "tuning"), "--no-progress"]
        lines: list[str] = []
        import gspo_bench.cli.main as cli

        original = cli.console.print
        cli.console.print = lambda *a, **k: (lines.append(" ".join(map(str, a))), original(*a, **k))
        try:
            codes = [main([*argv, "--trials", "3"]), main([*argv, "--trials", "1"])]
        finally:
            cli.console.print = original
    finally:
        os.chdir(cwd)
    return {"root": root, "tiny": tiny, "uri": uri, "storage": storage, "codes": codes, "lines": lines,
            "study": optuna.load_study(study_name=STUDY, storage=storage)}


def test_a_four_trial_study_completes_and_a_rerun_continues_it(studied):
    assert studied["codes"] == [0, 0]
    trials = studied["study"].get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3] and all(t.state in DONE for t in trials)
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # the second command said where it picked up, and its trial is number 3
    assert any("trials so far: 3;" in ln for ln in studied["lines"])
    assert any("tune: trial 3 " in ln for ln in studied["lines"])
    # progress: done, pruned, best so far
    progress = [ln for ln in studied["lines"] if ln.startswith("tune: trial")]
    assert len(progress) == 4 and all("done" in ln and "pruned" in ln and "best" in ln for ln in progress)
    # the pruner saw the in-loop evals at RL steps 1 and 2, not at the epoch (always 0)
    assert all(set(t.intermediate_values) <= {1, 2} and t.intermediate_values for t in trials)
    # and never pruned a trial at its last step (step 2): that trial is finished, its objective decides
    assert all(max(t.intermediate_values) < 2 for t in trials if t.state == optuna.trial.TrialState.PRUNED)


def test_each_trial_is_an_mlflow_run_nested_under_one_parent_per_study(studied):
    runs = _trial_runs(studied["uri"])
    parents = [r for r in runs if r.data.tags.get("kind") == "study"]
    assert len(parents) == 1  # the resumed command reused it
    parent = parents[0]
    study = studied["study"]
    assert study.user_attrs["mlflow_parent_run_id"] == parent.info.run_id
    assert parent.data.tags["study"] == STUDY and parent.data.tags["trials.complete"] == str(
        sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials))
    children = {r.info.run_id: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert len(children) == 4
    client = mlflow.MlflowClient(studied["uri"])
    for t in study.trials:
        run = children[t.user_attrs[RUN_ATTR]]
        assert run.data.tags["study"] == STUDY and run.data.tags["trial"] == str(t.number)
        assert run.data.tags["tuning"] == "trial"
        assert float(run.data.params["resolved.loss.eps_high"]) == pytest.approx(t.params["eps_high"])
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert run.info.status == "FINISHED"
            curve = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/reward_mean")]
            expected = objective_value(curve, int(run.data.tags.get("collapse.count", "0")))
            assert t.value == pytest.approx(expected) and run.data.metrics["tune/objective"] == pytest.approx(t.value)
        else:
            assert run.info.status == "KILLED" and run.data.tags["pruned"] == "true"


def test_best_params_file_loads_back_and_reruns_as_tuned_beside_default(studied):
    path = studied["root"] / "tuning" / f"{STUDY}.yaml"
    best = studied["study"].best_trial
    cfg = load_config("smoke", (str(path),))
    assert cfg.algos == ["gspo"] and cfg.tuning == "tuned" and STUDY in cfg.source
    assert cfg.loss.eps_low == best.params["eps_low"] and cfg.loss.eps_high == best.params["eps_high"]
    assert cfg.train.lr == best.params["lr"] and 1e-3 / 5 <= cfg.train.lr <= 1e-3 * 5  # --tune-lr, around 1e-3
    assert cfg.train.steps == 2 and cfg.warmstart.enabled is False  # what the trials ran with
    root, uri = studied["root"], studied["uri"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        common = ["--preset", "smoke", "--tracking-uri", uri, "--experiment", "tuned-vs-default", "--no-progress"]
        assert main(["run", "--config", str(path), *common]) == 0
        assert main(["run", "--algos", "gspo", "--config", studied["tiny"], *common]) == 0
    finally:
        os.chdir(cwd)
    rows = collect(uri, "tuned-vs-default")
    assert sorted((r["config"], r["algo"], r["status"]) for r in rows) == [
        ("default", "gspo", "FINISHED"), ("tuned", "gspo", "FINISHED")]
    # the study's own experiment: trials and the study's parent run never reach the leaderboard
    assert main(["leaderboard", "--tracking-uri", uri, "--experiment", "gspo_bench"]) == 2


def test_report_adds_trial_history_and_parameter_importance(studied, tmp_path):
    out = tmp_path / "report"
    assert main(["report", "--tracking-uri", studied["uri"], "--experiment", "tuned-vs-default", "--out", str(out),
                 "--storage", studied["storage"], "--study", STUDY]) == 0
    md = (out / "report.md").read_text()
    assert "## Tuning studies" in md and f"### Study `{STUDY}`" in md
    assert (out / f"tune_history_{STUDY}.png").read_bytes()[:4] == b"\x89PNG"
    importance = out / f"tune_importance_{STUDY}.png"
    assert importance.exists() or "Parameter importance skipped:" in md
    assert main(["report", "--tracking-uri", studied["uri"], "--experiment", "tuned-vs-default", "--out",
                 str(out), "--storage", studied["storage"], "--study", "nope"]) == 2


def test_study_section_draws_importance_or_says_why_not(tmp_path):
    from gspo_bench.reporting.study import study_section

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("algo", "cispo")
    study.optimize(lambda t: -abs(t.suggest_float("eps_high", 0.5, 10, log=True) - 3) + 0 * t.suggest_float(
        "eps_low", 0.1, 0.9), n_trials=1)
    md, figs = study_section(study, tmp_path, "one")
    assert [f.name for f in figs] == ["tune_history_one.png"]
    assert any("importance skipped: 1 complete trial" in ln for ln in md)
    study.optimize(lambda t: -abs(t.suggest_float("eps_high", 0.5, 10, log=True) - 3) + 0 * t.suggest_float(
        "eps_low", 0.1, 0.9), n_trials=15)
    md, figs = study_section(study, tmp_path, "many")
    assert [f.name for f in figs] == ["tune_history_many.png", "tune_importance_many.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in figs) and "`cispo`" in md[2]


def test_an_aggressive_pruner_prunes(mixed_task, tmp_path, monkeypatch):
    """threshold:1.01 prunes any trial whose eval reward is under 1.01, i.e. every one, at its first eval."""
    monkeypatch.chdir(tmp_path)
    tiny = _yaml(tmp_path / "tiny.yaml", {**TINY, "task": mixed_task})
    uri, storage = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    code = main(["tune", "--algo", "cispo", "--preset", "smoke", "--config", tiny, "--trials", "2", "--pruner",
                 "threshold:1.01", "--storage", storage, "--tracking-uri", uri, "--out", str(tmp_path / "t"),
                 "--no-progress"])
    assert code == 1  # no trial completed, so no best parameters
    [study] = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [1] for t in trials)
    runs = [r for r in _trial_runs(uri) if r.data.tags.get("tuning") == "trial"]
    assert sorted((r.info.status, r.data.tags["pruned"], r.data.tags["pruned.step"]) for r in runs) == [
        ("KILLED", "true", "1")] * 2
    assert not (tmp_path / "t").exists()


# -- bad input -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--algo", "trpo"], "'trpo'"),
    (["--algo", "gspo", "--storage", "sqlite:////nonexistent/dir/x.db"], "unreachable"),
    (["--algo", "gspo", "--storage", "postgresql://nobody@127.0.0.1:1/x"], "does not answer"),
    (["--algo", "gspo", "--storage", "optuna.db"], "not a database URL"),
    (["--algo", "gspo", "--params", ""], "empty search space"),
    (["--algo", "cispo", "--params", "eps_mid"], "eps_mid"),
    (["--algo", "gspo", "--pruner", "bogus"], "bogus"),
    (["--algo", "gspo", "--trials", "0"], "--trials=0"),
    (["--algo", "clip_cov", "--set", "loss.clip_cov_lb=6"], "loss.clip_cov_lb=6 must be below loss.clip_cov_ub=5"),
    (["--algo", "grpo", "--set", "loss.entropy_coef=5", "--set", "loss.entropy_target=0.2"],
     "loss.entropy_coef=5 must be within"),
])
def test_bad_input_is_one_line_exit_2_and_leaves_no_run(argv, needle, tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    storage = [] if "--storage" in argv else ["--storage", f"sqlite:///{tmp_path}/optuna.db"]
    code = main(["tune", "--preset", "smoke", "--tracking-uri", f"sqlite:///{db}", "--no-progress", *storage, *argv])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and needle in text and "error" in text
    assert len(text.splitlines()) == 1, text
    assert not db.exists() and not (tmp_path / "optuna.db").exists()
    if "trpo" in argv:
        assert all(a in text for a in LOSSES) and "all" in text


# -- worker processes ------------------------------------------------------------------------------------------------
def _worker(tmp: Path, *argv: str, steps: int = 2, log: str = "worker.log") -> subprocess.Popen:
    """``python -m gspo_bench tune`` on arith without a warm start, in ``tmp``."""
    cfg = _yaml(tmp / "arith.yaml", {**TINY, "task": "arith", "train": {**TINY["train"], "steps": steps}})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "gspo_bench", "tune", "--algo", "gspo", "--preset", "smoke", "--config", cfg,
           "--study", "shared", "--storage", f"sqlite:///{tmp}/optuna.db", "--tracking-uri",
           f"sqlite:///{tmp}/mlflow.db", "--out", str(tmp / "tuning"), "--no-progress", *argv]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=open(tmp / log, "w"), stderr=subprocess.STDOUT)


def _wait(proc: subprocess.Popen, tmp: Path, log: str) -> None:
    assert proc.wait(timeout=300) == 0, (tmp / log).read_text()[-3000:]


@pytest.mark.slow
def test_two_workers_share_one_study_without_duplicates(tmp_path):
    a = _worker(tmp_path, "--trials", "2", log="a.log")
    b = _worker(tmp_path, "--trials", "2", log="b.log")
    _wait(a, tmp_path, "a.log")
    _wait(b, tmp_path, "b.log")
    trials = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path}/optuna.db").trials
    assert sorted(t.number for t in trials) == [0, 1, 2, 3] and all(t.state in DONE for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4
    runs = _trial_runs(f"sqlite:///{tmp_path}/mlflow.db")
    [parent] = [r for r in runs if r.data.tags.get("kind") == "study"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["trial"] for r in children) == ["0", "1", "2", "3"]
    assert {t.user_attrs[RUN_ATTR] for t in trials} == {r.info.run_id for r in children}


@pytest.mark.slow
def test_a_killed_worker_leaves_no_trial_running_and_the_trial_is_retried(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    doomed = _worker(tmp_path, "--trials", "1", "--heartbeat", "1", steps=200, log="doomed.log")
    running = None
    deadline = time.monotonic() + 240
    while running is None and time.monotonic() < deadline and doomed.poll() is None:
        time.sleep(0.5)
        if "tune: study" not in (tmp_path / "doomed.log").read_text():
            continue  # until the worker has made the study (and its tables), reading could race it
        try:
            trials = optuna.load_study(study_name="shared", storage=storage).trials
        except Exception:  # the worker holds the SQLite write lock a moment too long: ask again
            continue
        running = next((t for t in trials if t.state == optuna.trial.TrialState.RUNNING and RUN_ATTR in t.user_attrs),
                       None)
    assert running is not None, (tmp_path / "doomed.log").read_text()[-3000:]
    time.sleep(2)  # mid-trial: some RL steps in
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    time.sleep(3)  # past the grace period (2 x 1 s heartbeat)
    rescuer = _worker(tmp_path, "--trials", "1", "--heartbeat", "1", log="rescuer.log")
    _wait(rescuer, tmp_path, "rescuer.log")
    first, retry = optuna.load_study(study_name="shared", storage=storage).trials
    assert first.state == optuna.trial.TrialState.FAIL  # not RUNNING forever
    assert retry.state == optuna.trial.TrialState.COMPLETE and retry.params == first.params
    assert retry.system_attrs["failed_trial"] == first.number
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    dead = client.get_run(first.user_attrs[RUN_ATTR])
    assert dead.info.status == "KILLED" and dead.data.tags["stale"] == "true"
    redo = client.get_run(retry.user_attrs[RUN_ATTR])
    assert redo.info.status == "FINISHED" and redo.data.tags["retry_of"] == str(first.number)
