"""``paired_table``: the leaderboard's paired table, algorithms against a baseline algorithm; a view of the
paired-comparison core in ``pairing.py``.

Paired differences (``paired_groups``): per group and per algorithm A other
than the baseline B (``--baseline``, default grpo), ``d_s = metric(A, s) -
metric(B, s)`` over the seeds where both have a FINISHED run, for final
pass@1, AUC and steps to +10 pts (there only the seeds where both reached the
target; negative = A got there sooner). Mean, 95 % t interval, "significant"
= the interval excludes 0 (each comparison on its own), the t test's p and
Holm's adjustment of it over the group's algorithms per metric, and the
MDE at Holm's first step (alpha / k over the k algorithms with a p value:
the level that decides a comparison whatever the others show). A tie, every
seed's difference equal, has no interval, p or MDE (n/a) and is no member of
its Holm family. Per group also the experiment's MDE for final pass@1: from the pooled sd
sqrt(mean of the algorithms' variances of ``d_s``) and their common number of
pairs (the smallest, when they differ). Several FINISHED runs of one
algorithm and seed count by the rule of ``seeds.py``. With ``by`` (``--by
TAG[,TAG...]``, see ``grouping.py``) a group is also split by those run tags'
values, and seeds are paired within each split only (gspo under
``routing_replay=r3`` against grpo under ``r3``); the tags then show as
columns after ``config``.

``--baseline`` names an algorithm here. Its other form, ``--baseline
TAG=VALUE`` with TAG one of the ``--by`` tags (``--by
routing_replay,correction --baseline routing_replay=none``), pairs splits
of one algorithm instead: per seed, each split minus the split with
TAG=VALUE and the other tags equal; that table is ``split_pairs.py``, the
other view of the same core.

``paired_groups`` / ``paired_rows`` compute them from ``frame.RunData``
runs (``leaderboard.load_runs``); ``render_paired`` (``md``, ``table``,
``csv``) and ``paired_rich`` draw them; ``render_with_paired`` is the
leaderboard (``leaderboard.render``) followed by the paired table and one MDE
line per group, as the CLI's ``leaderboard`` prints it without ``--paired``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gspo_bench.config import ConfigError
from gspo_bench.reporting.frame import FINISHED, RunData
from gspo_bench.reporting.grouping import with_by
from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE, _plain
from gspo_bench.reporting.paired import holm_first_level
from gspo_bench.reporting.pairing import (ALPHA, POWER, Pooled, Regions, adjust_holm, cell, compare, csv_text,
                                          decided, group_title, markdown, mde_text, no_regions, p_cells, pooled_mde,
                                          rich, seed_table, stat_cells, with_leaderboard)


@dataclass
class PairedGroup:
    """The paired differences of one group against ``baseline``; ``rows``: one per (algorithm, metric)."""

    key: tuple[str, ...]  # (task, model, preset, config), then the values of the ``by`` tags
    baseline: str
    rows: list[dict]
    mde: float | None = None  # experiment-level MDE of final pass@1 (pass@1 units)
    mde_n: int = 0  # pairs behind it
    mde_sd: float | None = None  # pooled sd of the final pass@1 differences
    mde_algos: int = 0  # algorithms pooled (those with >= 2 pairs)
    mde_alpha: float = ALPHA  # the level of that MDE: Holm's first step over the group's final pass@1 family
    mde_algos_tested: int = 0  # that family's size: the algorithms with a p value for final pass@1
    note: str | None = None  # set when the group has no pair at all: why (then no table is drawn)
    by: tuple[str, ...] = ()  # the ``--by`` tags whose values end ``key``


def check_baseline(runs: list[RunData], baseline: str, strict: bool = True) -> str | None:
    """None when ``baseline`` has a FINISHED run among ``runs``; else why not, as a ConfigError when ``strict``
    (an explicit ``--baseline``) and as the returned sentence otherwise. A name no run of the selection has
    (a typo, or an algorithm not run here) is always a ConfigError."""
    finished = sorted({r.algo for r in runs if r.status == FINISHED})
    if baseline in finished:
        return None
    mine = [r for r in runs if r.algo == baseline]
    if not mine:
        if strict:
            known = sorted({r.algo for r in runs})
            raise ConfigError(f"--baseline {baseline!r}: unknown algorithm here: no run of {baseline!r} in the "
                              f"selection (algorithms with runs: {', '.join(known) or 'none'})")
        why = f"no run of {baseline!r} in the selection"
    else:
        counts = {st: sum(r.status == st for r in mine) for st in sorted({r.status for r in mine})}
        why = (f"no FINISHED run of {baseline!r} in the selection "
               f"({', '.join(f'{n} {st}' for st, n in counts.items())})")
    msg = f"--baseline {baseline!r}: {why}; algorithms with FINISHED runs: {', '.join(finished) or 'none'}"
    if strict:
        raise ConfigError(msg)
    return f"{why}; pick a baseline with --baseline (algorithms with FINISHED runs: {', '.join(finished) or 'none'})"


def paired_groups(runs: list[RunData], baseline: str = DEFAULT_BASELINE, alpha: float = ALPHA,
                  power: float = POWER, by: tuple[str, ...] = (), regions: Regions = no_regions) -> list[PairedGroup]:
    """Per group with a FINISHED run: each other algorithm's paired differences to ``baseline`` (see the
    module docstring), best mean final pass@1 difference first, plus the group's MDE for final pass@1.

    Only FINISHED runs with a seed tag are paired. Every non-baseline algorithm gets its three rows even with
    no pair (n = 0); a group where no pair exists gets a ``note`` saying why. ``by``: run tags splitting the
    groups further (``PairedGroup.key`` ends with their values; rows get ``row["by"] = {tag: value}``).
    ``regions``: a claim's registered region of a comparison's final pass@1 (``pairing.compare``), looked up
    by the two cells' run tags.
    """
    table = seed_table(runs, by)
    levels = list(range(4 + len(by)))  # the group and its ``by`` values: every level but algo and seed
    out = []
    for key, seeds in table.groupby(level=levels, sort=True):
        algos = seeds.index.unique("algo")
        base = cell(table, (*key, baseline)) if baseline in algos else {}
        rows = []
        for algo in sorted(a for a in algos if a != baseline):
            head = {"task": key[0], "model": key[1], "preset": key[2], "config": key[3], "algo": algo,
                    "baseline": baseline, **({"by": dict(zip(by, key[4:]))} if by else {})}
            tags = {"task": key[0], "model": key[1], "preset": key[2], "tuning": key[3], **dict(zip(by, key[4:]))}
            region = regions({**tags, "algo": algo}, {**tags, "algo": baseline})
            rows += [{**head, **r} for r in compare(cell(table, (*key, algo)), base, alpha, power, region)]
        k = adjust_holm(rows, alpha, power)
        g = PairedGroup(key, baseline, rows, by=by)
        g.mde_alpha, g.mde_algos_tested = holm_first_level(alpha, k), k
        if baseline not in algos:
            g.note = f"no FINISHED {baseline} run in this group"
        elif not rows:
            g.note = f"only {baseline} in this group, nothing to pair"
        elif not any(r["common"] for r in rows):
            g.note = f"no seed has FINISHED runs of both {baseline} and another algorithm"
        # the algorithms with >= 2 pairs, at the level Holm's first step decides final pass@1 at
        g.mde, g.mde_n, g.mde_sd, g.mde_algos = pooled_mde(rows, g.mde_alpha, power)
        best = {r["algo"]: r["mean_diff"] for r in rows if r["metric"] == "final_pass1"}
        order = {a: (best[a] is None, -(best[a] or 0.0), a) for a in best}
        g.rows = sorted(rows, key=lambda r: order[r["algo"]])  # stable: metrics keep their order
        for r in g.rows:
            r["group_mde_final_pass1"], r["group_mde_pairs"] = g.mde, g.mde_n
        out.append(g)
    return out


def paired_rows(runs: list[RunData], baseline: str = DEFAULT_BASELINE, alpha: float = ALPHA,
                power: float = POWER, by: tuple[str, ...] = ()) -> list[dict]:
    """``paired_groups``' rows, all groups in one list: per group, per other algorithm, per metric, with
    ``n`` pairs of the ``common`` seeds, ``mean_diff``, ``sd_diff``, ``ci_low``/``ci_high``, ``significant``,
    ``mde`` (pass@1 units or steps) and the ``PairedStat`` as ``stat``."""
    return [r for g in paired_groups(runs, baseline, alpha, power, by) for r in g.rows]


# -- rendering: paired differences -----------------------------------------------------------------------------------
PAIRED_COLUMNS = ("task", "model", "preset", "config", "algo", "baseline", "metric", "pairs (n)", "mean diff",
                  "95 % CI", "significant", "p", "Holm p", "MDE (Holm)")
PAIRED_CSV_FIELDS = ("task", "model", "preset", "config", "algo", "baseline", "metric", "n", "common", "seeds",
                     "mean_diff", "sd_diff", "ci_low", "ci_high", "significant", "p", "p_holm", "mde",
                     "mde_alpha", "group_mde_final_pass1",
                     "group_mde_pairs")


def _paired_cells(row: dict) -> list[str]:
    return [row["task"], row["model"], row["preset"], row["config"], *row.get("by", {}).values(), row["algo"],
            row["baseline"], *stat_cells(row, p_cells)]


ALGORITHMS = Pooled("algorithm", "algorithms", "no algorithm")


def mde_line(g: PairedGroup, with_title: bool = True) -> str:
    """The group's one line: its experiment-level MDE for final pass@1, or why there is none."""
    head = f"{group_title(g.key, g.by)}: " if with_title else ""
    k = g.mde_algos_tested
    why = f" = {ALPHA:g} / {k}, Holm's first step" if k > 1 else ""
    return mde_text(head, g.baseline, g.note, g.mde, g.mde_n, g.mde_sd, g.mde_algos, ALGORITHMS, g.mde_alpha, why)


def _paired_title(baseline: str) -> str:
    return (f"Paired differences vs {baseline}: per seed, algo - {baseline}; mean, 95 % t interval, "
            "significant = interval excludes 0 (each comparison on its own); p = paired t test against 0, or, where a "
            "claim registered a region ('claimed' in the metric), the test that the interval lies inside or outside "
            "it (as on the claims page); Holm p = adjusted by Holm's method over the group's algorithms per metric "
            "(below 0.05: decided for the family)")


def render_paired(groups: list[PairedGroup], fmt: str = "md", baseline: str = DEFAULT_BASELINE,
                  note: str | None = None, with_title: bool = True) -> str:
    """The paired table of ``groups`` in ``md`` (title line, one table over the groups with pairs, one MDE line
    per group), ``table`` (Rich) or ``csv`` (raw: pass@1 units and steps, every row). ``note``: the one line
    printed instead, when the baseline has no FINISHED run at all."""
    if fmt == "csv":
        return csv_text(with_by(PAIRED_CSV_FIELDS, groups[0].by if groups else ()), [r for g in groups for r in g.rows])
    if fmt == "table":
        return _plain(*paired_rich(groups, baseline, note))
    if fmt != "md":
        raise ConfigError(f"format {fmt!r} is not one of: table, md, csv")
    if note:
        return f"No paired differences: {note}.\n"
    cells = [_paired_cells(r) for g in groups if not g.note for r in g.rows]
    return markdown(_paired_title(baseline) if with_title else None,
                    with_by(PAIRED_COLUMNS, groups[0].by) if groups else PAIRED_COLUMNS, cells,
                    [mde_line(g) for g in groups])


def paired_rich(groups: list[PairedGroup], baseline: str = DEFAULT_BASELINE, note: str | None = None) -> list:
    """Rich renderables: the paired table (groups with pairs, a section each), then one MDE line per group."""
    from rich.text import Text

    if note:
        return [Text(f"No paired differences: {note}.")]
    shown = [g for g in groups if not g.note]
    by = shown[0].by if shown else ()
    sections = [[(_paired_cells(r), "bold" if decided(r) else None) for r in g.rows] for g in shown]
    return rich(_paired_title(baseline), with_by(PAIRED_COLUMNS, by), 7 + len(by), sections,
                [mde_line(g) for g in groups])


def render_with_paired(rows: list[dict], fmt: str, groups: list[PairedGroup], baseline: str = DEFAULT_BASELINE,
                       note: str | None = None, title: str | None = None) -> str:
    """The leaderboard ``rows`` (``leaderboard.render``), then in ``table`` and ``md`` the paired table of
    ``groups`` (``paired_groups``' result; ``note``: why there is none) and the MDE lines (``render_paired``);
    ``csv`` stays the leaderboard alone, one table (the CLI's ``--paired`` prints the paired CSV instead)."""
    return with_leaderboard(rows, fmt, title, lambda: render_paired(groups, "md", baseline, note),
                            lambda: paired_rich(groups, baseline, note))
