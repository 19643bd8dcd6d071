"""The paired-comparison core of both paired tables: algorithms against a baseline algorithm
(``paired_table.py``, ``--baseline ALGO``) and splits against a baseline split (``split_pairs.py``,
``--baseline TAG=VALUE``). Each of them only chooses which per-seed cells to compare and names its columns;
everything else is here.

- ``seed_table``: per (group, ``--by`` values, algorithm, seed) the paired metrics (``PAIRED_METRICS``:
  final pass@1, AUC, steps to +10 pts) of its FINISHED runs, several runs of one seed counted by the one
  rule of ``seeds.py``; ``cell`` takes one (group, split, algorithm) out of it.
- ``compare``: per metric the paired differences of two cells, seed by seed (``paired.paired_summary``);
  ``pooled_mde``: a group's MDE for final pass@1 from its comparisons.
- rendering shared by both tables: the statistic cells of a row (``stat_cells``), the CSV records, the
  markdown and Rich assembly, and the leaderboard followed by a paired table (``with_leaderboard``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from gspo_bench import tables
from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.grouping import by_title, flat, split_values
from gspo_bench.reporting.leaderboard import _plain, render, rich_table, run_summary
from gspo_bench.reporting.paired import (holm, holm_first_level, mde, pair_by_seed, paired_summary, pooled_sd,
                                        region_test, seed_key)
from gspo_bench.reporting.seeds import RUNS, per_seed, run_table

ALPHA, POWER = 0.05, 0.8  # paired tables: 95 % intervals, MDE at 80 % power
GROUP = ("task", "model", "preset", "config")  # the columns of a leaderboard group (``RunData.group``)

# (CSV name, ``run_summary`` key, label, unit, display scale): pass@1 differences are shown in points
PAIRED_METRICS = (("final_pass1", "final", "final pass@1", "points", 100.0),
                  ("auc_pass1", "auc", "AUC pass@1", "points", 100.0),
                  ("steps_to_10", "steps_to", "steps to +10 pts", "steps", 1.0))


def group_title(key: tuple[str, ...], by: tuple[str, ...] = ()) -> str:
    """``task / model``, then preset and config when not ``default``, then ``tag=value`` per ``by`` tag (the
    report's section titles)."""
    task, model, preset, config, *vals = key
    return f"{task} / {model}" + (f" / {preset}" if preset != "default" else "") + (
        f" / {config}" if config != "default" else "") + by_title(by, tuple(vals))


# -- per-seed values -----------------------------------------------------------------------------------------------
def by_column(tag: str) -> str:
    """The ``seed_table`` column of a ``--by`` tag (prefixed, so no tag name can clash with another column)."""
    return f"by:{tag}"


def seed_table(runs: list[RunData], by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per (task, model, preset, config, ``by`` values, algo, seed), sorted: the ``PAIRED_METRICS`` values of
    the seed's FINISHED runs (``seeds.per_seed``: a mean over its runs, NaN where one lacks the value) and
    ``runs``. The ``by`` levels are named ``by_column(tag)``."""
    def columns(r: RunData) -> dict:
        summary = run_summary(r)
        return {**dict(zip(GROUP, r.group)), **{by_column(t): v for t, v in zip(by, split_values(r.tags, by))},
                "algo": r.algo, **{k: summary[k] for _, k, *_ in PAIRED_METRICS}}

    return per_seed(run_table(runs, columns), [*GROUP, *map(by_column, by), "algo"],
                    [k for _, k, *_ in PAIRED_METRICS])


def cell(table: pd.DataFrame, key: tuple) -> dict[str, dict[str, float]]:
    """{seed: {metric key: value}} of the cell ``key`` (every level of ``table``'s index but the seed); {}
    for a cell it lacks. NaN stands for a missing value (``pair_by_seed`` leaves it out)."""
    try:
        rows = table.xs(key, level=list(range(len(key))))
    except KeyError:
        return {}
    return rows.drop(columns=RUNS).to_dict("index")


# -- comparing two cells -------------------------------------------------------------------------------------------
# (run tags of the compared cell, run tags of its baseline cell) -> the region a claim registered, or None
Regions = Callable[[dict, dict], "tuple[float, float] | None"]


def no_regions(mine: dict, base: dict) -> None:
    """No claim registers a region here: every comparison is the t test against 0."""
    return None


def compare(mine: dict[str, dict], base: dict[str, dict], alpha: float = ALPHA, power: float = POWER,
            region: tuple[float, float] | None = None) -> list[dict]:
    """Per ``PAIRED_METRICS`` metric, the paired differences ``mine - base`` (``cell`` dicts): the row fields
    every paired table shares (``n`` pairs of the ``common`` seeds, their ``seeds``, ``mean_diff``,
    ``sd_diff``, ``ci_low``/``ci_high``, ``significant``, ``p``, ``mde``, the ``PairedStat`` as ``stat``).

    ``region``: the region (points of pass@1) a claim registered for this comparison's final pass@1
    (``claim_specs.region_lookup``). Its row's ``p`` is then that region's test (``paired.region_test``: inside
    or outside, ``inside`` says which) instead of the t test against 0, and ``region`` and ``label`` say so, so
    that every page showing the comparison prints one p, Holm p and verdict for it."""
    common = sorted(set(mine) & set(base), key=seed_key)
    rows = []
    for name, k, label, unit, scale in PAIRED_METRICS:
        # d_s = metric(compared, s) - metric(baseline, s), over the seeds where both have it
        seeds, diffs = pair_by_seed({s: v[k] for s, v in mine.items()}, {s: v[k] for s, v in base.items()})
        st = paired_summary(diffs, alpha, power)
        # a tie (every seed's difference equal, e.g. all at the evaluation's floor) has no spread: the table
        # shows no interval, test or MDE for it (n/a), and it is no member of a Holm family
        ci = None if st.tied else st.ci
        row = {"metric": name, "label": label, "unit": unit, "scale": scale, "n": st.n, "common": len(common),
               "seeds": ",".join(seeds), "mean_diff": st.mean, "sd_diff": st.sd,
               "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None,
               "significant": st.significant and not st.tied, "p": None if st.tied else st.p, "p_holm": None,
               "mde": st.mde, "stat": st}
        if region is not None and name == "final_pass1":
            # the claim's region in pass@1 units (the row's scale): p of its one test, inside or outside
            test = region_test(st, tuple(x / scale for x in region))
            row.update(region=region, label=f"{label}, claimed {region_text(region)}",
                       p=None if test is None else test[0], inside=None if test is None else test[1])
        rows.append(row)
    return rows


def region_text(region: tuple[float, float]) -> str:
    """A claimed region of points as a table states it: ``> +3``, ``< +3``, ``(-3, +3)``."""
    lo, hi = region
    if math.isfinite(lo) and math.isfinite(hi):
        return f"({lo:+g}, {hi:+g})"
    return f"> {lo:+g}" if math.isfinite(lo) else f"< {hi:+g}"


def pooled_mde(rows: list[dict], alpha: float = ALPHA, power: float = POWER) -> tuple:
    """``(mde, n, sd, k)``: the experiment-level MDE of final pass@1 over the comparisons in ``rows`` with 2 or
    more pairs (k of them): the pooled sd sqrt(mean of their variances) at their smallest n; Nones and 0s when
    no comparison has 2 pairs."""
    stats = [r["stat"] for r in rows if r.get("metric") == "final_pass1" and r["stat"] is not None
             and r["stat"].sd is not None]
    if not stats:
        return None, 0, None, 0
    # experiment MDE = mde(pooled sd, common n); pooled sd = sqrt(mean_a sd_a^2), common n = min_a n_a
    n, sd = min(st.n for st in stats), pooled_sd([st.sd for st in stats])
    return mde(sd, n, alpha, power), n, sd, len(stats)


@dataclass
class Pooled:
    """How a group's MDE line names what it pooled: ``one`` / ``many`` comparison (``algorithm`` /
    ``algorithms``) and ``who`` has no 2 pairs (``no algorithm``)."""

    one: str
    many: str
    who: str


def level_text(alpha: float) -> str:
    """A test level as a table states it: ``α 0.05``, ``α 0.0042`` (two significant digits below 0.01)."""
    return f"α {alpha:.2g}" if alpha < 0.01 else f"α {alpha:.3g}"


def mde_text(head: str, baseline: str, note: str | None, mde_: float | None, n: int, sd: float | None, k: int,
             pooled: Pooled, alpha: float = ALPHA, why: str = "") -> str:
    """A group's one line: its MDE for final pass@1 over its comparisons, or why there is none; ``alpha``: the
    level it is computed at (``why``: what sets that level, e.g. Holm's first step)."""
    if note:
        return f"{head}no paired differences vs {baseline}: {note}."
    if mde_ is None:
        return f"{head}MDE (final pass@1): not available, {pooled.who} has 2 or more seeds paired with {baseline}."
    return (f"{head}MDE (final pass@1, {n} seeds, {level_text(alpha)}{why}, 80 % power): {points_text(mde_)} points "
            f"(pooled sd of the paired differences {100 * sd:.1f} points over {k} "
            f"{pooled.one if k == 1 else pooled.many})")


def points_text(mde_: float) -> str:
    """An MDE of pass@1 in points; past 100 (no difference a pass@1 can have, which runs from -100 to +100
    points, would be detected) '> 100', not a number that suggests a scale."""
    # points = 100 x pass@1
    return "> 100" if 100 * mde_ > 100 else f"{100 * mde_:.1f}"


def adjust_holm(rows: list[dict], alpha: float = ALPHA, power: float = POWER) -> int:
    """Set ``p_holm`` on ``rows`` (one group's): Holm's adjustment over the group's algorithms, per metric, so a
    group of k algorithms compared with the baseline is one family of k tests per metric. Each row's ``mde``
    is then the one at the level that decides it for the family, Holm's first step alpha / k
    (``holm_first_level``), named in ``mde_alpha``. Returns k for final pass@1 (the group line's level)."""
    sizes = {}
    for name, *_ in PAIRED_METRICS:
        family = [r for r in rows if r["metric"] == name]
        sizes[name] = k = sum(r["p"] is not None for r in family)
        level = holm_first_level(alpha, k)
        for r, q in zip(family, holm([r["p"] for r in family])):
            r["p_holm"], r["mde_alpha"] = q, level
            st = r["stat"]
            r["mde"] = None if st is None or st.tied else mde(st.sd, st.n, level, power)
    return sizes.get("final_pass1", 0)


def decided(row: dict, alpha: float = ALPHA) -> bool:
    """A comparison row decided under the one multiplicity rule: its Holm-adjusted p below ``alpha``."""
    return row.get("p_holm") is not None and row["p_holm"] < alpha


# -- rendering shared by both tables -------------------------------------------------------------------------------
NO_RUN = "No finished run: no paired differences."


def stat_cells(row: dict, extra: Callable[[dict], list[str]] = lambda row: []) -> list[str]:
    """A comparison row's cells from its metric on: metric (unit), pairs, mean diff, 95 % CI, significant,
    then ``extra(row)``, then the MDE; in display units (pass@1 in points)."""
    scale = row["scale"]

    def num(x, sign="+"):
        return "-" if x is None else f"{scale * x:{sign}.1f}"

    n = str(row["n"]) if row["n"] == row["common"] else f"{row['n']} of {row['common']}"
    has_ci = row["ci_low"] is not None
    # every seed's difference the same (a tie at an evaluation floor): no spread, so no interval, test or MDE
    na = "-" if row["stat"] is None or not row["stat"].tied else "n/a"
    cells = [f"{row['label']} ({row['unit']})", n, num(row["mean_diff"]),
             f"[{num(row['ci_low'])}, {num(row['ci_high'])}]" if has_ci else na,
             ("yes" if row["significant"] else "no") if has_ci else na, *extra(row),
             na if row["mde"] is None else points_text(row["mde"]) if row["unit"] == "points" else num(row["mde"], "")]
    return cells


def p_text(x: float | None, row: dict | None = None) -> str:
    """A p value for a table: 3 significant digits, below 0.001 as '<0.001', '-' when there is none ('n/a' for
    a tie: every seed's difference equal)."""
    if x is None:
        return "n/a" if row is not None and row["stat"] is not None and row["stat"].tied else "-"
    return "<0.001" if x < 0.001 else f"{x:.3g}"


def p_cells(row: dict) -> list[str]:
    """A comparison row's p and Holm p cells (``stat_cells``' ``extra``)."""
    return [p_text(row.get("p"), row), p_text(row.get("p_holm"), row)]


def csv_text(fields: tuple[str, ...], rows: list[dict]) -> str:
    """``rows`` as CSV (raw: pass@1 units and steps); significant: true / false, empty without an interval
    (fewer than 2 pairs, or a note row)."""
    records = [{**r, "significant": None if r["ci_low"] is None else str(r["significant"]).lower()}
               for r in map(flat, rows)]
    return tables.csv_text(fields, records)


def markdown(title: str | None, columns: tuple[str, ...], cells: list[list[str]], lines: list[str]) -> str:
    """The bold ``title`` line, the table of ``cells`` (none: no table), one bullet per group line (none: the
    line saying there is no finished run)."""
    out = [f"**{title}.**", ""] if title else []
    if cells:
        out += [tables.markdown(columns, cells)]
    out += [f"- {line}" for line in lines] or [NO_RUN]
    return "\n".join(out) + "\n"


def rich(title: str, columns: tuple[str, ...], left: int, sections: list[list[tuple[list[str], str | None]]],
         lines: list[str]) -> list:
    """Rich renderables: the table (``left`` columns left-aligned, one section per entry of ``sections``, each
    a list of (cells, style)), when there is any, then one text per group line."""
    from rich.table import Table
    from rich.text import Text

    out = []
    if sections:
        t = Table(title=title)
        for i, col in enumerate(columns):
            t.add_column(col, justify="left" if i < left else "right")
        for i, rows in enumerate(sections):
            if i:
                t.add_section()
            for cells, style in rows:
                t.add_row(*cells, style=style)
        out.append(t)
    return out + ([Text(line) for line in lines] or [Text(NO_RUN)])


def with_leaderboard(rows: list[dict], fmt: str, title: str | None, md: Callable[[], str],
                     rich_parts: Callable[[], list]) -> str:
    """The leaderboard ``rows`` (``leaderboard.render``), then in ``table`` and ``md`` a paired table
    (``md()`` / ``rich_parts()``); ``csv`` stays the leaderboard alone, one table (the CLI's ``--paired``
    prints the paired CSV instead)."""
    if fmt == "md":
        return render(rows, "md") + "\n" + md()
    if fmt == "table":
        return _plain(rich_table(rows, title), *rich_parts())
    return render(rows, fmt, title)  # csv, or the error naming the formats
