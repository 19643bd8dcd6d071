"""The runs of an experiment as one long table: run x step x metric, with each run's tags and settings as
columns. Every reading of results goes through it: the leaderboard, the paired and split tables, the report,
the suite's summary and the claims are views of it (``runs_of`` gives them its runs one by one).

Columns: ``run_id``, ``status``, ``experiment``, ``artifact_uri``, ``tags.<name>`` for every run tag but
MLflow's own (``mlflow.*``), ``params.<name>`` for every param, then ``metric``, ``step``, ``value``. Rows:
per run, its latest value of every metric (``step`` = ``LATEST``, -1), the histories the readers need for a
FINISHED run (``history_keys``: eval, clip and reward curves, collapse events, and any asked for), and one
row with no metric for a run that logged none, so no run is lost.

The table is the raw data of a results folder: ``report`` writes it next to ``report.md`` as
``runs.csv.gz`` (``write_frame``), and ``leaderboard``, ``report`` and ``claims`` read such a file instead of
an MLflow store (``--runs FILE``, ``read_frame``), so a results folder is re-analysed from the repository
alone.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gspo_bench.config import ConfigError

FINISHED = "FINISHED"
RUNS_FILE = "runs.csv.gz"  # the long table a results folder keeps beside report.md
LATEST = -1  # the ``step`` of a run's latest value of a metric
HIDDEN_KINDS = ("report", "study")  # runs that hold outputs, not training (tag ``kind``)
BASE_COLUMNS = ("run_id", "status", "experiment", "artifact_uri")
TAIL_COLUMNS = ("metric", "step", "value")


@dataclass
class RunData:
    """One MLflow run, with the metric histories we read: ``history[key] = [(step, value), ...]`` by step."""

    run_id: str
    status: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]  # latest values
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    artifact_uri: str = ""

    @property
    def algo(self) -> str:
        return self.tags.get("algo", "?")

    @property
    def seed(self) -> str:
        return self.tags.get("seed", "?")

    @property
    def group(self) -> tuple[str, str, str, str]:
        """(task, model, preset, config): runs in one group are comparable."""
        t = self.tags
        return (t.get("task", "?"), t.get("model", "?"), t.get("preset", "?"), t.get("tuning", "default"))

    def collapse_steps(self) -> list[tuple[str, int]]:
        """(kind, step) of every collapse event, from the ``collapse/<kind>`` metric histories."""
        return sorted(((k.split("/", 1)[1], s) for k, h in self.history.items()
                       if k.startswith("collapse/") and k != "collapse/events" for s, _ in h), key=lambda e: e[1])



def quiet_mlflow() -> None:
    for name in ("mlflow", "alembic", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)


def experiment_id(client, experiment: str) -> str:
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ConfigError(f"experiment {experiment!r} not found (existing: {', '.join(names) or 'none'})")
    return exp.experiment_id


def history_keys(latest: dict, wanted: tuple[str, ...]) -> list[str]:
    """The metric histories read for a FINISHED run: those of ``wanted`` it logged, and every collapse event."""
    return list(dict.fromkeys([k for k in wanted if k in latest] + [k for k in latest if k.startswith("collapse/")]))


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    by_step: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        by_step[int(m.step)] = float(m.value)  # a step logged twice keeps its last value
    return sorted(by_step.items())


def load_frame(uri: str, experiment: str, task: str | None = None, model: str | None = None,
               metrics: tuple[str, ...] = (), hidden: bool = False) -> pd.DataFrame:
    """The experiment's benchmark runs (no report, study or trial run unless ``hidden``), ``task`` / ``model``
    filtered, as the long table (see the module docstring); ``metrics``: the histories to read for FINISHED
    runs, beside every collapse event's."""
    import mlflow
    from mlflow.utils import get_results_from_paginated_fn

    quiet_mlflow()
    client = mlflow.MlflowClient(uri)
    exp_id = experiment_id(client, experiment)
    # MLflow's own pager over search_runs (the pages of 1000 runs its search_runs() walks too)
    runs = get_results_from_paginated_fn(
        lambda n, token: client.search_runs([exp_id], max_results=n, page_token=token), 1000, 1_000_000)
    records = []
    for r in runs:
        tags = {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.")}
        if not hidden and (tags.get("kind") in HIDDEN_KINDS or tags.get("tuning") == "trial"):
            continue
        if (task and tags.get("task") != task) or (model and tags.get("model") != model):
            continue
        head = {"run_id": r.info.run_id, "status": r.info.status, "experiment": experiment,
                "artifact_uri": r.info.artifact_uri, **{f"tags.{k}": v for k, v in tags.items()},
                **{f"params.{k}": v for k, v in r.data.params.items()}}
        latest = dict(r.data.metrics)
        rows = [{**head, "metric": k, "step": LATEST, "value": float(v)} for k, v in latest.items()]
        if r.info.status == FINISHED:
            for key in history_keys(latest, metrics):
                rows += [{**head, "metric": key, "step": s, "value": v} for s, v in _history(client, r.info.run_id, key)]
        records += rows or [{**head, "metric": None, "step": None, "value": None}]
    return _ordered(pd.DataFrame.from_records(records))


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns in a fixed order (base, tags, params, metric), whatever order the records came in."""
    if frame.empty:
        return pd.DataFrame(columns=[*BASE_COLUMNS, *TAIL_COLUMNS])
    tags = sorted(c for c in frame.columns if c.startswith("tags."))
    params = sorted(c for c in frame.columns if c.startswith("params."))
    return frame[[*BASE_COLUMNS, *tags, *params, *TAIL_COLUMNS]]


def write_frame(frame: pd.DataFrame, path: str | Path) -> Path:
    """The long table as compressed CSV (``.csv.gz``): the raw data of a results folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, compression="gzip")
    return path


def read_frame(path: str | Path) -> pd.DataFrame:
    """A long table written by ``write_frame``; a missing or unreadable file is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--runs {str(path)!r}: no such file (a runs.csv.gz written by report)")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except Exception as e:
        raise ConfigError(f"--runs {str(path)!r}: not a runs table ({type(e).__name__})") from None
    missing = [c for c in (*BASE_COLUMNS, *TAIL_COLUMNS) if c not in frame.columns]
    if missing:
        raise ConfigError(f"--runs {str(path)!r}: not a runs table (no column {', '.join(missing)})")
    return frame


def runs_of(frame: pd.DataFrame) -> list:
    """The frame's runs as ``leaderboard.RunData``, in the order they first appear: tags, params, latest
    metrics and the histories it holds."""
    out = []
    if frame.empty:
        return out
    tag_cols = [c for c in frame.columns if c.startswith("tags.")]
    param_cols = [c for c in frame.columns if c.startswith("params.")]
    for run_id, rows in frame.groupby("run_id", sort=False):
        first = rows.iloc[0]

        def present(col) -> bool:
            v = first[col]
            return isinstance(v, str) or (v is not None and not (isinstance(v, float) and math.isnan(v)))

        tags = {c[5:]: str(first[c]) for c in tag_cols if present(c)}
        params = {c[7:]: str(first[c]) for c in param_cols if present(c)}
        metrics, history = {}, {}
        for key, step, value in zip(rows["metric"], rows["step"], rows["value"]):
            if not isinstance(key, str) or not key:
                continue
            step, value = int(float(step)), float(value)
            if step == LATEST:
                metrics[key] = value
            else:
                history.setdefault(key, []).append((step, value))
        out.append(RunData(str(run_id), str(first["status"]), tags, params, metrics,
                           {k: sorted(v) for k, v in history.items()}, str(first["artifact_uri"] or "")))
    return out


def select(frame: pd.DataFrame, experiment: str | None = None, task: str | None = None,
           model: str | None = None, source: str = "--runs") -> pd.DataFrame:
    """The rows of ``frame`` (read from a file) for ``experiment``, ``task`` and ``model``. A file holding one
    experiment is read whatever ``experiment`` says (the CLI's default name rarely matches a results folder's);
    one holding several needs the name, a ConfigError lists them."""
    names = sorted(n for n in frame["experiment"].dropna().unique())
    if experiment in names:
        frame = frame[frame["experiment"] == experiment]
    elif len(names) > 1:
        raise ConfigError(f"{source}: experiment {experiment!r} is not in it (it holds {', '.join(names)}); "
                          "pick one with --experiment")
    for col, value in (("tags.task", task), ("tags.model", model)):
        if value is not None:
            frame = frame[frame[col] == value] if col in frame.columns else frame.iloc[0:0]
    return frame
