"""``run``: warm start once per seed, then each algorithm from that checkpoint, tracked in MLflow.

Everything a user can get wrong is checked in ``validate`` before the first
MLflow run is created, so a bad flag never leaves a run RUNNING. An exception
inside one algorithm marks that run FAILED and the others still run; the
exception types a caller names in ``run_one(interrupts=...)`` (``tune``:
``optuna.TrialPruned``) end the run KILLED instead and propagate.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers import MLFlowLogger
from transformers import AutoTokenizer

from gspo_bench import __version__, algorithms
from gspo_bench.callbacks import CollapseCallback, MismatchProbe, MoEFlipProbe, RatioSample
from gspo_bench.config import ConfigError, Resolved, RunConfig, flatten, resolve_tracking_uri, to_dict
from gspo_bench.models import classify_model_ref, is_moe
from gspo_bench.paths import probe_writable_dir
from gspo_bench.redact import redact, redact_nested
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.tasks import load_task, resolve_task_spec
from gspo_bench.tasks.task import check_task_data
from gspo_bench.warmstart import WarmStart, warm_start


@dataclass
class RunResult:
    algo: str
    seed: int
    run_id: str | None
    status: str  # FINISHED | FAILED | KILLED (an ``interrupts`` exception; it propagates)
    first: dict = field(default_factory=dict)  # first step's metrics
    last: dict = field(default_factory=dict)  # last step's metrics
    eval_start: float | None = None
    eval_end: float | None = None
    eval_log: list = field(default_factory=list)  # (rl_step, {"eval/pass1": ..., "eval/reward_mean": ...})
    collapse_events: int = 0
    seconds: float = 0.0
    error: str | None = None
    module: object | None = None  # the trained LightningModule, only when asked for (tests, notebooks)


class ProgressBar(RichProgressBar):
    """Rich bar with reward and clip fraction, without Lightning's ``v_num`` clutter."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def quiet() -> None:
    """Keep the console to what a user needs: our lines and the progress bar."""
    import mlflow  # noqa: F401  (import first: it sets its own log levels on import)
    import transformers

    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "mlflow", "alembic",
                 "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")


def tracking_uri(cfg: RunConfig) -> str:
    """The URI runs are written to (``config.resolve_tracking_uri``); a sqlite file's folder must exist and,
    with the file if it exists, be writable."""
    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).expanduser()
        if not db.parent.resolve().is_dir():
            raise ConfigError(f"tracking URI {uri!r}: directory {str(db.parent)!r} does not exist")
        try:  # a real write probe (permission bits lie to root, and /proc-like folders refuse new files)
            if db.exists():
                with open(db, "ab"):
                    pass
            else:
                probe_writable_dir(db.parent.resolve())
        except OSError as e:
            raise ConfigError(f"tracking URI {uri!r}: cannot write {str(db if db.exists() else db.parent)!r} "
                              f"({e.strerror or e})") from None
    return uri


def validate(cfg: RunConfig) -> str:
    """Check everything cheap to check before any run exists; returns the tracking URI."""
    for algo in cfg.algos:
        if algo not in algorithms.ALGORITHMS:
            raise ConfigError(f"algo {algo!r} has a loss but no algorithm class (algorithms: "
                              f"{', '.join(algorithms.names())})")
    try:
        check_task_data(resolve_task_spec(cfg.task))  # its data files, cheaply, before any warm start
        classify_model_ref(cfg.model.name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return tracking_uri(cfg)


def machine() -> str:
    import platform

    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{os.cpu_count()}-core CPU"
    return f"{dev}, {platform.machine()}, torch {torch.__version__}"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's commit (``+dirty`` with local changes) when first asked, i.e. the code this process loaded."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    from gspo_bench import __version__

    return (sha + ("+dirty" if dirty else "")) if sha else f"gspo-bench {__version__}"


def make_logger(cfg: RunConfig, uri: str, algo: str, seed: int, ws: WarmStart, settings: Resolved,
                task_name: str, tags: dict | None = None, parent_run_id: str | None = None,
                run_name: str | None = None) -> MLFlowLogger:
    tags = {"algo": algo, "task": task_name, "model": cfg.model.name, "seed": str(seed), "preset": cfg.preset,
            "tuning": cfg.tuning, "moe": "unknown", "gspo_bench.version": __version__, "git.commit": git_commit(),
            "machine": machine(), **(tags or {})}
    if parent_run_id:  # MLflow's own nesting tag: the UI shows this run under its parent
        tags["mlflow.parentRunId"] = parent_run_id
    # what is written to MLflow is redacted (tracking.tracking_uri's password -> ***); the logger connects
    # with the real ``uri``
    logger = MLFlowLogger(experiment_name=cfg.tracking.experiment, run_name=redact(run_name or f"{algo}-s{seed}"),
                          tracking_uri=uri, tags=redact_nested(tags))
    resolved = to_dict(cfg)
    resolved["algos"] = [algo]
    resolved["seeds"] = [seed]
    resolved["resolved"] = {"loss": to_dict(settings.loss), "rollout": to_dict(settings.rollout),
                            "warmstart": {"path": str(ws.path), "pass1": ws.pass1, "steps": ws.steps}}
    resolved = redact_nested(resolved)
    params = {k: ("null" if v is None else v) for k, v in flatten(resolved).items()}
    logger.log_hyperparams(params)
    logger.experiment.log_text(logger.run_id, yaml.safe_dump(resolved, sort_keys=False), "config.yaml")
    return logger


def run_one(cfg: RunConfig, algo: str, seed: int, task, ws: WarmStart, uri: str, log=print,
            keep_module: bool = False, *, callbacks: tuple = (), tags: dict | None = None,
            parent_run_id: str | None = None, run_name: str | None = None,
            interrupts: tuple[type[BaseException], ...] = ()) -> RunResult:
    """Train one algorithm from the warm start. The keyword-only options are ``tune``'s: extra Lightning
    ``callbacks``, extra MLflow ``tags``, a parent run to nest under, and ``interrupts``, exception types
    that end the run KILLED and are re-raised (any other exception ends it FAILED and is returned)."""
    cls = algorithms.get(algo)
    settings = cfg.resolve(algo, cls.recipe, task.spec.max_new_tokens)
    L.seed_everything(seed, verbose=False)
    module = cls(cfg, str(ws.path), seed, settings)
    tok = AutoTokenizer.from_pretrained(ws.path)
    dm = RolloutDataModule(task, tok, settings.rollout, steps=cfg.train.steps, seed=seed,
                           eval_prompts=cfg.train.eval_prompts, eval_samples=cfg.train.eval_samples)
    logger = make_logger(cfg, uri, algo, seed, ws, settings, task.name, tags, parent_run_id, run_name)
    moe = is_moe(module.policy)
    # the stabilisers, as tags the leaderboard can split by (--by); routing_replay is what ran (none on dense)
    for key, value in {"moe": str(moe).lower(), "routing_replay": module.replay,
                       "correction": settings.rollout.correction, "rollout_dtype": settings.rollout.dtype}.items():
        logger.experiment.set_tag(logger.run_id, key, value)
    collapse = CollapseCallback(cfg.collapse, log=log)
    # measurements first, so the collapse detector sees the step's full metrics
    callbacks: list = ([MismatchProbe(), RatioSample()] + ([MoEFlipProbe()] if moe else []) + [collapse]
                       + list(callbacks))
    if cfg.train.progress:
        callbacks.append(ProgressBar(leave=True))
    trainer = L.Trainer(
        max_epochs=1, max_steps=-1, logger=logger, callbacks=callbacks, accelerator=cfg.train.accelerator,
        devices=1, precision=cfg.train.precision, val_check_interval=cfg.train.eval_every,
        check_val_every_n_epoch=None, num_sanity_val_steps=0, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=cfg.train.progress, log_every_n_steps=1,
    )
    result = RunResult(algo, seed, logger.run_id, "FAILED")
    t0 = time.perf_counter()
    try:
        trainer.fit(module, datamodule=dm)
        result.status = "FINISHED"
    except interrupts:  # stopped on purpose (a pruned trial): not a failure, and the caller handles it
        result.status = "KILLED"
        logger.experiment.set_terminated(logger.run_id, "KILLED")
        logger.experiment.log_metric(logger.run_id, "time/wall_s", time.perf_counter() - t0)
        raise
    except Exception as e:  # one algorithm failing must not take the benchmark down
        result.error = f"{type(e).__name__}: {e}"
        log(f"[error] {algo} seed {seed} failed: {result.error}")
        log(traceback.format_exc())
        logger.experiment.set_terminated(logger.run_id, "FAILED")
    result.seconds = time.perf_counter() - t0
    result.first, result.last = module.first_metrics, module.last_metrics
    result.eval_start, result.eval_end = module.eval_history[0][1] if module.eval_history else None, (
        module.eval_history[-1][1] if module.eval_history else None)
    result.eval_log = list(module.eval_log)
    result.collapse_events = len(collapse.events)
    logger.experiment.log_metric(logger.run_id, "time/wall_s", result.seconds)
    if keep_module:
        result.module = module
    return result


def run(cfg: RunConfig, log=print, keep_modules: bool = False) -> list[RunResult]:
    """All algorithms x seeds of ``cfg``; returns one result per run."""
    quiet()
    uri = validate(cfg)
    results = []
    for seed in cfg.seeds:
        try:
            task = load_task(cfg.task, seed)
        except ValueError as e:  # bad data: one line before any warm start or MLflow run
            raise ConfigError(str(e)) from None
        ws = warm_start(task, cfg.model, cfg.warmstart, seed, task.spec.max_new_tokens,
                        progress=cfg.train.progress, log=log)
        if ws.cached:
            log(f"warm start (cached): greedy pass@1 {ws.pass1:.1%} on {len(task.eval)} held-out prompts "
                f"-> {ws.path}")
        for algo in cfg.algos:
            log(f"== {algo} (seed {seed}) ==")
            results.append(run_one(cfg, algo, seed, task, ws, uri, log, keep_modules))
    return results

