"""``suite --dry-run --target-mde X``: the seeds, cells and hours that detecting X points of final pass@1 against
the baseline would take, per scenario, from the runs the scenarios already have.

For each comparison (an algorithm against the baseline, final pass@1, in one scenario) with 2 or more pairs and a
spread, the seeds come from ``leaderboard --target-mde``'s planner (``reporting/planner.py``): the fewest seeds
whose MDE at 80 % power, at Holm's first step over the scenario's family, is at most X, from the observed sd of
the per-seed differences (``paired.seeds_needed``), and the same at both ends of that sd's 95 % interval
(``paired.sd_interval``). A scenario then needs, for each algorithm, its seeds minus the pairs it has, and for
the baseline the most of those (the new seeds are shared); its seconds are those cells at the suite's per-cell
estimate (``run.plan_scenario``: measured, else the cost model) plus a warm start per new seed where the model
is warm-started. A scenario with no such comparison has no prior data to size from, and says so.

These are seeds for the fixed-n paired t test, decided once at the end. ``--until-decided`` stops earlier on a
large difference and needs more seeds than this in the worst case (the price of looking after every batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from gspo_bench.reporting.paired_table import paired_groups
from gspo_bench.reporting.planner import plan_rows
from gspo_bench.suite.cost import WARMSTART_S

END_NAMES = ("at the observed sd", "at the low end of its 95 % interval", "at the high end")


@dataclass(frozen=True)
class ScenarioNeed:
    """One scenario's extra seeds for the target: per end of the sd (observed, low, high) the new seeds, the
    cells and the seconds; None where a comparison would need more than ``seeds_needed``'s limit."""

    rows: list[dict]  # the plan rows of final pass@1 (``planner.plan_rows``)
    new_seeds: tuple[int | None, int | None, int | None]
    cells: tuple[int | None, int | None, int | None]
    seconds: tuple[float | None, float | None, float | None]


def scenario_need(rows: list[dict], baseline: str, per_cell_s: dict[str, float], warmstart_s: float) -> ScenarioNeed:
    """The extra seeds, cells and seconds of one scenario (module docstring) from its final-pass@1 plan rows."""
    ends = []
    for end in range(3):
        needs = [r["seeds"] if end == 0 else (r["seeds_range"] or (None, None))[end - 1] for r in rows]
        if any(n is None for n in needs):
            ends.append((None, None, None))
            continue
        # per algorithm: extra seeds = max(0, seeds needed - pairs it has)
        extra = {r["algo"]: max(0, n - r["n"]) for r, n in zip(rows, needs)}
        new = max(extra.values(), default=0)
        # cells = sum_a extra_a + new (the baseline runs every new seed)
        cells = sum(extra.values()) + new
        # seconds = sum_a extra_a * cell_a + new * (cell_baseline + warm start)
        seconds = sum(e * per_cell_s[a] for a, e in extra.items()) + new * (per_cell_s[baseline] + warmstart_s)
        ends.append((new, cells, seconds))
    return ScenarioNeed(rows, *(tuple(e[i] for e in ends) for i in range(3)))


def _hours(s: float | None) -> str:
    return "-" if s is None else f"{s / 3600:.1f} h"


def _n(x: int | None) -> str:
    return "over 10000" if x is None else str(x)


def need_lines(name: str, experiment: str, need: ScenarioNeed | None, target: float) -> list[str]:
    """The dry run's lines for one scenario: each comparison, then the cells and hours (or: no prior data)."""
    if need is None or not need.rows:
        return [f"  {name}: no prior data (experiment {experiment} has no comparison against the baseline with 2 "
                "or more FINISHED paired seeds and a spread): no sd to size the seeds from; run its configured "
                "seeds first"]
    lines = []
    for r in need.rows:
        ci = r["sd_ci"]
        low, high = r["seeds_range"] or (None, None)
        lines.append(f"  {name}: {r['algo']} vs {r['baseline']}: {r['n']} pairs, sd {100 * r['sd']:.2f} pts "
                     + (f"(95 % CI {100 * ci[0]:.2f} to {100 * ci[1]:.2f})" if ci else "")
                     + f", level {r['level']:.2g} -> {_n(r['seeds'])} seeds ({_n(low)} to {_n(high)})")
    new, cells, secs = need.new_seeds, need.cells, need.seconds
    if new[0] is None:
        lines.append(f"  {name}: {target:g} pts is out of reach at the observed sd (over 10000 seeds)")
    else:
        lines.append(f"  {name}: {new[0]} more seed(s), {cells[0]} cell(s), ~{_hours(secs[0])}"
                     f" (over the sd's 95 % intervals: {_hours(secs[1])} to "
                     + ("over 10000 seeds" if secs[2] is None else _hours(secs[2])) + ")")
    return lines


def target_lines(plan, target: float, baseline: str, runs: dict[str, list]) -> list[str]:
    """``--target-mde``'s part of the dry run for ``plan`` (``run.Plan``), from ``runs`` (scenario -> its cell runs
    of any seed, ``frame.RunData``)."""
    from gspo_bench.train.warmstart import for_model  # as run.make_plan: transformers loads on use only

    lines = [f"target MDE {target:g} points of final pass@1 against {baseline} (80 % power, fixed-n paired t at "
             "Holm's first step over each scenario's comparisons; seeds from the observed sd, and over its 95 % "
             "interval):"]
    total, sized = 0.0, []
    for s in plan.scenarios:
        rows = [r for r in plan_rows(paired_groups(runs[s.name], baseline), target) if r["metric"] == "final_pass1"]
        need = None
        if rows:
            warm = WARMSTART_S if for_model(s.cfg.warmstart, s.cfg.model.name).enabled else 0.0
            need = scenario_need(rows, baseline, {a: s.per_cell[a][0] for a in plan.algos}, warm)
            if need.seconds[0] is not None:
                total += need.seconds[0]
                sized.append(s.name)
        lines += need_lines(s.name, s.experiment, need, target)
    missing = [s.name for s in plan.scenarios if s.name not in sized]
    lines.append(f"target MDE: ~{_hours(total)} more over {len(sized)} scenario(s) at the observed sd"
                 + (f"; not sized: {', '.join(missing)}" if missing else ""))
    return lines
