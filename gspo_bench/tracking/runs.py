"""One training run's MLflow record, as ``train.runner`` drives it from start to end.

- ``quiet``: the console kept to gspo_bench's own lines and the progress bar, before any store is opened
  (MLflow's INFO lines, Lightning's and transformers' warnings, datasets' bars).
- ``finished_run``: with ``--resume``, the FINISHED run of one (algorithm, seed) and settings, read back as
  ``FinishedRun`` (the numbers a summary shows), so the work is not repeated.
- ``prior_run``: the first contact with the store for one (algorithm, seed): the experiment's orphaned runs
  are marked KILLED (``lifecycle.mark_orphans``) and, with ``--resume``, the run to continue is found
  (``lifecycle.find_resumable``). Loading its checkpoint is ``train.checkpoint``'s.
- ``open_run``: a new run with its tags, params and ``config.yaml``, or an unfinished run again (RUNNING, this
  process its owner); the Lightning logger that writes its metrics.
- ``tag_run``, ``attach_text``, ``end_run``, ``log_wall_time``: what the runner records as the run goes on and
  how it ends (status, reason tag, wall time).

A rank other than 0 of a multi-process run holds no run: ``prior_run`` finds none, ``open_run`` hands it
``OtherRankLogger`` (every call does nothing) without opening the store, and the other functions do nothing.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import yaml
from lightning.pytorch.loggers.logger import DummyLogger

from gspo_bench import __version__
from gspo_bench.config import RunConfig, flatten
from gspo_bench.core.collectives import launch_rank_zero
from gspo_bench.tracking import stores
from gspo_bench.tracking.client import end_run as ending
from gspo_bench.tracking.digest import config_digest
from gspo_bench.tracking.lifecycle import (ResumedLogger, RunLogger, find_finished, find_resumable, mark_orphans,
                                           owner_tags)
from gspo_bench.tracking.provenance import git_commit, machine
from gspo_bench.tracking.redact import redact, redact_nested
from gspo_bench.tracking.ui import NOTE_TAG, mark_experiment, run_description


def quiet() -> None:
    """Keep the console to what a user needs: our lines and the progress bar."""
    import datasets
    import mlflow  # noqa: F401  (import first: it sets its own log levels on import)
    import transformers

    # urllib3 logs every retry of a tracking server that does not answer: the one line that ends the run says it
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "mlflow", "alembic",
                 "mlflow.store.db.utils", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()  # a task's file loads in a blink; its bars would bury an error line
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")


def prior_run(uri: str, experiment: str, algo: str, seed: int, digest: str, resume: bool, log=print) -> tuple:
    """``(client, run)``: mark the experiment's orphaned runs KILLED; with ``resume``, the newest unfinished run
    of (algo, seed) with settings ``digest`` that is not alive, else None (said in one line). ``(None, None)``
    on a rank other than 0 (rank 0 finds the run; the others get its checkpoint from rank 0) and where the
    experiment does not exist yet."""
    if not launch_rank_zero():
        return None, None
    client, exp = stores.open_store(uri, experiment)  # the first contact: a new store's tables
    if exp is None:
        return None, None
    mark_orphans(client, exp.experiment_id, log)
    prior = find_resumable(client, exp.experiment_id, algo, seed, digest) if resume else None
    if prior is None and resume:
        log(f"[resume] {algo} seed {seed}: no unfinished run with these settings: starting afresh")
    return client, prior


@dataclass
class FinishedRun:
    """A FINISHED run as the store holds it: what ``run``'s summary shows of a run it does not train again."""

    run_id: str
    experiment_id: str
    first: dict = field(default_factory=dict)
    """``reward/mean`` at the first RL step."""
    last: dict = field(default_factory=dict)
    """Every metric's last value."""
    eval_log: list = field(default_factory=list)
    """(RL step, {eval/* metric: value}) in step order."""
    seconds: float = 0.0
    """``time/wall_s``."""
    collapse_events: int = 0


def finished_run(uri: str, experiment: str, algo: str, seed: int, digest: str) -> FinishedRun | None:
    """The newest FINISHED run of (algo, seed) with settings ``digest`` (``lifecycle.find_finished``), read back;
    None where there is none or the experiment does not exist. Every rank asks (they must all skip or all
    train); the store is opened under its lock."""
    client, exp = stores.open_store(uri, experiment)
    if exp is None:
        return None
    run = find_finished(client, exp.experiment_id, algo, seed, digest)
    if run is None:
        return None
    run_id, metrics = run.info.run_id, run.data.metrics

    def history(key: str) -> list:
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))

    rewards = history("reward/mean") if "reward/mean" in metrics else []
    evals: dict[int, dict] = {}
    for key in sorted(k for k in metrics if k.startswith("eval/")):
        for step, value in history(key):
            evals.setdefault(step, {})[key] = value
    return FinishedRun(run_id, run.info.experiment_id, first={"reward/mean": rewards[0][1]} if rewards else {},
                       last=dict(metrics), eval_log=sorted(evals.items()), seconds=metrics.get("time/wall_s", 0.0),
                       collapse_events=int(run.data.tags.get("collapse.count", "0") or 0))


class OtherRankLogger(DummyLogger):
    """The logger of a rank other than 0: every call does nothing, and there is no run (rank 0 holds it)."""

    run_id = None
    experiment_id = None


def open_run(cfg: RunConfig, uri: str, algo: str, seed: int, resolved: dict, task_name: str,
             tags: dict | None = None, parent_run_id: str | None = None, run_name: str | None = None,
             resume_run_id: str | None = None) -> RunLogger:
    """A new MLflow run with its tags, params and ``config.yaml``; or, with ``resume_run_id``, that run again
    (RUNNING, this process as its owner; params and the metrics it holds are not logged twice). A rank other
    than 0 of a multi-process run gets a logger that records nothing, and never opens the store (torchrun
    starts every rank at once: two processes creating a new sqlite store's tables would collide)."""
    if not launch_rank_zero():
        return OtherRankLogger()
    if resume_run_id:
        logger = ResumedLogger(experiment_name=cfg.tracking.experiment, tracking_uri=uri, run_id=resume_run_id)
        mark_experiment(logger.experiment, logger.experiment_id)
        logger.experiment.update_run(resume_run_id, status="RUNNING")
        for key, value in owner_tags().items():
            logger.experiment.set_tag(resume_run_id, key, value)
        if "killed_reason" in logger.experiment.get_run(resume_run_id).data.tags:
            logger.experiment.delete_tag(resume_run_id, "killed_reason")
        return logger
    tags = {"algo": algo, "task": task_name, "model": cfg.model.name, "seed": str(seed), "preset": cfg.preset,
            "tuning": cfg.tuning, "moe": "unknown", "gspo_bench.version": __version__, "git.commit": git_commit(),
            "machine": machine(), "gspo_bench.config": config_digest(resolved),
            NOTE_TAG: run_description(algo, seed, cfg.preset, task_name, cfg.model.name, resolved),
            **owner_tags(), **(tags or {})}
    if parent_run_id:  # MLflow's own nesting tag: the UI shows this run under its parent
        tags["mlflow.parentRunId"] = parent_run_id
    # processes started together on one store would each create the experiment: made once, under its lock
    stores.ensure_experiment(uri, cfg.tracking.experiment, cfg.tracking.artifact_location)
    # what is written to MLflow is redacted (tracking.tracking_uri's password -> ***); the logger connects
    # with the real ``uri``
    logger = RunLogger(experiment_name=cfg.tracking.experiment, run_name=redact(run_name or f"{algo}-s{seed}"),
                       tracking_uri=uri, tags=redact_nested(tags))
    params = {k: ("null" if v is None else v) for k, v in flatten(resolved).items()}
    logger.log_hyperparams(params)
    logger.experiment.log_text(logger.run_id, yaml.safe_dump(resolved, sort_keys=False), "config.yaml")
    if logger.run_id is not None:  # rank 0 (the others of a multi-process run hold no run)
        mark_experiment(logger.experiment, logger.experiment_id)  # the UI opens it on runs and charts
    return logger


def tag_run(logger, tags: dict[str, str]) -> None:
    """Set ``tags`` on the logger's run (what is known only once the model is built: moe, engine, ...)."""
    if logger.run_id is None:  # a rank other than 0 holds no run
        return
    for key, value in tags.items():
        logger.experiment.set_tag(logger.run_id, key, value)


def attach_text(logger, text: str, name: str) -> None:
    """``text`` as the run's artifact ``name`` (another rank's traceback)."""
    if logger.run_id is not None:
        logger.experiment.log_text(logger.run_id, text, name)


def log_wall_time(logger, elapsed_s: float) -> None:
    """The run's wall time so far, as the metric ``time/wall_s``."""
    if logger.run_id is not None:
        logger.experiment.log_metric(logger.run_id, "time/wall_s", elapsed_s)


def end_run(logger, status: str, elapsed_s: float, reason: tuple[str, str] | None = None) -> None:
    """Mark the run ``status`` with its wall time, and ``reason`` as a (tag, text) when given."""
    if logger.run_id is None:  # a rank other than 0 holds no run
        return
    ending(logger.experiment, logger.run_id, status, tags=dict([reason]) if reason is not None else None)
    log_wall_time(logger, elapsed_s)
