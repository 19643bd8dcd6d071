"""``tune``: Optuna studies over clip ranges, pruned, resumable, shared by many workers, linked to MLflow.

One study per algorithm. A trial samples the algorithm's ``search_space``
(its loss's parameters' declared search ranges, ``core/loss_params.py``; ``--tune-lr`` adds the learning rate,
log-uniform within 5x of the config's), trains it from the shared warm start
with ``runner.run_one`` and returns the objective. Storage is any SQLAlchemy
URL (default ``sqlite:///optuna.db``); workers pointed at the same storage
and study name share it through Optuna's own distributed mode, and running
the command again continues the study. Workers on several machines share a
PostgreSQL server (``postgresql+psycopg://user:pass@host/db``, the
``postgres`` extra; ``docs/scaling-optuna.md``): a driver-less
``postgresql://`` URL is read as psycopg 3, and the first-time table
creation is serialised by an advisory lock (workers started together would
otherwise race on ``CREATE TABLE``).

Objective (maximised): the mean of ``eval/reward_mean`` over the trial's last
``LAST_EVALS`` evaluations (the final one and the one before; the step-0
warm-start eval never counts), minus ``COLLAPSE_PENALTY`` (0.05) per collapse
event. ``eval/reward_mean`` is the mean verifier reward of
``train.eval_samples`` sampled completions per held-out prompt; with
``eval_samples: 0`` it is greedy ``eval/pass1`` instead. The pruner sees the
same metric at each in-loop evaluation (RL steps ``eval_every``,
``2 eval_every``, ...), reported at the RL step (``trials.RLStepPruning``).

Liveness: a worker's heartbeat is written every ``heartbeat`` seconds; a
RUNNING trial silent for twice that is failed by the next worker that starts
a trial, its MLflow run is ended KILLED, and it is retried with the same
parameters (``StaleTrial``, up to ``retries`` times).

Choices: one seed per trial (the config's first); re-run
the best config with ``run --seeds 3`` to see the seed noise. ``--timeout``
applies to each study of ``--algo all`` separately.
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import fmean

import yaml

from gspo_bench.config import CONNECT_TIMEOUT_S, ConfigError, deep_merge, load_config, read_yaml
from gspo_bench.tracking.redact import redact, redact_nested
from gspo_bench.tracking.stores import probe_store, sqlite_path, store_lock

DEFAULT_STORAGE = "sqlite:///optuna.db"
LAST_EVALS = 2
COLLAPSE_PENALTY = 0.05
OBJECTIVE = (f"mean {{metric}} over the last {LAST_EVALS} evals (step 0 excluded) "
             f"- {COLLAPSE_PENALTY} x collapse events")
LR_FACTOR = 5.0  # --tune-lr: log-uniform over [lr / 5, lr * 5] around the config's lr
RUN_ATTR, PARENT_ATTR = "mlflow_run_id", "mlflow_parent_run_id"
PRUNERS = "median[:STARTUP] | percentile:P[:STARTUP] | halving | hyperband | threshold:LOWER | none"


class TrialFailed(RuntimeError):
    """The trial's training run ended FAILED; Optuna records the trial FAIL and the study goes on."""


@dataclass
class TuneRequest:
    algo: str  # an algorithm name or "all"
    trials: int | None = None  # this process's trials (Optuna's n_trials); None with no timeout = 8
    timeout: float | None = None  # seconds per study
    study: str | None = None  # default <algo>-<task>-<model>-<preset>; with --algo all, <study>-<algo>
    storage: str = DEFAULT_STORAGE
    preset: str = "default"
    config_files: tuple = ()
    overrides: dict = field(default_factory=dict)  # CLI flags, the nested dict load_config takes
    params: tuple[str, ...] | None = None  # which search-space parameters; None = the algorithm's defaults
    tune_lr: bool = False
    pruner: str = "median"
    heartbeat: int = 60  # seconds; grace period = 2x
    retries: int = 2  # how often a trial whose worker died is retried
    out: str = "results/tuning"
    sampler_seed: int | None = None  # None: workers sample independently (a shared seed would duplicate)
    command: str = ""


@dataclass
class StudyOutcome:
    name: str
    counts: dict[str, int]  # trial states over the whole study
    best_value: float | None = None
    best_params: dict = field(default_factory=dict)
    best_trial: int | None = None
    path: Path | None = None  # the best-params YAML
    parent_run_id: str = ""
    seconds: float = 0.0


def driver_url(url: str) -> str:
    """``url`` with a PostgreSQL driver: ``postgresql://`` (or ``postgres://``) becomes ``postgresql+psycopg://``.

    SQLAlchemy reads a driver-less ``postgresql://`` as psycopg2; the ``postgres`` extra installs psycopg 3.
    With psycopg 3 missing the URL stays for psycopg2 when that is there, else it is a ConfigError. Other
    URLs (``sqlite:///``, ``postgresql+psycopg2://``, ``mysql+pymysql://``) are returned as they are.
    """
    import importlib.util

    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("postgresql", "postgres"):
        return url
    if importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg://{rest}"
    if importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql://{rest}"
    raise ConfigError(f"storage {redact(url)!r} is unreachable: no PostgreSQL driver (install the postgres extra: "
                      f"pip install -e '.[postgres]', i.e. psycopg 3)")


class StaleTrial:
    """A heartbeat-stale trial (its worker died): end its MLflow run KILLED, then Optuna's retry re-queues it."""

    def __init__(self, tracking_uri: str, retries: int):
        import optuna

        self.uri = tracking_uri
        # the class is RetryHeartbeatStaleTrialCallback since optuna 4.9, RetryFailedTrialCallback before
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
        self.retry = (retry or optuna.storages.RetryFailedTrialCallback)(max_retry=retries)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        run_id = trial.user_attrs.get(RUN_ATTR)
        if run_id:
            from gspo_bench.tracking.client import client as tracking_client, end_run

            with contextlib.suppress(Exception):  # a run we cannot reach must not block the retry
                client = tracking_client(self.uri)
                end_run(client, run_id, "KILLED", tags={"stale": "true"})
        self.retry(study, trial)


def open_storage(url: str, heartbeat: int | None = None, retries: int = 0, tracking_uri: str | None = None,
                 must_exist: bool = False, connect_timeout_s: float = CONNECT_TIMEOUT_S):
    """The RDB storage, with heartbeat and stale-trial retry when ``heartbeat`` is set.

    An unreachable or malformed URL (or, with ``must_exist``, a SQLite file
    that is not there) is a ConfigError: one line, exit 2, nothing written.
    """
    import optuna

    if "://" not in url:
        raise ConfigError(f"storage {url!r} is not a database URL (e.g. {DEFAULT_STORAGE} or "
                          "postgresql+psycopg://user:pass@host/db)")
    path = sqlite_path(url)
    if path is not None and not path.parent.resolve().is_dir():
        raise ConfigError(f"storage {url!r} is unreachable: directory {str(path.parent)!r} does not exist")
    if path is not None and must_exist and not path.is_file():
        raise ConfigError(f"storage {url!r}: no database file {str(path)!r}")
    kw: dict = {}
    if heartbeat is not None:
        new_name = hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback")  # optuna >= 4.9 renamed it
        kw = {"heartbeat_interval": heartbeat, "grace_period": 2 * heartbeat,
              "heartbeat_stale_trial_callback" if new_name else "failed_trial_callback": StaleTrial(tracking_uri,
                                                                                                     retries)}
    target = driver_url(url)  # connect with this; messages name the URL as given, redacted
    probe_store(url, connect_timeout_s, role="Optuna storage")  # the one store check, as for tracking stores
    engine = {"connect_args": {"timeout": 60}} if path is not None else None  # SQLite: wait for the other writers
    try:
        with store_lock(target), warnings.catch_warnings():  # workers started together take turns
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(target, engine_kwargs=engine, **kw)
    except Exception as e:  # driver missing, refused connection, bad URL: all one-line errors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        hint = ""
        if isinstance(e, ImportError):
            hint = (" (install the postgres extra: pip install -e '.[postgres]', i.e. psycopg 3)"
                    if target.lower().startswith("postgresql+psycopg:") else " (install the URL's database driver)")
        raise ConfigError(f"storage {redact(url)!r} is unreachable: {type(e).__name__}: {redact(first)}{hint}"
                          ) from None


def make_pruner(spec: str, steps: int = 0):
    """``--pruner`` (``PRUNERS``) for trials of ``steps`` RL steps.

    median and percentile wait for 3 startup trials and never prune before
    the halfway RL step. Measured on the default preset (gspo, 8
    trials): at step 10 of 40, eval/reward_mean differed between clip ranges
    by about 0.01, under its sampling noise (~0.016 over 256 prompts x 4
    samples), and the eventual best trial ranked last there, so pruning on the
    first evaluation discards trials at random.
    """
    import optuna

    name, *args = spec.split(":")
    warmup = steps // 2
    try:
        nums = [float(a) for a in args]
        startup = int(nums[-1]) if len(nums) == (1 if name == "median" else 2) else 3
        if name == "median" and len(nums) <= 1:
            return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
        if name == "percentile" and len(nums) in (1, 2):
            return optuna.pruners.PercentilePruner(nums[0], n_startup_trials=startup, n_warmup_steps=warmup)
        if name == "threshold" and len(nums) == 1:
            return optuna.pruners.ThresholdPruner(lower=nums[0])
        if not nums and name in ("halving", "hyperband", "none"):
            return {"halving": optuna.pruners.SuccessiveHalvingPruner, "hyperband": optuna.pruners.HyperbandPruner,
                    "none": optuna.pruners.NopPruner}[name]()
    except ValueError:
        pass
    raise ConfigError(f"pruner {spec!r} is not allowed (allowed: {PRUNERS})")


def chosen_params(spec, params: tuple[str, ...] | None, tune_lr: bool) -> tuple[str, ...]:
    """The parameters a study of the algorithm of loss ``spec`` (``losses.LossSpec``) searches: its declared
    search ranges, and ``lr``. Unknown names or an empty selection are ConfigErrors."""
    allowed = (*spec.search_ranges(), "lr")
    chosen = tuple(spec.searched_by_default() if params is None else params) + (("lr",) if tune_lr else ())
    unknown = [p for p in chosen if p not in allowed]
    if unknown:
        raise ConfigError(f"--params {','.join(unknown)}: not in {spec.name}'s search space "
                          f"(allowed: {', '.join(allowed)})")
    if not chosen:
        raise ConfigError(f"empty search space for {spec.name}: --params selects nothing "
                          f"(allowed: {', '.join(allowed)})")
    return tuple(dict.fromkeys(chosen))


def objective_value(curve: list[tuple[int, float]], collapses: int) -> float:
    """Mean of the last ``LAST_EVALS`` evals after step 0, minus ``COLLAPSE_PENALTY`` per collapse event."""
    after = [v for s, v in curve if s > 0] or [v for _, v in curve]
    if not after:
        raise TrialFailed("the run logged no evaluation")
    return fmean(after[-LAST_EVALS:]) - COLLAPSE_PENALTY * collapses


def fmt_params(params: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def best_of(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    with contextlib.suppress(ValueError):  # no COMPLETE trial yet
        return study.best_trial
    return None


def counts(study: optuna.Study) -> dict[str, int]:
    c = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    return {k: c.get(k, 0) for k in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")}


class Progress:
    """After each trial of this worker: its outcome, this worker's count, the study's counts, the best so far."""

    def __init__(self, n_trials: int | None, log):
        self.n, self.done, self.log = n_trials, 0, log

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.done += 1
        if trial.state.name == "COMPLETE":
            outcome = f"value {trial.value:.4f}"
        elif trial.intermediate_values:  # a pruned trial: where, and its last reported metric
            step = max(trial.intermediate_values)
            outcome = f"{trial.state.name.lower()} at step {step} ({trial.intermediate_values[step]:.4f})"
        else:
            outcome = trial.state.name.lower()
        c, best = counts(study), best_of(study)
        best_txt = f"{best.value:.4f} (trial {best.number}: {fmt_params(best.params)})" if best else "-"
        self.log(f"tune: trial {trial.number} ({fmt_params(trial.params)}) {outcome} | worker {self.done}/"
                 f"{self.n or '-'} | study {c['COMPLETE']} done, {c['PRUNED']} pruned, {c['FAIL']} failed, "
                 f"{c['RUNNING']} running | best {best_txt}")


def write_best(study: optuna.Study, req: TuneRequest, algo: str, metric: str) -> Path | None:
    """``<out>/<study>.yaml``: the study's base settings with the best trial's on top, as ``run --config`` reads.

    Holds what the trials ran with beyond the preset (``--config`` files and
    flags, less tracking and seeds), ``algo``, ``tuning: tuned`` (the
    leaderboard's label) and a ``source`` line naming the study.
    """
    best = best_of(study)
    if best is None:
        return None
    base = {}
    for f in req.config_files:
        base = deep_merge(base, read_yaml(f))
    base = deep_merge(base, req.overrides)
    for key in ("tracking", "seeds", "algos", "algo", "preset", "source", "tuning"):
        base.pop(key, None)
    if isinstance(base.get("train"), dict):
        base["train"] = {k: v for k, v in base["train"].items() if k != "progress"} or None
    base = {k: v for k, v in base.items() if v is not None}
    c = counts(study)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    source = (f"Optuna study {study.study_name} in {redact(req.storage)}: best of {c['COMPLETE']} complete trials "
              f"({c['PRUNED']} pruned, {c['FAIL']} failed), trial {best.number}, objective {best.value:.4f} = "
              f"{OBJECTIVE.format(metric=metric)}; {when}; {req.command or 'python -m gspo_bench tune'}")
    data = deep_merge({"source": source, "tuning": "tuned", "algo": algo, **base}, best.user_attrs.get("overrides", {}))
    data = redact_nested(data)  # the command line in source, and any secret in the flags, written as ***
    out = Path(req.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (re.sub(r"[^A-Za-z0-9._-]+", "-", study.study_name) + ".yaml")
    head = (f"# Best parameters of Optuna study {study.study_name!r}, written by gspo_bench tune.\n"
            f"# Re-run: python -m gspo_bench run --preset {req.preset} --config {path}\n")
    path.write_text(redact(head) + yaml.safe_dump(data, sort_keys=False, width=1000))
    load_config(req.preset, (str(path),))  # what we write must load back
    return path


def wait_for_attr(study: optuna.Study, key: str, seconds: float = 60.0):
    """A study user attribute another worker is about to set (None after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while (value := study.user_attrs.get(key)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return value
