"""``--baseline TAG=VALUE``: paired differences between splits of one algorithm (a stabiliser grid).

Every split of a group (task, model, preset, config; see ``grouping.py``)
trains from the same warm start and sees the same prompt order for a given
seed, so comparing two *splits* of one algorithm seed by seed is a paired
design just as comparing two algorithms is ("does GRPO gain from routing
replay r3 vs none?"). ``leaderboard --by routing_replay,correction
--baseline routing_replay=none`` (and ``report`` the same) asks for it:

- TAG must be one of the ``--by`` tags, and some run of the selection must
  have VALUE for it (``-``: the runs without the tag); else a one-line
  ``ConfigError`` (``parse_split_baseline``, ``check_split_value``).
- The baseline split of a split S is the split with S's values for every
  ``--by`` tag except TAG, which is VALUE: with ``--by
  routing_replay,correction`` r3/tis is compared with none/tis, r3/none with
  none/none. Splits whose TAG value is VALUE are baselines, not compared.
- Per group, algorithm A and split S with TAG != VALUE: ``d_s = metric(A, S,
  s) - metric(A, baseline split, s)`` over the seeds where both have a
  FINISHED run, for ``pairing.PAIRED_METRICS`` (final pass@1, AUC, steps
  to +10 pts; there only seeds where both reached it), with the same mean, 95 %
  t interval, p and MDE as the algorithm table (``paired.paired_summary``),
  and its Holm adjustment under the same rule: one family per group and
  metric, every (algorithm, split) comparison in it (``pairing.adjust_holm``),
  the MDE at Holm's first step;
  several FINISHED runs of one seed count by the rule of ``seeds.py``.
  When A has no FINISHED run in the baseline split the pair (A, S) gets one
  note row saying so (``row["note"]``, no metric) instead of its three rows.
- Per group also an MDE line for final pass@1 (pooled sd over the (A, S)
  comparisons with >= 2 pairs, their smallest n), as in the algorithm table.

``split_pair_groups`` computes them from ``frame.RunData`` runs, a view of
the paired-comparison core in ``pairing.py`` as the algorithm table is;
``render_split_pairs`` (``md``, ``table``, ``csv``) and ``split_pairs_rich``
draw them; ``render_with_split_pairs`` is the leaderboard followed by them
(the CLI's ``leaderboard`` without ``--paired``); ``split_pairs_section`` is
the report's markdown for one group (in its "Splits compared" section).
With a plain algorithm name ``--baseline`` keeps its meaning
(``paired_table.py``) and nothing here is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from gspo_bench import tables
from gspo_bench.config import ConfigError
from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.grouping import MISSING, split_values, with_by
from gspo_bench.reporting.leaderboard import _plain
from gspo_bench.reporting.paired import holm_first_level
from gspo_bench.reporting.pairing import (ALPHA, POWER, Pooled, Regions, adjust_holm, cell, compare, csv_text,
                                          decided, group_title, markdown, mde_text, no_regions, p_cells, pooled_mde,
                                          rich, seed_table, stat_cells, with_leaderboard)


def parse_split_baseline(baseline: str | None, by: tuple[str, ...]) -> tuple[str, str] | None:
    """``(TAG, VALUE)`` for a ``--baseline TAG=VALUE``, None for an algorithm name (or None). A TAG that is not a
    ``--by`` tag is a ConfigError."""
    if baseline is None or "=" not in baseline:
        return None
    tag, value = (x.strip() for x in baseline.split("=", 1))
    if tag not in by:
        have = f"--by is {','.join(by)}" if by else "no --by given"
        raise ConfigError(f"--baseline {baseline!r}: {tag!r} is not a --by tag ({have}); TAG=VALUE compares the "
                          f"splits of a --by tag, e.g. --by {tag or 'routing_replay'} --baseline "
                          f"{tag or 'routing_replay'}={value or 'none'}")
    return tag, value


def check_split_value(runs: list[RunData], tag: str, value: str) -> None:
    """ConfigError (one line) when no run in ``runs`` has ``value`` for ``tag``; it lists the values they have."""
    have = sorted({split_values(r.tags, (tag,))[0] for r in runs})
    if value not in have:
        shown = ", ".join(have) + (f" ({MISSING}: runs without the tag)" if MISSING in have else "")
        raise ConfigError(f"--baseline {tag}={value}: no run in the selection has {tag}={value!r} "
                          f"(its values: {shown})")


@dataclass
class SplitGroup:
    """The split-vs-baseline-split differences of one group (task, model, preset, config); ``rows``: one per
    (algorithm, compared split, metric), or one note row per (algorithm, split) without a baseline split."""

    key: tuple[str, ...]  # (task, model, preset, config)
    tag: str
    value: str
    by: tuple[str, ...]
    rows: list[dict]
    mde: float | None = None  # experiment-level MDE of final pass@1 (pass@1 units)
    mde_n: int = 0
    mde_sd: float | None = None
    mde_pairs: int = 0  # (algorithm, split) comparisons pooled (those with >= 2 pairs)
    mde_alpha: float = ALPHA  # the level of that MDE: Holm's first step over the group's final pass@1 family
    mde_tested: int = 0  # that family's size: the (algorithm, split) comparisons with a p value for final pass@1
    note: str | None = None  # set when the group has no compared split with a pair: why

    @property
    def baseline(self) -> str:
        return f"{self.tag}={self.value}"


def _label(by: tuple[str, ...], vals: tuple[str, ...]) -> str:
    return ", ".join(f"{t}={v}" for t, v in zip(by, vals))


def split_pair_groups(runs: list[RunData], tag: str, value: str, by: tuple[str, ...], alpha: float = ALPHA,
                      power: float = POWER, regions: Regions = no_regions) -> list[SplitGroup]:
    """Per group with a FINISHED run: per algorithm and split whose ``tag`` value is not ``value``, the paired
    differences to the same algorithm's baseline split (see the module docstring). Rows are ordered by
    algorithm, then split values, then metric; they carry ``row["by"]`` = the compared split's {tag: value}.
    ``regions``: a claim's registered region of a comparison's final pass@1 (``pairing.compare``), looked up
    by the two cells' run tags."""
    i = by.index(tag)
    table = seed_table(runs, by)
    out = []
    for key, seeds in table.groupby(level=[0, 1, 2, 3], sort=True):
        task, model, preset, config = key
        rows, compared = [], 0
        for algo in sorted(seeds.index.unique("algo")):
            # the algorithm's splits: the ``by`` values it has FINISHED runs under (index: group, by, algo, seed)
            splits = {v[4:-2] for v in seeds.index if v[-2] == algo}
            for vals in sorted(v for v in splits if v[i] != value):
                base_vals = (*vals[:i], value, *vals[i + 1:])
                head = {"task": task, "model": model, "preset": preset, "config": config, "algo": algo,
                        "baseline": f"{tag}={value}", "baseline_split": _label(by, base_vals),
                        "by": dict(zip(by, vals)), "note": None}
                if base_vals not in splits:
                    rows.append({**head, "metric": "", "label": "", "unit": "", "scale": 1.0, "n": 0, "common": 0,
                                 "seeds": "", "mean_diff": None, "sd_diff": None, "ci_low": None, "ci_high": None,
                                 "significant": False, "mde": None, "stat": None,
                                 "note": f"no baseline split: no FINISHED {algo} run with {_label(by, base_vals)}"})
                    continue
                compared += 1
                # d_s = metric(algo, S, s) - metric(algo, baseline split of S, s)
                group = {"task": task, "model": model, "preset": preset, "tuning": config, "algo": algo}
                region = regions({**group, **dict(zip(by, vals))}, {**group, **dict(zip(by, base_vals))})
                rows += [{**head, **r} for r in compare(cell(table, (*key, *vals, algo)),
                                                        cell(table, (*key, *base_vals, algo)), alpha, power, region)]
        g = SplitGroup(key, tag, value, by, rows)
        if not rows:
            g.note = f"every split has {tag}={value}, nothing to compare with it"
        elif not compared:
            g.note = f"no algorithm has runs both in a split and in its {tag}={value} split"
        elif not any(r["common"] for r in rows):
            g.note = f"no seed has FINISHED runs of one algorithm in both a split and its {tag}={value} split"
        # one Holm family per metric over the group's (algorithm, split) comparisons; the MDE at its first step
        g.mde_tested = adjust_holm(rows, alpha, power)
        g.mde_alpha = holm_first_level(alpha, g.mde_tested)
        g.mde, g.mde_n, g.mde_sd, g.mde_pairs = pooled_mde(rows, g.mde_alpha, power)
        out.append(g)
    return out


# -- rendering ---------------------------------------------------------------------------------------------------
SPLIT_COLUMNS = ("task", "model", "preset", "config", "algo", "vs", "metric", "pairs (n)", "mean diff", "95 % CI",
                 "significant", "p", "Holm p", "MDE (Holm)")
SPLIT_CSV_FIELDS = ("task", "model", "preset", "config", "algo", "baseline", "baseline_split", "metric", "n",
                    "common", "seeds", "mean_diff", "sd_diff", "ci_low", "ci_high", "significant", "p", "p_holm", "mde",
                    "mde_alpha", "note")


def split_pairs_title(tag: str, value: str) -> str:
    return (f"Paired differences vs {tag}={value} (same algorithm, same seed): per seed, metric(algo, split) - "
            f"metric(algo, the split with {tag}={value} and the other --by tags equal); mean, 95 % t interval, "
            "significant = interval excludes 0 (each comparison on its own); p = paired t test against 0, or, where "
            "a claim registered a region ('claimed' in the metric), the test that the interval lies inside or outside "
            "it (as on the claims page); Holm p = adjusted by Holm's method over the group's (algorithm, split) comparisons per metric (below 0.05: decided for "
            "the family)")


def _cells(row: dict, skip: int = 0) -> list[str]:
    """A row's cells; ``skip`` leaves out the first four (task, model, preset, config) in the report."""
    head = [row["task"], row["model"], row["preset"], row["config"], row["algo"], *row["by"].values(),
            row["baseline_split"]]
    if row["note"]:
        return [*head, row["note"], "0", "-", "-", "-", "-", "-", "-"][skip:]
    return [*head, *stat_cells(row, p_cells)][skip:]


SPLITS = Pooled("algorithm x split comparison", "algorithm x split comparisons", "no split")


def split_mde_line(g: SplitGroup, with_title: bool = True) -> str:
    """The group's one line: its MDE for final pass@1 over the split comparisons, or why there is none."""
    head = f"{group_title(g.key)}: " if with_title else ""
    k = g.mde_tested
    why = f" = {ALPHA:g} / {k}, Holm's first step" if k > 1 else ""
    return mde_text(head, g.baseline, g.note, g.mde, g.mde_n, g.mde_sd, g.mde_pairs, SPLITS, g.mde_alpha, why)


def _columns(by: tuple[str, ...], skip: int = 0) -> tuple[str, ...]:
    return with_by(SPLIT_COLUMNS, by, after="algo")[skip:]


def render_split_pairs(groups: list[SplitGroup], fmt: str = "md", with_title: bool = True) -> str:
    """``groups`` in ``md`` (title, one table over the groups with rows, one MDE line per group), ``table``
    (Rich) or ``csv`` (raw: pass@1 units and steps, every row, note rows with an empty metric)."""
    by = groups[0].by if groups else ()
    if fmt == "csv":
        return csv_text(with_by(SPLIT_CSV_FIELDS, by, after="algo"), [r for g in groups for r in g.rows])
    if fmt == "table":
        return _plain(*split_pairs_rich(groups))
    if fmt != "md":
        raise ConfigError(f"format {fmt!r} is not one of: table, md, csv")
    title = split_pairs_title(groups[0].tag, groups[0].value) if with_title and groups else None
    return markdown(title, _columns(by), [_cells(r) for g in groups for r in g.rows],
                    [split_mde_line(g) for g in groups])


def split_pairs_rich(groups: list[SplitGroup]) -> list:
    """Rich renderables: the table (a section per group with rows), then one MDE line per group."""
    shown = [g for g in groups if g.rows]
    by = shown[0].by if shown else ()
    title = split_pairs_title(shown[0].tag, shown[0].value) if shown else ""
    sections = [[(_cells(r), "bold" if decided(r) else ("dim" if r["note"] else None)) for r in g.rows]
                for g in shown]
    return rich(title, _columns(by), 7 + len(by), sections, [split_mde_line(g) for g in groups])


def render_with_split_pairs(rows: list[dict], fmt: str, groups: list[SplitGroup], title: str | None = None) -> str:
    """The leaderboard ``rows``, then in ``table`` and ``md`` the split differences; ``csv``: the leaderboard
    alone (``--paired`` prints the split CSV instead)."""
    return with_leaderboard(rows, fmt, title, lambda: render_split_pairs(groups, "md"),
                            lambda: split_pairs_rich(groups))


def split_pairs_section(g: SplitGroup | None) -> list[str]:
    """The report's markdown for one group (inside "Splits compared"): the table without the group columns and
    the MDE line."""
    if g is None:
        return []
    md = [f"### Paired differences vs {g.baseline} (same algorithm, same seed)", "",
          f"Per algorithm and split with {g.tag} other than `{g.value}`: d_s = metric(algo, split, s) - "
          f"metric(algo, baseline split, s), the baseline split having {g.tag}={g.value} and the other --by tags "
          "equal, over the seeds where both finished (same warm start and prompt order); steps to +10 pts only "
          "over the seeds where both reached it. Mean, 95 % t interval; significant = the interval excludes 0, "
          "each comparison on its own; p = the paired t test; Holm p = that p adjusted by Holm's method over the "
          "group's (algorithm, split) comparisons, one family per metric: below 0.05, the difference is decided "
          "within that family. MDE (Holm): the difference decided with 80 % power at Holm's first step. pass@1 "
          "differences in points.", ""]
    if g.rows:
        md += tables.markdown(_columns(g.by, 4), [_cells(r, 4) for r in g.rows]).split("\n")
    return md + [split_mde_line(g, with_title=False) + ("" if g.note else "."), ""]
