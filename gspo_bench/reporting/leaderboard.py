"""``leaderboard``: one row per algorithm and (task, model, preset, config) group, read back from MLflow.

``collect`` is the whole pipeline for the CLI and the tests; it is
``summarise(load_runs(...))``, and ``render`` turns its rows into a Rich
table, Markdown or CSV. ``config`` is the run tag ``tuning``: ``default``
(also when the tag is absent) or ``tuned`` (a run of a ``tune`` best-params
file), so tuned and default settings show side by side. Never read: runs
tagged ``kind=report`` (the report's own run) or ``kind=study`` (a tuning
study's parent run), and the trials of a study (``tuning=trial``): each
trial has different settings, so averaging them would mean nothing.

Definitions (also in ``NOTES``, printed by ``report`` and ``--help``):

- final / best pass@1: ``eval/pass1`` at the last eval step / its maximum,
  mean ± *sample* std (ddof 1) over seeds; one seed shows the mean alone.
- AUC: trapezoid of ``eval/pass1`` over the step axis rescaled to [0, 1]
  (first to last eval step), i.e. the mean pass@1 over training.
- steps to +10 pts: the step where pass@1 first reaches pass@1 at step 0 +
  0.10, read linearly between the evaluation below it and the first at or
  above it, averaged over the seeds that got there, with how many did.
- clip/frac: per run the mean of ``clip/frac`` over steps, then the mean over seeds.
- completions/s: end to end, ``prompts_per_step * group_size * steps done /
  time/wall_s`` (wall time includes evaluation), mean over seeds.

Only FINISHED runs are aggregated, one per (settings, algorithm, seed): an
older FINISHED run of the same ones is SUPERSEDED (``frame.newest_counts``).
FAILED, RUNNING (or KILLED) and SUPERSEDED runs get a row of their own per
algorithm with their count, their collapse count and no other numbers. The CLI treats an empty leaderboard (no run matches) as an
error: one line, exit 2.

``--by TAG[,TAG...]`` (``summarise(runs, by)``) splits every group further
by the values of those run tags, shown as columns after ``config`` (``-``: the
run lacks the tag); see ``grouping.py``. Without it nothing changes.

The paired differences against a baseline algorithm (``--baseline``,
default grpo) are built from these runs in ``paired_table.py``, whose
``render_with_paired`` prints this leaderboard followed by them; this
module never imports it.
"""

from __future__ import annotations

import io
import math
import re
import statistics
from pathlib import Path

import pandas as pd

from gspo_bench import tables
from gspo_bench.config import CONNECT_TIMEOUT_S, ConfigError, TrackingConfig, resolve_tracking_uri
from gspo_bench.reporting.frame import FINISHED, RunData, load_frame, runs_of
from gspo_bench.reporting.seeds import per_seed
from gspo_bench.reporting.paired import seed_key
from gspo_bench.reporting.grouping import by_names, check_by, flat, split_values, with_by
from gspo_bench.tracking import stores

DEFAULT_EXPERIMENT = "gspo_bench"
PLUS = 0.10  # "warm start + 10 points"
# metric histories the leaderboard needs; ``collapse/<kind>`` ones are added per run
LEADERBOARD_METRICS = ("eval/pass1", "clip/frac", "reward/mean")
DEFAULT_BASELINE = "grpo"

NOTES = (
    "final/best pass@1 and AUC: mean ± sample std (ddof 1) over seeds (one seed: mean only). "
    "AUC = trapezoid of eval/pass1 over steps rescaled to [0, 1] = mean pass@1 over training. "
    "steps to +10 pts = the step where pass@1 first reaches step-0 pass@1 + 0.10, read linearly between the "
    "evaluation below it and the first at or above it, mean over the seeds that reached it (reached/seeds). "
    "final pass@k (when the runs logged it): the last evaluation's unbiased pass@k (@k) and mean@k from its "
    "eval_samples samples per prompt, mean over seeds. "
    "clip/frac = mean over steps, then over seeds. completions/s = end to end: "
    "prompts_per_step x group_size x steps done / time/wall_s. FAILED and RUNNING runs are counted, never averaged; "
    "so is a SUPERSEDED one: a FINISHED run of the same settings, algorithm and seed as a newer one, which alone "
    "counts (a seed is never counted twice; settings that differ only in what the warm start reached, the same "
    "command on another CPU, count as the same). "
    "config = the run tag tuning: default, or tuned for a run of a tune best-params file (tune's own trial runs "
    "are not shown). "
    "Paired differences vs the baseline (--baseline, default grpo): per group, d_s = metric(algo, seed s) - "
    "metric(baseline, seed s) over the seeds where both have a FINISHED run (same warm start and prompt order), for "
    "final pass@1, AUC (both in points = 100 x pass@1) and steps to +10 pts (only seeds where both reached it; "
    "negative = sooner); mean diff with its 95 % t interval (n-1 df, sample sd); significant = the interval "
    "excludes 0, each comparison on its own; p = the paired t test's p, Holm p = p adjusted by Holm's method over "
    "the group's algorithms, one family per metric (below 0.05: decided within that metric's family). MDE = d x sd: "
    "the true difference a two-sided paired t test at Holm's first step (alpha 0.05 / k over the k algorithms "
    "with a p) detects with 80 % power, d solved exactly from the noncentral t with n-1 df. The "
    "group's MDE line uses the pooled sd sqrt(mean of the algorithms' variances of the final pass@1 differences) "
    "and their common number of pairs (the smallest when they differ); an MDE past 100 points (pass@1 differences "
    "run from -100 to +100) shows as > 100: no difference could be detected. Fewer than 2 pairs: no interval, no MDE; "
    "every seed's difference equal (a tie): n/a, and no member of the Holm family."
)


def read_uri(uri: str | None) -> str:
    """The tracking URI to read: the flag, else $MLFLOW_TRACKING_URI, else ``config.DEFAULT_TRACKING_URI``.

    Reading a sqlite URI whose file does not exist would silently create an
    empty store, so that is an error here; every other store goes through the
    one store check (``stores.check_readable``): one line, exit 2, within
    ``tracking.connect_timeout_s``, when it does not answer or does not open.
    """
    uri = resolve_tracking_uri(uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).expanduser()
        if not db.is_file():
            raise ConfigError(f"tracking URI {uri!r}: no database file {str(db)!r}")
    stores.apply_retry_budget(TrackingConfig().retry_budget_s)  # a server that dies mid-read: a minute, not ten
    stores.check_readable(uri, CONNECT_TIMEOUT_S)
    return uri


def slug(*parts: str) -> str:
    """A file-name-safe label for a group or study, e.g. ``arith_tiny-dense_tuned`` (report figure names)."""
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p).strip("-") for p in parts if p)


def load_runs(uri: str, experiment: str = DEFAULT_EXPERIMENT, task: str | None = None, model: str | None = None,
              metrics: tuple[str, ...] = LEADERBOARD_METRICS) -> list[RunData]:
    """The experiment's benchmark runs (no report, study or trial run), histories of ``metrics`` for FINISHED
    ones: ``frame.runs_of`` over ``frame.load_frame``."""
    return runs_of(load_frame(uri, experiment, task, model, metrics))


# -- per-run numbers -------------------------------------------------------------------------------------------
def auc(curve: list[tuple[int, float]]) -> float | None:
    """Trapezoid of the curve over its step range rescaled to [0, 1]: the mean value over training."""
    if not curve:
        return None
    if len(curve) == 1 or curve[-1][0] == curve[0][0]:
        return curve[-1][1]
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(curve, curve[1:]))
    return area / (curve[-1][0] - curve[0][0])


def steps_to_gain(curve: list[tuple[int, float]], gain: float = PLUS) -> float | None:
    """The step at which the curve first reaches its first value + ``gain``, read linearly between the last
    evaluation below the target and the first at or above it (None: never reached). Evaluations are
    ``eval_every`` steps apart, so the first one at or above the target would tie every run that gets there
    between the same two evaluations; the crossing point tells them apart."""
    if not curve:
        return None
    target = curve[0][1] + gain - 1e-9  # pass@1 is k/n in floats: 0.5 + 0.1 must count as reached
    for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
        if v1 >= target:
            if v0 >= target:  # reached and held (a curve that starts above its own target cannot): at s1
                return float(s1)
            # s* = s0 + (target - v0) / (v1 - v0) * (s1 - s0): where the straight line between them crosses
            return s0 + (target - v0) / (v1 - v0) * (s1 - s0)
    return None


def _param(run: RunData, *keys: str) -> float | None:
    for k in keys:
        try:
            return float(run.params[k])
        except (KeyError, ValueError):
            continue
    return None


def run_summary(run: RunData) -> dict:
    """The leaderboard's numbers for one finished run."""
    ev = run.history.get("eval/pass1", [])
    clip = [v for _, v in run.history.get("clip/frac", [])]
    steps_done = len([s for s, _ in run.history.get("reward/mean", []) if s > 0]) or _param(run, "train.steps")
    wall = run.metrics.get("time/wall_s")
    per_step = _param(run, "resolved.rollout.prompts_per_step", "rollout.prompts_per_step")
    group = _param(run, "resolved.rollout.group_size", "rollout.group_size")
    cps = per_step * group * steps_done / wall if None not in (per_step, group, steps_done) and wall else None
    tag = run.tags.get("collapse.count")
    # the last evaluation's unbiased pass@k and mean@k, for every k the run logged (eval/pass_at_<k>, ...)
    at_k = {key.split("/", 1)[1]: v for key, v in run.metrics.items() if AT_K.fullmatch(key)}
    return {
        "warm": ev[0][1] if ev else _param(run, "resolved.warmstart.pass1"),
        "final": ev[-1][1] if ev else None,
        "best": max(v for _, v in ev) if ev else None,
        "auc": auc(ev),
        "steps_to": steps_to_gain(ev),
        "clip": statistics.fmean(clip) if clip else None,
        "collapses": int(tag) if tag and tag.isdigit() else len(run.collapse_steps()),
        "wall": wall,
        "cps": cps,
        **at_k,
    }


# -- aggregation -------------------------------------------------------------------------------------------------
GROUP = ["task", "model", "preset", "config"]
SUMMARY = ["warm", "final", "best", "auc", "steps_to", "clip", "wall", "cps"]  # ``run_summary``'s averaged values
AT_K = re.compile(r"eval/(pass|mean)_at_(\d+)")  # the sampled evaluation's pass@k and mean@k metrics


def _run_frame(runs: list[RunData], by: tuple[str, ...], finished: bool) -> pd.DataFrame:
    """One row per run (FINISHED ones, or the others): its group, its ``by`` values (``by:<tag>`` columns), its
    algorithm, status and seed; FINISHED ones also their ``run_summary`` (NaN for a value they lack)."""
    def record(r: RunData) -> dict:
        row = dict(zip(GROUP, r.group)) | {f"by:{t}": v for t, v in zip(by, split_values(r.tags, by))}
        row |= {"algo": r.algo, "status": r.status, "seed": r.seed}
        if not finished:
            tag = r.tags.get("collapse.count", "")
            return row | {"collapses": int(tag) if tag.isdigit() else 0}
        return row | {k: math.nan if v is None else float(v) for k, v in run_summary(r).items()}

    return pd.DataFrame.from_records([record(r) for r in runs if (r.status == FINISHED) == finished])


def _number(x) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def summarise(runs: list[RunData], by: tuple[str, ...] = ()) -> list[dict]:
    """Rows: per group, per algorithm, one aggregated FINISHED row, plus one row per other status. ``by``:
    run tags splitting the groups further; each row then has ``row["by"] = {tag: value}``.

    A FINISHED row's numbers are over seeds: a seed with several runs in the row (settings the row does not
    split by) counts once, with the mean of its runs (``seeds.per_seed``); the row's mean and sample std are
    over those per-seed values; ``n`` counts the runs, ``seeds`` names the seeds."""
    cell = [*GROUP, *(f"by:{t}" for t in by), "algo"]
    rows = []

    def start(key: tuple, status: str, part: pd.DataFrame) -> dict:
        values = dict(zip(cell, key))
        row = {k: values[k] for k in GROUP} | {"algo": values["algo"], "status": status, "n": len(part),
                                               "seeds": ",".join(sorted(set(part["seed"]), key=seed_key))}
        if by:
            row["by"] = {t: values[f"by:{t}"] for t in by}
        return row

    others = _run_frame(runs, by, finished=False)
    if not others.empty:  # counted, never averaged; their collapse tags still say what went wrong
        for (*key, status), part in others.groupby([*cell, "status"], sort=False, dropna=False):
            rows.append(start(tuple(key), status, part) | {"collapses": int(part["collapses"].sum())})
    finished = _run_frame(runs, by, finished=True)
    if not finished.empty:
        at_k = sorted((c for c in finished.columns if AT_K.fullmatch(f"eval/{c}")),
                      key=lambda c: (c.split("_")[0] != "pass", int(c.rsplit("_", 1)[1])))
        values = SUMMARY + at_k
        seeds = per_seed(finished, cell, values)  # one row per (cell, seed): the mean of its runs
        over = seeds.groupby(level=cell, sort=False)
        means, stds = over[values].mean(), over[values].std(ddof=1)  # skipping NaN: the seeds that have it
        reached = over["steps_to"].count()
        for key, part in finished.groupby(cell, sort=False, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            m, sd = means.loc[key], stds.loc[key]
            row = start(key, FINISHED, part)
            row["warm_pass1"] = _number(m["warm"])
            for k in ("final", "best", "auc"):
                row[f"{k}_pass1"], row[f"{k}_pass1_std"] = _number(m[k]), _number(sd[k])
            row["steps_to_10"], row["reached_10"] = _number(m["steps_to"]), int(reached.loc[key])
            row["clip_frac"] = _number(m["clip"])
            row["collapses"] = int(part["collapses"].sum())  # events, over every run
            row["wall_s"], row["completions_per_s"] = _number(m["wall"]), _number(m["cps"])
            # over the seeds that logged it (runs made before pass@k was logged have none)
            row["at_k"] = {c: v for c in at_k if (v := _number(m[c])) is not None}
            rows.append(row)

    def order(row):
        fin = row["status"] == FINISHED
        final = row.get("final_pass1")
        auc_ = row.get("auc_pass1")
        return (row["task"], row["model"], row["preset"], row["config"], *row.get("by", {}).values(), not fin,
                -final if final is not None else math.inf, -auc_ if auc_ is not None else math.inf, row["algo"],
                row["status"])

    return sorted(rows, key=order)


def before_dev_split(run: RunData) -> bool:
    """A run warm-started before the dev split existed: it logs no ``resolved.warmstart.dev_pass1`` (its warm
    start was accepted on the eval split)."""
    return "resolved.warmstart.dev_pass1" not in run.params


def predates_dev_split(runs: list[RunData]) -> str:
    """One sentence when FINISHED runs among ``runs`` were warm-started before the dev split existed
    (``before_dev_split``), or ''."""
    finished = [r for r in runs if r.status == FINISHED]
    old = sum(map(before_dev_split, finished))
    if not old:
        return ""
    return (f"{old} of {len(finished)} FINISHED runs predate the dev split: their warm start was accepted on the "
            "eval split their scores are read on, which flatters the starting point the lift is measured from")


def no_runs_message(experiment: str, task: str | None = None, model: str | None = None) -> str:
    filt = ", ".join(f"{k}={v!r}" for k, v in (("task", task), ("model", model)) if v)
    return f"experiment {experiment!r} has no benchmark runs" + (f" matching {filt}" if filt else "")


def collect(uri: str, experiment: str = DEFAULT_EXPERIMENT, task: str | None = None,
            model: str | None = None, by: tuple[str, ...] = ()) -> list[dict]:
    """Leaderboard rows for an experiment (see the module docstring for every definition)."""
    runs = load_runs(uri, experiment, task, model)
    if by and runs:
        check_by(runs, by)
    return summarise(runs, by)


# -- rendering -----------------------------------------------------------------------------------------------------
CSV_FIELDS = ("task", "model", "preset", "config", "algo", "status", "n", "seeds", "warm_pass1", "final_pass1",
              "final_pass1_std", "best_pass1", "best_pass1_std", "auc_pass1", "auc_pass1_std", "steps_to_10",
              "reached_10", "clip_frac", "collapses", "wall_s", "completions_per_s")
COLUMNS = ("task", "model", "preset", "config", "algo", "status", "seeds", "warm start", "final pass@1",
           "best pass@1", "AUC pass@1", "steps to +10 pts", "clip/frac", "collapses", "wall s", "completions/s")


def _pm(mean, std, fmt: str = ".3f") -> str:
    if mean is None:
        return "-"
    return f"{mean:{fmt}}" if std is None else f"{mean:{fmt}} ± {std:{fmt}}"


def at_k_names(rows: list[dict]) -> list[str]:
    """The pass@k and mean@k values any row has (``pass_at_1``, ``pass_at_4``, ``mean_at_1``, ...), in order."""
    names = {c for row in rows for c in row.get("at_k", {})}
    return sorted(names, key=lambda c: (c.split("_")[0] != "pass", int(c.rsplit("_", 1)[1])))


def _at_k_cell(row: dict, names: list[str]) -> str:
    """``@1 0.512, @4 0.700 | mean@4 0.488``: the final sampled evaluation's pass@k (and mean@k), over seeds."""
    got = row.get("at_k", {})
    parts = [f"{'@' if c.startswith('pass') else 'mean@'}{c.rsplit('_', 1)[1]} {got[c]:.3f}" for c in names if c in got]
    return ", ".join(parts) or "-"


def columns(rows: list[dict]) -> tuple[str, ...]:
    """The leaderboard's columns: ``final pass@k`` after ``final pass@1`` when a row has pass@k values."""
    if not at_k_names(rows):
        return COLUMNS
    i = COLUMNS.index("final pass@1") + 1
    return (*COLUMNS[:i], "final pass@k", *COLUMNS[i:])


def _cells(row: dict, names: list[str] | None = None) -> list[str]:
    names = names or []
    head = [row["task"], row["model"], row["preset"], row["config"], *row.get("by", {}).values(), row["algo"]]
    if row["status"] != FINISHED:
        return head + [f"{row['status']} ×{row['n']}", f"{row['n']} ({row['seeds']})"] + ["-"] * (
            6 + bool(names)) + [str(row.get("collapses", "-"))] + ["-"] * 2
    steps = row["steps_to_10"]
    reach = f"({row['reached_10']}/{row['n']})"
    clip = row["clip_frac"]
    return head + [
        "finished", f"{row['n']} ({row['seeds']})", _pm(row["warm_pass1"], None),
        _pm(row["final_pass1"], row["final_pass1_std"]), *([_at_k_cell(row, names)] if names else []),
        _pm(row["best_pass1"], row["best_pass1_std"]),
        _pm(row["auc_pass1"], row["auc_pass1_std"]), f"{steps:.0f} {reach}" if steps is not None else f"never {reach}",
        f"{100 * clip:#.3g} %" if clip is not None else "-", str(row["collapses"]),
        f"{row['wall_s']:.0f}" if row["wall_s"] is not None else "-",
        f"{row['completions_per_s']:.1f}" if row["completions_per_s"] is not None else "-",
    ]


def rich_table(rows: list[dict], title: str | None = None):
    from rich.table import Table

    t = Table(title=title)
    names = by_names(rows)
    cols = with_by(columns(rows), names)
    ks = at_k_names(rows)
    for col in cols:
        t.add_column(col, justify="left" if col in cols[:7 + len(names)] else "right")
    prev = None
    for row in rows:
        group = (row["task"], row["model"], row["preset"], row["config"], *row.get("by", {}).values())
        if prev is not None and group != prev:
            t.add_section()
        prev = group
        t.add_row(*_cells(row, ks), style=None if row["status"] == FINISHED else "red")
    return t


def render(rows: list[dict], fmt: str = "md", title: str | None = None) -> str:
    """``table`` (Rich, as plain text), ``md`` (formatted cells) or ``csv`` (raw numbers, empty = none): the
    leaderboard table alone (``paired_table.render_with_paired`` goes on with the paired differences)."""
    ks = at_k_names(rows)
    if fmt == "csv":  # --by: the tags after config; pass@k and mean@k as final_<name> after the fixed fields
        fields = (*with_by(CSV_FIELDS, by_names(rows)), *(f"final_{c}" for c in ks))
        return tables.csv_text(fields, ({**flat(r), **{f"final_{c}": v for c, v in r.get("at_k", {}).items()}}
                                        for r in rows))
    if fmt == "md":
        return tables.markdown(with_by(columns(rows), by_names(rows)), (_cells(r, ks) for r in rows))
    if fmt == "table":
        return _plain(rich_table(rows, title))
    raise ConfigError(f"format {fmt!r} is not one of: table, md, csv")


def _plain(*renderables) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=220, color_system=None)
    for r in renderables:
        console.print(r)
    return console.file.getvalue()
