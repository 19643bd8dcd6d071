"""``leaderboard --target-mde``: how many seeds each paired comparison needs to detect a given difference.

For every row of the paired table (an algorithm against the baseline, per metric) with 2 or more pairs and a
spread, the plan takes the observed sd of the per-seed differences and solves for the fewest seeds whose MDE
(80 % power) reaches the target, at the level that decides the row: Holm's first step over its metric's family
(``pairing.adjust_holm``, ``mde_alpha``). The sd itself is known only roughly from few seeds (its 95 %
interval from 3 pairs spans about x0.5 to x6 of the estimate, ``paired.sd_interval``), so the plan also gives
the seeds needed at both ends of that interval: the honest range of what the next experiment may cost.
"""

from __future__ import annotations

from gspo_bench import tables
from gspo_bench.reporting.paired import sd_interval, seeds_needed
from gspo_bench.reporting.pairing import level_text

PLAN_COLUMNS = ("task", "model", "preset", "config", "algo", "baseline", "metric", "pairs", "sd", "sd 95 % CI",
                "level", "seeds for the target", "over the sd's CI")


PLAN_CSV_FIELDS = ("task", "model", "preset", "config", "algo", "baseline", "metric", "n", "sd", "sd_ci_low",
                   "sd_ci_high", "level", "target", "seeds", "seeds_low", "seeds_high")


def plan_rows(groups, target: float, power: float = 0.8) -> list[dict]:
    """One plan row per paired row of ``groups`` (``paired_table.paired_groups``) that has a spread: its
    ``seeds`` needed at the observed sd and ``seeds_range`` at the ends of that sd's 95 % interval (None:
    more than ``seeds_needed``'s limit). ``target`` is in the metric's raw units (pass@1 as a fraction, steps
    as steps) for pass@1 metrics and steps alike, scaled by the row's ``scale`` from display units."""
    out = []
    for g in groups:
        for r in g.rows:
            st = r["stat"]
            if st is None or st.sd is None or st.tied:
                continue
            raw = target / r["scale"]  # the target in the metric's raw units (points -> pass@1)
            level = r["mde_alpha"]
            band = sd_interval(st.sd, st.n)
            out.append({**{k: r[k] for k in ("task", "model", "preset", "config", "algo", "baseline", "metric",
                                              "label", "unit", "scale")},
                        "n": st.n, "sd": st.sd, "sd_ci": band, "level": level,
                        "seeds": seeds_needed(st.sd, raw, level, power),
                        "seeds_range": None if band is None else tuple(seeds_needed(s, raw, level, power)
                                                                       for s in band)})
    return out


def _seeds(n: int | None) -> str:
    return "over 10000" if n is None else str(n)


def plan_cells(row: dict) -> list[str]:
    scale = row["scale"]
    ci = row["sd_ci"]
    lo, hi = row["seeds_range"] or (None, None)
    return [row["task"], row["model"], row["preset"], row["config"], row["algo"], row["baseline"],
            f"{row['label']} ({row['unit']})", str(row["n"]), f"{scale * row['sd']:.2f}",
            "-" if ci is None else f"[{scale * ci[0]:.2f}, {scale * ci[1]:.2f}]", level_text(row["level"]),
            _seeds(row["seeds"]), f"{_seeds(lo)} to {_seeds(hi)}"]


def render_plan(rows: list[dict], target: float, fmt: str = "md") -> str:
    """The plan as Markdown (a title line, the table and how to read it) or CSV (raw numbers)."""
    if fmt == "csv":
        records = [{"task": r["task"], "model": r["model"], "preset": r["preset"], "config": r["config"],
                    "algo": r["algo"], "baseline": r["baseline"], "metric": r["metric"], "n": r["n"], "sd": r["sd"],
                    "sd_ci_low": r["sd_ci"][0] if r["sd_ci"] else None,
                    "sd_ci_high": r["sd_ci"][1] if r["sd_ci"] else None, "level": r["level"],
                    "target": target / r["scale"], "seeds": r["seeds"],
                    "seeds_low": r["seeds_range"][0] if r["seeds_range"] else None,
                    "seeds_high": r["seeds_range"][1] if r["seeds_range"] else None} for r in rows]
        return tables.csv_text(PLAN_CSV_FIELDS, records)
    head = (f"**Seeds to detect {target:g} (points of pass@1, or steps) with 80 % power**, per comparison, at the "
            "level that decides it (Holm's first step over its metric's family), from the observed sd of the "
            "per-seed differences; the last column is the same at the ends of that sd's 95 % interval.\n\n")
    if not rows:
        return head + "No comparison has 2 or more paired seeds with a spread: nothing to plan from.\n"
    return head + tables.markdown(PLAN_COLUMNS, [plan_cells(r) for r in rows]) + "\n"
