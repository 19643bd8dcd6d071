"""``paired_table``: the leaderboard's paired table, built on the pure statistics in ``reporting/paired.py``.

Paired differences (``paired_groups``): per group and per algorithm A other
than the baseline B (``--baseline``, default grpo), ``d_s = metric(A, s) -
metric(B, s)`` over the seeds where both have a FINISHED run, for final
pass@1, AUC and steps to +10 pts (there only the seeds where both reached the
target; negative = A got there sooner). Mean, 95 % t interval, "significant"
= the interval excludes 0 (each comparison on its own), the t test's p and
Holm's adjustment of it over the group's algorithms per metric, and the
MDE. Per group also the experiment's MDE for final pass@1: from the pooled sd
sqrt(mean of the algorithms' variances of ``d_s``) and their common number of
pairs (the smallest, when they differ). Several FINISHED runs of one
algorithm and seed count as one: the mean of their values (steps to +10 pts:
only when every one reached it). With ``by`` (``--by TAG[,TAG...]``, see
``grouping.py``) a group is also split by those run tags' values, and seeds
are paired within each split only (gspo under ``routing_replay=r3`` against
grpo under ``r3``); the tags then show as columns after ``config``.

``--baseline`` names an algorithm here. Its other form, ``--baseline
TAG=VALUE`` with TAG one of the ``--by`` tags (``--by
routing_replay,correction --baseline routing_replay=none``), pairs splits
of one algorithm instead: per seed, each split minus the split with
TAG=VALUE and the other tags equal; that table is ``split_pairs.py``, built
from this module's ``PAIRED_METRICS`` and per-seed values.

``paired_groups`` / ``paired_rows`` compute them from ``leaderboard.RunData``
runs (``leaderboard.load_runs``); ``render_paired`` (``md``, ``table``,
``csv``) and ``paired_rich`` draw them; ``render_with_paired`` is the
leaderboard (``leaderboard.render``) followed by the paired table and one MDE
line per group, as the CLI's ``leaderboard`` prints it without ``--paired``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from gspo_bench import tables
from gspo_bench.config import ConfigError
from gspo_bench.reporting.grouping import by_title, flat, split_values, with_by
from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE, _plain, render, rich_table, run_summary
from gspo_bench.reporting.frame import FINISHED, RunData
from gspo_bench.reporting.paired import seed_key
from gspo_bench.reporting.paired import holm, mde, pair_by_seed, paired_summary, pooled_sd

ALPHA, POWER = 0.05, 0.8  # paired tables: 95 % intervals, MDE at 80 % power


# -- paired differences --------------------------------------------------------------------------------------------
# (CSV name, ``run_summary`` key, label, unit, display scale): pass@1 differences are shown in points
PAIRED_METRICS = (("final_pass1", "final", "final pass@1", "points", 100.0),
                  ("auc_pass1", "auc", "AUC pass@1", "points", 100.0),
                  ("steps_to_10", "steps_to", "steps to +10 pts", "steps", 1.0))


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
    note: str | None = None  # set when the group has no pair at all: why (then no table is drawn)
    by: tuple[str, ...] = ()  # the ``--by`` tags whose values end ``key``


def group_title(key: tuple[str, ...], by: tuple[str, ...] = ()) -> str:
    """``task / model``, then preset and config when not ``default``, then ``tag=value`` per ``by`` tag (the
    report's section titles)."""
    task, model, preset, config, *vals = key
    return f"{task} / {model}" + (f" / {preset}" if preset != "default" else "") + (
        f" / {config}" if config != "default" else "") + by_title(by, tuple(vals))


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def _seed_values(runs: list[RunData]) -> dict[str, dict[str, float | None]]:
    """{seed: {summary key: value}} of one algorithm's FINISHED runs in a group; a seed run twice or more gets
    the mean of its runs' values, None when any of them lacks the value (steps to +10 pts: did not reach)."""
    by_seed: dict[str, list[dict]] = {}
    for r in runs:
        by_seed.setdefault(r.seed, []).append(run_summary(r))
    out = {}
    for seed, ss in by_seed.items():
        vals = {}
        for _, k, *_ in PAIRED_METRICS:
            xs = [x[k] for x in ss]
            vals[k] = statistics.fmean(xs) if all(_finite(x) for x in xs) else None
        out[seed] = vals
    return out


def compare(mine: dict[str, dict], base: dict[str, dict], alpha: float = ALPHA, power: float = POWER) -> list[dict]:
    """Per ``PAIRED_METRICS`` metric, the paired differences ``mine - base`` (``_seed_values`` dicts): the row
    fields every paired table shares (``n`` pairs of the ``common`` seeds, their ``seeds``, ``mean_diff``,
    ``sd_diff``, ``ci_low``/``ci_high``, ``significant``, ``mde``, the ``PairedStat`` as ``stat``)."""
    common = sorted(set(mine) & set(base), key=seed_key)
    rows = []
    for name, k, label, unit, scale in PAIRED_METRICS:
        # d_s = metric(compared, s) - metric(baseline, s), over the seeds where both have it
        seeds, diffs = pair_by_seed({s: v[k] for s, v in mine.items()}, {s: v[k] for s, v in base.items()})
        st = paired_summary(diffs, alpha, power)
        rows.append({"metric": name, "label": label, "unit": unit, "scale": scale, "n": st.n, "common": len(common),
                     "seeds": ",".join(seeds), "mean_diff": st.mean, "sd_diff": st.sd,
                     "ci_low": st.ci[0] if st.ci else None, "ci_high": st.ci[1] if st.ci else None,
                     "significant": st.significant, "p": st.p, "p_holm": None, "mde": st.mde, "stat": st})
    return rows


def adjust_holm(rows: list[dict]) -> None:
    """Set ``p_holm`` on ``rows`` (one group's): Holm's adjustment over the group's algorithms, per metric, so a
    group of k algorithms compared with the baseline is one family of k tests per metric."""
    for name, *_ in PAIRED_METRICS:
        family = [r for r in rows if r["metric"] == name]
        for r, q in zip(family, holm([r["p"] for r in family])):
            r["p_holm"] = q


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
                  power: float = POWER, by: tuple[str, ...] = ()) -> list[PairedGroup]:
    """Per group with a FINISHED run: each other algorithm's paired differences to ``baseline`` (see the
    module docstring), best mean final pass@1 difference first, plus the group's MDE for final pass@1.

    Only FINISHED runs with a seed tag are paired. Every non-baseline algorithm gets its three rows even with
    no pair (n = 0); a group where no pair exists gets a ``note`` saying why. ``by``: run tags splitting the
    groups further (``PairedGroup.key`` ends with their values; rows get ``row["by"] = {tag: value}``).
    """
    groups: dict[tuple, dict[str, list[RunData]]] = {}
    for r in runs:
        if r.status == FINISHED and r.seed != "?":
            groups.setdefault((*r.group, *split_values(r.tags, by)), {}).setdefault(r.algo, []).append(r)
    out = []
    for key in sorted(groups):
        by_algo = groups[key]
        base = _seed_values(by_algo[baseline]) if baseline in by_algo else {}
        rows = []
        for algo in sorted(a for a in by_algo if a != baseline):
            head = {"task": key[0], "model": key[1], "preset": key[2], "config": key[3], "algo": algo,
                    "baseline": baseline, **({"by": dict(zip(by, key[4:]))} if by else {})}
            rows += [{**head, **r} for r in compare(_seed_values(by_algo[algo]), base, alpha, power)]
        adjust_holm(rows)
        g = PairedGroup(key, baseline, rows, by=by)
        if baseline not in by_algo:
            g.note = f"no FINISHED {baseline} run in this group"
        elif not rows:
            g.note = f"only {baseline} in this group, nothing to pair"
        elif not any(r["common"] for r in rows):
            g.note = f"no seed has FINISHED runs of both {baseline} and another algorithm"
        g.mde, g.mde_n, g.mde_sd, g.mde_algos = pooled_mde(rows, alpha, power)  # the algorithms with >= 2 pairs
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
                  "95 % CI", "significant", "p", "Holm p", "MDE")
PAIRED_CSV_FIELDS = ("task", "model", "preset", "config", "algo", "baseline", "metric", "n", "common", "seeds",
                     "mean_diff", "sd_diff", "ci_low", "ci_high", "significant", "p", "p_holm", "mde",
                     "group_mde_final_pass1",
                     "group_mde_pairs")


def _paired_cells(row: dict) -> list[str]:
    scale = row["scale"]

    def num(x, sign="+"):
        return "-" if x is None else f"{scale * x:{sign}.1f}"

    n = str(row["n"]) if row["n"] == row["common"] else f"{row['n']} of {row['common']}"
    has_ci = row["ci_low"] is not None
    return [row["task"], row["model"], row["preset"], row["config"], *row.get("by", {}).values(), row["algo"],
            row["baseline"], f"{row['label']} ({row['unit']})", n, num(row["mean_diff"]),
            f"[{num(row['ci_low'])}, {num(row['ci_high'])}]" if has_ci else "-",
            ("yes" if row["significant"] else "no") if has_ci else "-", _p(row.get("p")), _p(row.get("p_holm")),
            num(row["mde"], "")]


def _p(x: float | None) -> str:
    """A p value for a table: 3 significant digits, below 0.001 as '<0.001', '-' when there is none."""
    return "-" if x is None else ("<0.001" if x < 0.001 else f"{x:.3g}")


def mde_line(g: PairedGroup, with_title: bool = True) -> str:
    """The group's one line: its experiment-level MDE for final pass@1, or why there is none."""
    head = f"{group_title(g.key, g.by)}: " if with_title else ""
    if g.note:
        return f"{head}no paired differences vs {g.baseline}: {g.note}."
    if g.mde is None:
        return (f"{head}MDE (final pass@1): not available, no algorithm has 2 or more seeds paired with "
                f"{g.baseline}.")
    return (f"{head}MDE (final pass@1, {g.mde_n} seeds, 95 % / 80 % power): {100 * g.mde:.1f} points "
            f"(pooled sd of the paired differences {100 * g.mde_sd:.1f} points over {g.mde_algos} "
            f"algorithm{'s' if g.mde_algos != 1 else ''})")


def _paired_title(baseline: str) -> str:
    return (f"Paired differences vs {baseline}: per seed, algo - {baseline}; mean, 95 % t interval, "
            "significant = interval excludes 0 (each comparison on its own); p = paired t test, Holm p = "
            "adjusted by Holm's method over the group's algorithms per metric (below 0.05: decided for the family)")


def render_paired(groups: list[PairedGroup], fmt: str = "md", baseline: str = DEFAULT_BASELINE,
                  note: str | None = None, with_title: bool = True) -> str:
    """The paired table of ``groups`` in ``md`` (title line, one table over the groups with pairs, one MDE line
    per group), ``table`` (Rich) or ``csv`` (raw: pass@1 units and steps, every row). ``note``: the one line
    printed instead, when the baseline has no FINISHED run at all."""
    if fmt == "csv":
        # significant: true / false, empty without an interval (fewer than 2 pairs)
        records = [{**r, "significant": None if r["ci_low"] is None else str(r["significant"]).lower()}
                   for r in (flat(r) for g in groups for r in g.rows)]
        return tables.csv_text(with_by(PAIRED_CSV_FIELDS, groups[0].by if groups else ()), records)
    if fmt == "table":
        return _plain(*paired_rich(groups, baseline, note))
    if fmt != "md":
        raise ConfigError(f"format {fmt!r} is not one of: table, md, csv")
    if note:
        return f"No paired differences: {note}.\n"
    lines = [f"**{_paired_title(baseline)}.**", ""] if with_title else []
    shown = [r for g in groups if not g.note for r in g.rows]
    if shown:
        lines += [tables.markdown(with_by(PAIRED_COLUMNS, groups[0].by), map(_paired_cells, shown))]
    lines += [f"- {mde_line(g)}" for g in groups] or ["No finished run: no paired differences."]
    return "\n".join(lines) + "\n"


def paired_rich(groups: list[PairedGroup], baseline: str = DEFAULT_BASELINE, note: str | None = None) -> list:
    """Rich renderables: the paired table (groups with pairs, a section each), then one MDE line per group."""
    from rich.table import Table
    from rich.text import Text

    if note:
        return [Text(f"No paired differences: {note}.")]
    out = []
    shown = [g for g in groups if not g.note]
    if shown:
        t = Table(title=_paired_title(baseline))
        cols = with_by(PAIRED_COLUMNS, shown[0].by)
        for col in cols:
            t.add_column(col, justify="left" if col in cols[:7 + len(shown[0].by)] else "right")
        for i, g in enumerate(shown):
            if i:
                t.add_section()
            for r in g.rows:
                t.add_row(*_paired_cells(r), style="bold" if r["significant"] else None)
        out.append(t)
    out += [Text(mde_line(g)) for g in groups] or [Text("No finished run: no paired differences.")]
    return out


def render_with_paired(rows: list[dict], fmt: str, groups: list[PairedGroup], baseline: str = DEFAULT_BASELINE,
                       note: str | None = None, title: str | None = None) -> str:
    """The leaderboard ``rows`` (``leaderboard.render``), then in ``table`` and ``md`` the paired table of
    ``groups`` (``paired_groups``' result; ``note``: why there is none) and the MDE lines (``render_paired``);
    ``csv`` stays the leaderboard alone, one table (the CLI's ``--paired`` prints the paired CSV instead)."""
    if fmt == "md":
        return render(rows, "md") + "\n" + render_paired(groups, "md", baseline, note)
    if fmt == "table":
        return _plain(rich_table(rows, title), *paired_rich(groups, baseline, note))
    return render(rows, fmt, title)  # csv, or the error naming the formats
