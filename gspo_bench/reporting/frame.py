"""The runs of an experiment as one long table: run x step x metric, with each run's tags and settings as
columns. Every reading of results goes through it: the leaderboard, the paired and split tables, the report,
the suite's summary and the claims are views of it (``runs_of`` gives them its runs one by one; the paired views
then group them per seed with pandas, ``seeds.py``).

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

import fnmatch
import gzip
import itertools
import logging
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gspo_bench.config import ConfigError
from gspo_bench.tracking.ui import benchmark_run

FINISHED = "FINISHED"
RUNS_FILE = "runs.csv.gz"  # the long table a results folder keeps beside report.md
LATEST = -1  # the ``step`` of a run's latest value of a metric
# tags a run has of its own (owner, provenance, what happened in it): not part of its settings
RUN_OWN_TAGS = ("gspo_bench.", "mlflow.", "collapse.", "git.commit", "machine", "killed_reason", "failed_reason",
                "stale", "pruned")
SUPERSEDED = "SUPERSEDED"  # the status a table gives an older FINISHED run of a (settings, algo, seed) it holds twice
BASE_COLUMNS = ("run_id", "status", "experiment", "artifact_uri")
OPTIONAL_COLUMNS = ("start_time",)  # written since tables set duplicates aside by age; older tables lack it
TAIL_COLUMNS = ("metric", "step", "value")
# metrics that only take values in a range, (name pattern, low, high), checked on read (``row_fault``): a value
# outside is no measurement but a made-up result (a pass@1 of 1e308 reaches any target at its first step); any
# other metric need only be finite
METRIC_RANGES = (
    ("eval/*", 0.0, 1.0),  # pass rates and means of verifier rewards, which lie in [0, 1] (tasks.REWARD_PARAMS)
    # the same rewards in training; not reward/shaped_mean, which DAPO's overlong penalty takes below 0
    ("reward/mean", 0.0, 1.0), ("reward/train_batch_mean", 0.0, 1.0), ("reward/std", 0.0, 1.0),
    ("clip/frac*", 0.0, 1.0), ("*_frac", 0.0, 1.0), ("train/nonfinite", 0.0, 1.0),  # fractions
    ("time/*", 0.0, math.inf), ("throughput/*", 0.0, math.inf), ("response/length_*", 0.0, math.inf),
    ("policy/entropy", 0.0, math.inf), ("collapse/*", 0.0, math.inf), ("dynamic/*", 0.0, math.inf),
    ("verify/timeouts", 0.0, math.inf),  # durations, rates, lengths, an entropy and counts
)
RANGE_SLACK = 1e-6  # float32 rounding may take a mean of values in [0, 1] a few ulps past its bound


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
    experiment: str = ""
    start_time: float | None = None  # ms since the epoch, as MLflow keeps it

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
    """The metric histories read for a FINISHED run: those of ``wanted`` it logged (an entry ending in ``*``
    names every metric starting with what precedes it, ``eval/mean_at_*``), and every collapse event."""
    def logged(w: str) -> list[str]:
        # "prefix*": every metric the run logged that starts with prefix, by name; else ``w`` if it logged it
        return sorted(k for k in latest if k.startswith(w[:-1])) if w.endswith("*") else [w] * (w in latest)

    named = [k for w in wanted for k in logged(w)]
    return list(dict.fromkeys(named + [k for k in latest if k.startswith("collapse/")]))


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    by_step: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        by_step[int(m.step)] = float(m.value)  # a step logged twice keeps its last value
    return sorted(by_step.items())


def load_frame(uri: str, experiment: str, task: str | None = None, model: str | None = None,
               metrics: tuple[str, ...] = (), hidden: bool = False) -> pd.DataFrame:
    """The experiment's benchmark runs (no report, study or trial run unless ``hidden``), ``task`` / ``model``
    filtered, as the long table (see the module docstring); ``metrics``: the histories to read for FINISHED
    runs, beside every collapse event's (``history_keys``: ``prefix*`` names every metric with that prefix)."""
    from gspo_bench.tracking import client as tracking_client

    quiet_mlflow()
    client = tracking_client.client(uri)
    exp_id = experiment_id(client, experiment)
    runs = tracking_client.all_runs(client, [exp_id])
    records = []
    for r in runs:
        tags = {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.")}
        if not hidden and not benchmark_run(tags):
            continue
        if (task and tags.get("task") != task) or (model and tags.get("model") != model):
            continue
        head = {"run_id": r.info.run_id, "status": r.info.status, "experiment": experiment,
                "artifact_uri": r.info.artifact_uri, "start_time": r.info.start_time, **{f"tags.{k}": v for k, v in tags.items()},
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
    optional = [c for c in OPTIONAL_COLUMNS if c in frame.columns]
    return frame[[*BASE_COLUMNS, *optional, *tags, *params, *TAIL_COLUMNS]]


def write_frame(frame: pd.DataFrame, path: str | Path) -> Path:
    """The long table as compressed CSV (``.csv.gz``): the raw data of a results folder. An infinite value (a
    diverged loss in a file store) is written as MLflow's SQL stores keep it, the largest float of its sign, so
    that ``read_frame``, which takes finite values only, reads the table back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = frame.assign(value=frame["value"].replace({math.inf: sys.float_info.max, -math.inf: -sys.float_info.max}))
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        f.write(csv_text(frame))
    return path


def csv_text(frame: pd.DataFrame) -> str:
    """``frame.to_csv(index=False)``, the same text, many times sooner on a long table: every row repeats its
    run's hundreds of tag and param columns, so the columns other than ``TAIL_COLUMNS`` are rendered once for each
    distinct value of them (a run's), the tail's for every row, and each line joins the pieces in column order."""
    if frame.empty or not set(TAIL_COLUMNS) <= set(frame.columns) or len(frame.columns) == len(TAIL_COLUMNS):
        return frame.to_csv(index=False)
    rest = [c for c in frame.columns if c not in TAIL_COLUMNS]
    # each row's values of the other columns, as a 64-bit hash: the rows of one run share it
    keys = pd.util.hash_pandas_object(frame[rest], index=False).to_numpy()
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    pieces = []
    # runs of adjacent columns, each all tail or all other
    for tailing, run in itertools.groupby(range(len(frame.columns)), key=lambda i: frame.columns[i] in TAIL_COLUMNS):
        columns = list(run)
        part = frame.iloc[:, columns] if tailing else frame.iloc[first, columns]
        lines = part.to_csv(index=False, header=False, lineterminator="\n").split("\n")[:-1]
        if len(columns) == 1:  # one column alone writes an empty cell as "" (a blank line would be no row)
            lines = ["" if line == '""' else line for line in lines]
        if len(lines) != len(part):  # a cell with a line break: pandas's own way
            return frame.to_csv(index=False)
        pieces.append(lines if tailing else [lines[i] for i in which.tolist()])
    return frame.head(0).to_csv(index=False) + "".join(",".join(cells) + "\n" for cells in zip(*pieces))


def read_frame(path: str | Path) -> pd.DataFrame:
    """A long table written by ``write_frame``; a missing or unreadable file, a missing column or a row that
    ``runs_of`` could not read or whose values no run logs (``row_fault``: a repeated row among them) is a
    one-line ConfigError, the row named by its line."""
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
    fault = row_fault(frame, lambda row: _line_of(path, row))
    if fault is not None:
        row, what = fault
        raise ConfigError(f"--runs {str(path)!r}: line {_line_of(path, row)}: {what}")
    return frame


def read_frames(paths) -> pd.DataFrame:
    """Several long tables (``read_frame`` each) as one: the runs of an experiment made in two stores, say, so a
    results folder grows by the runs a later command adds. A run id in two of them is a one-line ConfigError
    naming both files (its rows would count twice)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    frames, owner = [], {}
    for path in paths:
        frame = read_frame(path)
        for run_id in frame["run_id"].dropna().unique():
            if run_id in owner:
                raise ConfigError(f"--runs: run {run_id} is in both {str(owner[run_id])!r} and {str(path)!r}; "
                                  f"give each run from one table")
            owner[run_id] = path
        frames.append(frame)
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _shown(value) -> str:
    """A cell as an error line shows it: quoted, escaped (no line break), at most 40 characters."""
    text = repr(str(value))
    return text if len(text) <= 40 else text[:36] + "...'"


def metric_range(name: str) -> tuple[float, float]:
    """The values metric ``name`` can take: the range of the first ``METRIC_RANGES`` pattern it matches, else
    any finite number."""
    return next(((low, high) for pattern, low, high in METRIC_RANGES if fnmatch.fnmatchcase(name, pattern)),
                (-math.inf, math.inf))


def row_fault(frame: pd.DataFrame, line_of=lambda row: row + 2) -> tuple[int, str] | None:
    """The first row (0-based position) of a table read as text that ``runs_of`` could not read, or that holds
    what no run logs, and what is wrong with it; None when every row is sound. A row has a non-empty ``run_id``
    and ``experiment``, one of MLflow's run statuses, a number or nothing as ``start_time`` (where the column
    is), a non-empty ``tags.algo`` and an integer ``tags.seed`` (every benchmark run is tagged with both); with
    a ``metric``, an integer ``step`` and a finite number within the metric's range (``metric_range``) or
    nothing as ``value`` (a NaN logged is written as nothing); without one (a run that logged no metric),
    neither step nor value. No two rows have the same run, metric and step (a repeated row would be read
    twice: a history with every step doubled, a run counted twice); ``line_of(row)``: the line of the file data
    row ``row`` starts on, so that a repeat names the line it repeats."""
    from gspo_bench.tracking.client import run_statuses

    statuses = run_statuses()

    def column(col: str) -> pd.Series:  # a tag column no run has is empty in every row
        return frame[col] if col in frame.columns else pd.Series("", index=frame.index, dtype=str)

    def empty(col: str) -> pd.Series:
        return column(col).isna() | (column(col).str.strip() == "")

    metric, no_step, no_value = ~empty("metric"), empty("step"), empty("value")
    integer = frame["step"].map(lambda t: (x := _number(t)) is not None and math.isfinite(x) and x.is_integer())
    number = frame["value"].map(lambda t: _number(t) is not None)  # inf and nan as well
    value = frame["value"].map(lambda t: x if (x := _number(t)) is not None and math.isfinite(x) else math.nan)
    finite = value.notna()
    ranges = {m: metric_range(m) for m in frame["metric"][metric].unique()}  # per name, not per row
    low = frame["metric"].map(lambda m: ranges.get(m, (-math.inf, math.inf))[0]).astype(float)
    high = frame["metric"].map(lambda m: ranges.get(m, (-math.inf, math.inf))[1]).astype(float)
    outside = metric & finite & ((value < low - RANGE_SLACK) | (value > high + RANGE_SLACK))
    seed_integer = column("tags.seed").map(lambda t: isinstance(t, str) and re.fullmatch(r"-?\d+", t) is not None)
    # a row's key: its run, metric and step (the step as a number, so that "3" and "3.0" are one step)
    keys = pd.DataFrame({"run": frame["run_id"], "metric": frame["metric"].where(metric),
                         "step": frame["step"].map(_number)})
    repeated = keys.duplicated(keep="first")

    def out_of_range(i: int) -> str:
        name, (lo, hi) = frame["metric"].iat[i], ranges[frame["metric"].iat[i]]
        where = f"outside its range [{lo:g}, {hi:g}]" if math.isfinite(hi) else f"below {lo:g}, its least value"
        return f"value {_shown(frame['value'].iat[i])} of {name} is {where}"

    def repeat(i: int) -> str:
        group = keys.groupby(list(keys.columns), dropna=False, sort=False).ngroup().to_numpy()
        first = line_of(int((group == group[i]).argmax()))
        run = _shown(frame["run_id"].iat[i])
        if not metric.iat[i]:
            return f"run_id {run} has a second row without a metric, after line {first} (it would be read twice)"
        return (f"run_id {run}, metric {_shown(frame['metric'].iat[i])}, step {_shown(frame['step'].iat[i])} "
                f"repeats line {first} (a run has one value per metric and step; a repeated row is read twice)")

    bad_start = (~empty("start_time") & ~frame["start_time"].map(lambda t: _number(t) is not None)
                 if "start_time" in frame.columns else pd.Series(False, index=frame.index))  # optional column
    # (rows it fails, what the line says), in the order of the columns
    checks = [
        (empty("run_id"), lambda i: "run_id is empty"),
        (~frame["status"].isin(statuses),
         lambda i: f"status {_shown(frame['status'].iat[i])} is not one of {', '.join(statuses)}"),
        (empty("experiment"), lambda i: "experiment is empty"),
        (bad_start, lambda i: f"start_time {_shown(frame['start_time'].iat[i])} is not a number"),
        (empty("tags.algo"), lambda i: "tags.algo is empty (every benchmark run is tagged with its algorithm)"),
        (empty("tags.seed"), lambda i: "tags.seed is empty (every benchmark run is tagged with its seed)"),
        (~empty("tags.seed") & ~seed_integer,
         lambda i: f"tags.seed {_shown(column('tags.seed').iat[i])} is not an integer"),
        (metric & no_step, lambda i: "step is empty in a metric's row"),
        (metric & ~no_step & ~integer, lambda i: f"step {_shown(frame['step'].iat[i])} is not an integer"),
        (metric & ~no_value & ~number, lambda i: f"value {_shown(frame['value'].iat[i])} is not a number"),
        (metric & ~no_value & number & ~finite, lambda i: f"value {_shown(frame['value'].iat[i])} of {frame['metric'].iat[i]} "
         "is not finite (a value is a finite number, or nothing where the run logged NaN)"),
        (outside, out_of_range),
        (~metric & ~no_step, lambda i: f"step {_shown(frame['step'].iat[i])} in a row without a metric (a run "
         "that logged none has no step or value)"),
        (~metric & ~no_value, lambda i: f"value {_shown(frame['value'].iat[i])} in a row without a metric (a "
         "run that logged none has no step or value)"),
        (repeated, repeat),
    ]
    bad = [mask.to_numpy(dtype=bool) for mask, _ in checks]
    rows = [int(m.argmax()) for m in bad if m.any()]
    if not rows:
        return None
    row = min(rows)
    return row, next(say(row) for m, (_, say) in zip(bad, checks) if m[row])


def _line_of(path: Path, row: int) -> int:
    """The line of ``path`` on which data row ``row`` (0-based) starts, the header being line 1: a quoted
    field may hold line breaks, so the rows are counted as the CSV reader reads them."""
    import csv
    import gzip

    with path.open("rb") as f:
        zipped = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt", encoding="utf-8", newline="") if zipped else
          path.open(encoding="utf-8", newline="")) as f:
        reader = csv.reader(f)
        next(reader)  # the header
        start, n = reader.line_num + 1, 0
        for record in reader:
            if record:  # a blank line is no row (pandas skips it too)
                if n == row:
                    return start
                n += 1
            start = reader.line_num + 1
    return row + 2


def runs_of(frame: pd.DataFrame) -> list:
    """The frame's runs as ``RunData``, in the order they first appear: tags, params, latest
    metrics and the histories it holds."""
    out = []
    if frame.empty:
        return out
    tag_cols = [c for c in frame.columns if c.startswith("tags.")]
    param_cols = [c for c in frame.columns if c.startswith("params.")]
    # each run's rows, runs in the order they first appear; its first row as a dict, its metric rows as lists
    frame = frame[frame["run_id"].notna()]
    codes, run_ids = pd.factorize(frame["run_id"])
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(run_ids)))[:-1]
    positions = np.split(order, bounds)
    firsts = frame.iloc[[int(p[0]) for p in positions]].to_dict("records")
    keys, steps, values = (frame[c].tolist() for c in ("metric", "step", "value"))

    def present(v) -> bool:
        return isinstance(v, str) or (v is not None and not (isinstance(v, float) and math.isnan(v)))

    for run_id, first, rows in zip(run_ids, firsts, positions):
        tags = {c[5:]: str(first[c]) for c in tag_cols if present(first[c])}
        params = {c[7:]: str(first[c]) for c in param_cols if present(first[c])}
        metrics, history = {}, {}
        for i in rows.tolist():
            key, step, value = keys[i], steps[i], values[i]
            if not isinstance(key, str) or not key:
                continue
            step, value = int(float(step)), float(value)
            if step == LATEST:
                metrics[key] = value
            else:
                history.setdefault(key, []).append((step, value))
        started = _number(first["start_time"]) if "start_time" in first else None
        started = started if started is not None and math.isfinite(started) else None
        out.append(RunData(str(run_id), str(first["status"]), tags, params, metrics,
                           {k: sorted(v) for k, v in history.items()}, str(first["artifact_uri"] or ""),
                           str(first["experiment"]), started))
    return newest_counts(out)


def settings_key(run: RunData) -> str:
    """What makes two runs the same settings: the digest every run is tagged with (``gspo_bench.config``), or,
    for a run without one, its params less those that change nothing computed (``digest.NOT_HASHED``) and
    its tags less those each run has of its own (``RUN_OWN_TAGS``)."""
    digest = run.tags.get("gspo_bench.config")
    return digest or _params_and_tags(run)


def _params_and_tags(run: RunData, skip: tuple[str, ...] = ()) -> str:
    """A run's params less ``NOT_HASHED`` and ``skip``, and its tags less those each run has of its own."""
    from gspo_bench.tracking.digest import NOT_HASHED

    return repr((sorted((k, v) for k, v in run.params.items() if not k.startswith(NOT_HASHED) and k not in skip),
                 sorted((k, v) for k, v in run.tags.items() if not k.startswith(RUN_OWN_TAGS))))


# what the supervised warm start reached: resolved when a run starts, never set. The same settings and seed can
# reach other weights on another CPU (its kernels round otherwise), so two runs of one command on two machines
# may differ here, and so in their digests, and in nothing else
WARMSTART_OUTCOME = ("resolved.warmstart.pass1", "resolved.warmstart.dev_pass1", "resolved.warmstart.steps")


def warm_start_of(run: RunData) -> str:
    """The warm start a run began from, as ``pass1/dev_pass1/steps`` ('' for a run that logged none)."""
    values = [run.params.get(k) for k in WARMSTART_OUTCOME]
    return "" if all(v is None for v in values) else "/".join(str(v) for v in values)


def setup_key(run: RunData) -> str:
    """What a run was set to do: its params less ``NOT_HASHED`` and the warm start's outcome, and its tags
    less those each run has of its own. Two runs of one command on two machines share it even when their
    warm starts, and so their digests, differ."""
    return _params_and_tags(run, skip=WARMSTART_OUTCOME)


def _keep_newest(runs: list[RunData], keys: dict[int, str]) -> None:
    """Mark ``SUPERSEDED`` every run ``runs[i]`` (i in ``keys``) but the newest of those sharing its key."""
    finished = pd.DataFrame.from_records([{"i": i, "key": k, "start": runs[i].start_time} for i, k in keys.items()],
                                         columns=["i", "key", "start"])
    # a key whose runs all have a start time: newest first (a stable sort keeps the first of equal times); a key
    # with a run that lacks one: all NaN, so the listed order stands
    known = finished["start"].notna().groupby(finished["key"]).transform("all")
    finished["start"] = finished["start"].where(known)
    ranked = finished.sort_values("start", ascending=False, kind="stable", na_position="last")
    for i in ranked[ranked.duplicated("key", keep="first")]["i"]:
        runs[i].status = SUPERSEDED


def newest_counts(runs: list[RunData]) -> list[RunData]:
    """``runs`` with every FINISHED run but the newest of its (experiment, leaderboard group, settings, algorithm,
    seed) marked ``SUPERSEDED``: a second FINISHED run of one seed (a command run twice) is never counted as
    another seed. Newest: the latest ``start_time``; without one, the first in ``runs`` (MLflow lists runs newest
    first, and a runs table keeps that order). Step 1 of the rule for several runs of one seed (``seeds.py``).

    Then the same among runs that logged a warm start and differ in nothing but its outcome (``setup_key``): the
    command run again on another machine, whose warm start came out otherwise. The newer run counts, so a seed's
    runs can be made again on one machine and pair on one warm start (``mixed_warm_starts`` names seeds that
    still mix two)."""
    _keep_newest(runs, {i: repr((r.experiment, r.group, settings_key(r), r.algo, r.seed))
                        for i, r in enumerate(runs) if r.status == FINISHED})
    _keep_newest(runs, {i: repr((r.experiment, r.group, setup_key(r), r.algo, r.seed))
                        for i, r in enumerate(runs) if r.status == FINISHED and warm_start_of(r)})
    return runs


def mixed_warm_starts(runs: list[RunData]) -> str:
    """One sentence naming the seeds whose counted FINISHED runs, in one experiment, task, model and preset,
    began from more than one warm start (runs made on two machines), or '' when there are none: a paired
    difference at such a seed compares runs that did not start from the same weights."""
    starts: dict[tuple, set[str]] = {}
    for r in runs:
        if r.status == FINISHED and r.seed != "?" and warm_start_of(r):
            starts.setdefault((r.experiment, *r.group[:3], r.seed), set()).add(warm_start_of(r))
    mixed = sorted((k for k, v in starts.items() if len(v) > 1), key=lambda k: (k[:4], len(k[4]), k[4]))
    if not mixed:
        return ""
    where = ", ".join(f"{k[1]}/{k[2]} seed {k[4]}" for k in mixed)
    return (f"runs from more than one warm start (pass@1/dev pass@1/steps) at {where}: their paired differences "
            "compare runs that began from other weights; run those seeds' cells again on one machine")


def set_aside(runs: list[RunData]) -> str:
    """One sentence on the FINISHED runs ``newest_counts`` set aside, or '' when it set none aside."""
    n = sum(r.status == SUPERSEDED for r in runs)
    if not n:
        return ""
    return (f"{n} FINISHED run(s) set aside as {SUPERSEDED}: an older run of the same settings, algorithm and "
            "seed as a newer one, which alone is counted (settings that differ only in what the warm start "
            "reached, the same command on another CPU, count as the same)")


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
