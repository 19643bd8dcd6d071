"""``suite --until-decided --max-seeds N [--seed-batch B]``: after the configured seeds, add seeds in batches
only to the cells whose comparison is still undecided, until every comparison is decided or N seeds are run.

The comparisons are each scenario's family against the baseline (``grpo``): every other algorithm's paired
difference in final eval pass@1, decided by the anytime-valid t confidence sequence with Holm's method over the
family (``reporting/sequential.py``). Because that rule is valid at any stopping time, looking after every
batch and stopping a comparison at its first decision keeps the chance of any false decision in a family at
most 5 %; the fixed-n paired t test of the other tables would not.

The planner (``next_cells``, pure): given one scenario's results so far ({algo: {seed: final pass@1}}), the
seeds it has, and the cells this invocation already tried, which cells to run next:

1. the family's decisions now; if every comparison is decided, nothing;
2. else the *active* algorithms are the baseline and each undecided one: first any seed the scenario already
   has that an active algorithm lacks a result for and that this invocation has not tried (an interrupted
   batch, resumed);
3. else the next ``batch`` seeds after the scenario's largest (at most up to ``max_seeds`` seeds in all), for
   every active algorithm, seed-major as ``run`` orders cells. A decided algorithm gets no new seed.

``max_seeds`` counts the scenario's seeds (configured ones included), not the pairs: a failed cell is tried
once per invocation and leaves its pair out, so the loop always ends. Resume: the plan is a function of the
results, so running the same command again re-derives the same decisions and seeds from the store and goes
on where it stopped.

The loop (``run_until_decided``) takes how to read a scenario's results and how to run cells as functions: the
suite passes MLflow's and ``run.run_cells``; the tests pass synthetic ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gspo_bench.reporting.paired import seed_key
from gspo_bench.reporting.sequential import FamilyDecision, versus_baseline

DEFAULT_SEED_BATCH = 2  # one seed per batch wastes no seed, but re-reads the store and replans after each; two
# halve the rounds and waste at most one seed per comparison after its decision
ALPHA = 0.05

Finals = dict[str, dict[str, float]]  # {algo: {seed: final pass@1}}
Cell = tuple[str, int]  # (algo, seed)


@dataclass
class Extension:
    """What ``run_until_decided`` did: per scenario its seeds (configured and added), the added cells (run now,
    or FINISHED by an earlier invocation on an added seed), the family's decisions at the end, and the rounds."""

    seeds: dict[str, list[int]] = field(default_factory=dict)
    cells: dict[str, list[Cell]] = field(default_factory=dict)
    decisions: dict[str, dict[str, FamilyDecision]] = field(default_factory=dict)
    rounds: int = 0


def numeric_seeds(finals: Finals) -> set[int]:
    """The integer seeds any algorithm of ``finals`` has a result for (a seed tag that is no integer: none)."""
    return {int(s) for values in finals.values() for s in values if str(s).lstrip("-").isdigit()}


def scenario_seeds(configured: list[int], finals: Finals, added: list[int] = ()) -> list[int]:
    """A scenario's seeds: the configured ones, every seed with a result, and those added by this invocation."""
    return sorted(set(configured) | numeric_seeds(finals) | set(added))


def undecided(decisions: dict[str, FamilyDecision]) -> list[str]:
    """The algorithms whose comparison against the baseline is not decided, in the family's order."""
    return [a for a, d in decisions.items() if d.decision is None]


def next_cells(finals: Finals, seeds: list[int], algos: list[str], baseline: str, max_seeds: int, batch: int,
               tried: set[Cell] = frozenset(), alpha: float = ALPHA, edges: dict[str, float] | None = None) -> list[Cell]:
    """The cells one scenario runs next (module docstring); [] when every comparison is decided, or when the
    undecided ones have every seed up to ``max_seeds`` (tried). ``finals`` holds FINISHED results only;
    ``tried``: cells this invocation ran already (each is run at most once per invocation); ``edges``: the
    edges claims registered for some comparisons (``sequential.versus_baseline``)."""
    if max_seeds < 1 or batch < 1:
        raise ValueError(f"max_seeds={max_seeds} and batch={batch} must be >= 1")
    family = {a: finals.get(a, {}) for a in algos}
    open_ = undecided(versus_baseline(family, baseline, alpha, edges=edges))
    if not open_:
        return []
    active = [baseline, *open_]
    # an active algorithm without a result on a seed the scenario has: run it, once per invocation
    missing = [(a, s) for s in sorted(seeds) for a in active if str(s) not in family[a] and (a, s) not in tried]
    if missing:
        return missing
    room = max_seeds - len(seeds)
    if room <= 0:
        return []
    start = max(seeds) + 1 if seeds else 0
    return [(a, s) for s in range(start, start + min(batch, room)) for a in active]


def run_until_decided(scenarios: list[str], configured: list[int], algos: list[str], baseline: str,
                      max_seeds: int, batch: int, read_finals: Callable[[str], Finals],
                      run_cells: Callable[[dict[str, list[Cell]]], None], tried: set[tuple[str, str, int]],
                      log: Callable[[str], None] = print, alpha: float = ALPHA,
                      edges: Callable[[str], dict[str, float]] = lambda scenario: {}) -> Extension:
    """Plan (``next_cells``), run, read back, until no scenario has a cell to run; returns the ``Extension``.

    ``read_finals(scenario)``: its FINISHED results ({algo: {seed: final pass@1}}); ``run_cells({scenario:
    cells})``: runs them (a failed cell simply leaves no result); ``tried``: (scenario, algo, seed) already run
    by this invocation (the configured pass), updated in place; ``edges(scenario)``: the edges claims registered
    for its comparisons (``claim_specs.sequence_edges``), decided against instead of 0."""
    ext = Extension(cells={name: [] for name in scenarios})
    added: dict[str, list[int]] = {name: [] for name in scenarios}
    last: dict[str, Finals] = {}
    while True:
        todo: dict[str, list[Cell]] = {}
        for name in scenarios:
            finals = last[name] = {a: v for a, v in read_finals(name).items() if a in algos}
            seeds = scenario_seeds(configured, finals, added[name])
            mine = {(a, s) for n, a, s in tried if n == name}
            cells = next_cells(finals, seeds, algos, baseline, max_seeds, batch, mine, alpha, edges(name))
            ext.seeds[name] = seeds
            ext.decisions[name] = versus_baseline({a: finals.get(a, {}) for a in algos}, baseline, alpha,
                                                  edges=edges(name))
            if cells:
                todo[name] = cells
                open_ = undecided(ext.decisions[name])
                new = sorted({s for _, s in cells} - set(seeds))
                log(f"until decided, round {ext.rounds + 1}: {name}: {len(open_)} of {len(ext.decisions[name])} "
                    f"comparison(s) vs {baseline} undecided at {len(seeds)} seed(s) -> "
                    + (f"seed(s) {', '.join(map(str, new))}" if new else "missing cells of its seeds")
                    + f" for {', '.join(dict.fromkeys(a for a, _ in cells))} ({len(cells)} cell(s))")
        if not todo:
            break
        ext.rounds += 1
        run_cells(todo)
        for name, cells in todo.items():
            tried.update((name, a, s) for a, s in cells)
            added[name] += [s for _, s in cells if s not in added[name]]
    for name in scenarios:  # the last round read every scenario after the last cells ran
        seeds, extra = ext.seeds[name], sorted(set(ext.seeds[name]) - set(configured))
        have = {(a, int(s)) for a, v in last[name].items() for s in v if str(s).lstrip("-").isdigit()}
        ran = {(a, s) for n, a, s in tried if n == name}
        ext.cells[name] = sorted(((a, s) for a in algos for s in extra if (a, s) in have | ran),
                                 key=lambda c: (seed_key(c[1]), algos.index(c[0])))
        open_ = undecided(ext.decisions[name])
        log(f"until decided: {name}: " + (f"every comparison vs {baseline} decided at {len(seeds)} seed(s)"
                                          if not open_ else
                                          f"{len(open_)} comparison(s) vs {baseline} still undecided at "
                                          f"{len(seeds)} seed(s) (--max-seeds {max_seeds})"))
    return ext
