"""One study's trials for ``tune``: the objective, the study with its MLflow parent run, the optimise loop.

Each trial is an MLflow run nested under one parent run per study (tag
``mlflow.parentRunId``), tagged ``tuning=trial``, ``study`` and ``trial``;
the trial's user attribute ``mlflow_run_id`` holds the run's id and the
study's ``mlflow_parent_run_id`` the parent's. The parent (tag
``kind=study``) collects the study's counts, best value and parameters and
the best-params YAML when a worker ends.

Several workers may open one study at the same moment. The worker whose
``create_study`` succeeds (the storage's unique study name is the lock)
records the study's settings and creates the parent run; the others load the
study and wait for the parent's id, so a study has one parent however many
workers join, and re-running the command reuses it. A worker that joins a
study made for another algorithm, task, model, preset or search space gets a
ConfigError instead of mixing incomparable trials.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback

from gspo_bench.config import ConfigError, RunConfig, deep_merge, load_config
from gspo_bench.tracking.client import run_lifetime, start_run
from gspo_bench.tracking.redact import redact, redact_nested
from gspo_bench.tracking.ui import mark_experiment
from gspo_bench.tuning.study import (LR_FACTOR, OBJECTIVE, PARENT_ATTR, RUN_ATTR, Progress, StudyOutcome, TrialFailed,
                               TuneRequest, best_of, counts, fmt_params, make_pruner, objective_value,
                               wait_for_attr, write_best)

STUDY_KEYS = ("algo", "task", "model", "preset", "params")  # a study's identity: joiners must match


@dataclass
class Shared:
    """What every study of one ``tune`` command shares: settings, stores, the task and its warm start."""

    req: TuneRequest
    cfg: RunConfig
    uri: str  # MLflow tracking URI
    storage: optuna.storages.RDBStorage
    client: object  # mlflow.MlflowClient
    exp_id: str
    task: object  # tasks.Task
    ws: object  # warmstart.WarmStart
    log: Callable


class RLStepPruning(PyTorchLightningPruningCallback):
    """Optuna's Lightning pruning callback, reporting at the RL step instead of the epoch.

    The stock callback reports ``trial.report(value, step=current_epoch)``;
    here one epoch holds every RL step, so every report would land on step 0
    and the pruner would compare only the first evaluation. This one reports
    at ``pl_module.rl_step``, and never prunes at the last RL step (the
    trial is done by then; pruning would only discard its result). It also
    records the trial's MLflow run id as the trial's user attribute the
    moment the run exists (fit start), so even a pruned or killed trial links
    to its run. Single process only (no DDP).
    """

    def __init__(self, trial: optuna.Trial, monitor: str):
        super().__init__(trial, monitor)
        self.run_id: str | None = None
        self.step = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        super().on_fit_start(trainer, pl_module)
        self.run_id = getattr(trainer.logger, "run_id", None)
        if self.run_id:
            self._trial.set_user_attr(RUN_ATTR, self.run_id)
        # evaluations are the module's own (not Lightning's validation loop): hear each one as it is recorded
        pl_module.eval_listeners.append(lambda step, metrics: self.on_eval(pl_module, step, metrics))

    def on_eval(self, pl_module, step: int, metrics: dict[str, float]) -> None:
        score = metrics.get(self.monitor)
        if score is None or step == 0:  # step 0 is the warm start: the same for every trial
            return
        self.step = step
        self._trial.report(float(score), step=step)
        # the last evaluation ends the trial anyway: its objective decides, a prune would only throw it away
        if step < pl_module.cfg.train.steps and self._trial.should_prune():
            raise optuna.TrialPruned(f"pruned at RL step {step} ({self.monitor} = {float(score):.4f})")


def prepare(req: TuneRequest, cfg: RunConfig, uri: str, storage, log) -> Shared:
    """The MLflow experiment (made once, under the SQLite lock) and the warm start, done once for every trial."""
    from gspo_bench.tracking.client import client as tracking_client
    from gspo_bench.tracking.stores import ensure_experiment
    from gspo_bench.tasks import load_task
    from gspo_bench.train.warmstart import warm_start

    exp_id = ensure_experiment(uri, cfg.tracking.experiment, cfg.tracking.artifact_location)
    client = tracking_client(uri)
    mark_experiment(client, exp_id)  # the UI opens it on runs and charts
    seed = cfg.seeds[0]
    task = load_task(cfg.task, seed, cfg.model, cfg.rollout.response_cap(), log, cfg.task_options)
    ws = warm_start(task, cfg.model, cfg.warmstart, seed, task.spec.max_new_tokens, progress=cfg.train.progress,
                    log=log, env=cfg.env)
    if ws.cached:
        log(f"warm start (cached): greedy pass@1 {ws.pass1:.1%} -> {ws.path}")
    return Shared(req, cfg, uri, storage, client, exp_id, task, ws, log)


def study_name(shared: Shared, algo: str) -> str:
    req, cfg = shared.req, shared.cfg
    if req.study:
        return req.study if req.algo != "all" else f"{req.study}-{algo}"
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(cfg.model.name).name)
    return f"{algo}-{shared.task.name}-{model}-{cfg.preset}"


class Objective:
    """One trial: sample, train with the pruning callback, return ``objective_value`` (see ``tuning``)."""

    def __init__(self, shared: Shared, algo: str, params: tuple[str, ...], study: str, parent: str, metric: str):
        from gspo_bench import algorithms

        self.s, self.algo, self.params, self.study, self.parent, self.metric = (shared, algo, params, study,
                                                                                 parent, metric)
        algorithms.get(algo)  # an unknown name fails here, before any trial
        self.sample = functools.partial(algorithms.search_space, algo)

    def space(self, trial: optuna.Trial) -> dict:
        """The algorithm's clip search space, plus the learning rate when asked for."""
        over = self.sample(trial, [p for p in self.params if p != "lr"])
        if "lr" in self.params:
            lr = self.s.cfg.train.lr
            over["train"] = {"lr": trial.suggest_float("lr", lr / LR_FACTOR, lr * LR_FACTOR, log=True)}
        return over

    def __call__(self, trial: optuna.Trial) -> float:
        from gspo_bench.train.runner import RunOptions, run_one

        s = self.s
        over = self.space(trial)
        trial.set_user_attr("overrides", over)
        tags = {"study": self.study, "trial": str(trial.number), "optuna.storage": redact(s.req.storage)}
        retry_of = trial.user_attrs.get("trial_number")  # a retried trial inherits its predecessor's attributes
        if retry_of is not None:
            tags["retry_of"] = str(retry_of)
        trial.set_user_attr("trial_number", trial.number)
        cfg = load_config(s.req.preset, s.req.config_files,
                          deep_merge(deep_merge(s.req.overrides, {"algos": [self.algo], "tuning": "trial"}), over))
        prune = RLStepPruning(trial, self.metric)
        try:
            res = run_one(cfg, self.algo, cfg.seeds[0], s.task, s.ws, s.uri, s.log, RunOptions(
                callbacks=(prune,), tags=tags, parent_run_id=self.parent, run_name=f"{self.algo}-trial{trial.number}",
                interrupts=(optuna.TrialPruned,)))
        except optuna.TrialPruned:
            if prune.run_id:
                s.client.set_tag(prune.run_id, "pruned", "true")
                s.client.set_tag(prune.run_id, "pruned.step", str(prune.step))
            raise
        if res.status != "FINISHED":
            raise TrialFailed(f"trial {trial.number}: {res.error}")
        value = objective_value([(st, m[self.metric]) for st, m in res.eval_log if self.metric in m],
                                res.collapse_events)
        trial.set_user_attr("collapses", res.collapse_events)
        s.client.log_metric(res.run_id, "tune/objective", value)
        return value


def open_study(shared: Shared, name: str, meta: dict, pruner) -> tuple[optuna.Study, str]:
    """Create or join the study; returns it with its MLflow parent run id (see the module docstring)."""
    req, client = shared.req, shared.client
    parent = None
    try:
        study = optuna.create_study(study_name=name, storage=shared.storage, pruner=pruner, direction="maximize")
        for k, v in meta.items():
            study.set_user_attr(k, v)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=shared.storage, pruner=pruner)
        parent = wait_for_attr(study, PARENT_ATTR)
        theirs = study.user_attrs
        diff = [k for k in STUDY_KEYS if k in theirs and theirs[k] != meta[k]]
        if diff or study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ConfigError(f"study {name!r} in {redact(req.storage)} was made with "
                              f"{', '.join(f'{k}={theirs[k]!r}' for k in diff) or 'another direction'}, "
                              f"not {', '.join(f'{k}={meta[k]!r}' for k in diff)}; pick another --study")
    if parent is None:  # the creator, or a joiner whose creator died before making the parent
        tags = {"kind": "study", "study": name, "optuna.storage": redact(req.storage),
                **{k: str(meta[k]) for k in ("algo", "task", "model", "preset")}}
        parent = start_run(client, shared.exp_id, redact(f"study-{name}"), redact_nested(tags))
        study.set_user_attr(PARENT_ATTR, parent)
    # TPE, random for the first 4 trials; constant_liar: running trials count as bad ones, so parallel workers
    # spread out. A seeded sampler restarts its stream, so the seed is offset by the trials already in the
    # study: a resumed run does not repeat them (workers started together with one seed would).
    seed = None if req.sampler_seed is None else req.sampler_seed + len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(n_startup_trials=4, seed=seed, constant_liar=True)
    return study, parent


def run_study(shared: Shared, algo: str, params: tuple[str, ...]) -> StudyOutcome:
    """Run this worker's trials of one study, then write the best parameters and update the parent run."""
    req, cfg, client, log = shared.req, shared.cfg, shared.client, shared.log
    metric = "eval/reward_mean" if cfg.train.eval_samples > 0 else "eval/pass1"
    meta = {"algo": algo, "task": shared.task.name, "model": cfg.model.name, "preset": cfg.preset,
            "params": list(params), "metric": metric, "objective": OBJECTIVE.format(metric=metric),
            "mlflow_tracking_uri": redact(shared.uri), "mlflow_experiment": cfg.tracking.experiment}
    name = study_name(shared, algo)
    study, parent = open_study(shared, name, meta, make_pruner(req.pruner, cfg.train.steps))
    before = counts(study)
    log(f"tune: study {name} in {redact(req.storage)}: {algo}, searching {', '.join(params)}; "
        f"trials so far: {sum(before.values())}; objective = {meta['objective']}; pruner {req.pruner}; "
        f"MLflow parent run {parent}")
    client.update_run(parent, status="RUNNING")
    t0 = time.perf_counter()
    out = StudyOutcome(name, before, parent_run_id=parent)
    # the parent run ends FINISHED once the best parameters are written, KILLED however else this worker stops
    with run_lifetime(client, parent, on_error="KILLED"):
        try:
            study.optimize(Objective(shared, algo, params, name, parent, metric), n_trials=req.trials,
                           timeout=req.timeout, callbacks=[Progress(req.trials, log)], catch=(TrialFailed,),
                           gc_after_trial=True)
            out.path = write_best(study, req, algo, metric)
        finally:
            out.seconds = time.perf_counter() - t0
            out.counts, best = counts(study), best_of(study)
            for state, n in out.counts.items():
                client.set_tag(parent, f"trials.{state.lower()}", str(n))
            if best is not None:
                out.best_value, out.best_params, out.best_trial = best.value, dict(best.params), best.number
                client.log_metric(parent, "tune/best_value", best.value, step=out.counts["COMPLETE"])
                client.set_tag(parent, "best.trial", str(best.number))
                client.set_tag(parent, "best.params", fmt_params(best.params))
            if out.path is not None:
                client.log_artifact(parent, str(out.path))
    return out
