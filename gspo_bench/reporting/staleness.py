"""``staleness``: the staleness grid's page (``staleness_grid``): which (loss, correction) holds its score as its
samples grow stale, and where each one falls, with the collapse events.

Per (correction, algorithm) and eta > 0, the per-seed paired difference of final greedy pass@1, the run at eta
minus the same (correction, algorithm) on policy (eta 0), from one warm start per seed:

    d_s         = final_s(eta) - final_s(0)
    holds       the 95 % t interval of mean d lies wholly above -margin, decided by the symmetric region test
                (``paired.region_test``), Holm-adjusted over every row of the page (one family)
    falls       the interval lies wholly below -margin, decided the same way
    not decided neither; the MDE says how far beyond -margin the design detects with 80 % power at Holm's
                first level

``grid_rows`` is pure; ``markdown`` and ``plot_grid`` render; the command is ``cli/info.staleness_command``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from gspo_bench import tables
from gspo_bench.reporting.claims import ALPHA, measure, select
from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.paired import PairedStat, seed_key, holm, holm_first_level, mde, paired_summary, region_test
from gspo_bench.reporting.staleness_grid import CORRECTIONS, ETAS, cells, commands, experiment

HOLDS, FALLS, UNDECIDED = "holds", "falls", "not decided"


@dataclass
class Cell:
    """One (correction, algorithm, eta): its seeds' final pass@1 and collapse events."""

    correction: str
    algo: str
    eta: int
    finals: dict[str, float]  # seed -> final greedy pass@1, points
    collapses: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # seed -> (kind, step) events

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.finals.values()) if self.finals else None


@dataclass
class Row:
    """eta's run against the same (correction, algorithm) on policy, paired by seed."""

    cell: Cell
    base: Cell
    stat: PairedStat
    seeds: list[str]
    p: float | None = None
    p_holm: float | None = None
    verdict: str = UNDECIDED
    mde: float | None = None


def provenance(runs: dict[str, list[RunData]]) -> str:
    """The runs read, in words: how many FINISHED, and the commits of the code that made them."""
    mine = [r for rs in runs.values() for r in rs if r.status == "FINISHED"]
    commits = sorted({r.tags.get("git.commit", "?") for r in mine})
    return (f"The page reads {len(mine)} FINISHED runs, made at commit{'s' if len(commits) > 1 else ''} "
            + ", ".join(f"`{c}`" for c in commits) + ".") if mine else "No FINISHED run was read."


def collect(runs: dict[str, list[RunData]]) -> dict[tuple[str, str, int], Cell]:
    """(correction, algorithm, eta) -> its Cell, from the runs of each grid experiment (absent ones: empty)."""
    out = {}
    for eta, corr in cells():
        mine = runs.get(experiment(eta, corr), [])
        for algo in CORRECTIONS[corr].algos:
            chosen = select(mine, (("algo", algo),))
            finals = {s: v for s, r in chosen.items() if (v := measure(r, "final")) is not None}
            out[corr, algo, eta] = Cell(corr, algo, eta, finals,
                                        {s: r.collapse_steps() for s, r in chosen.items() if r.collapse_steps()})
    return out


def grid_rows(grid: dict[tuple[str, str, int], Cell], margin: float) -> list[Row]:
    """Every (correction, algorithm, eta > 0) against its eta 0, tested as the module says, Holm over all."""
    rows = []
    for corr, c in CORRECTIONS.items():
        for algo in c.algos:
            base = grid[corr, algo, 0]
            for eta in ETAS[1:]:
                cell = grid[corr, algo, eta]
                seeds = sorted(set(cell.finals) & set(base.finals), key=seed_key)
                # d_s = final_s(eta) - final_s(0)
                stat = paired_summary([cell.finals[s] - base.finals[s] for s in seeds])
                rows.append(Row(cell, base, stat, seeds))
    region = (-margin, math.inf)
    tests = [region_test(r.stat, region) for r in rows]
    adjusted = holm([t[0] if t else None for t in tests])
    level = holm_first_level(ALPHA, sum(t is not None for t in tests))
    for r, t, q in zip(rows, tests, adjusted):
        r.mde = mde(r.stat.sd, r.stat.n, level) if r.stat.sd else None
        if t is None:
            continue
        r.p, r.p_holm = t[0], q
        if q < ALPHA:
            r.verdict = HOLDS if t[1] else FALLS
    return rows


def _num(x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1f}" if sign else f"{x:.1f}"


def _p(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2g}" if x >= 1e-4 else "<1e-4")


def _collapse_text(cell: Cell) -> str:
    if not cell.collapses:
        return "none"
    kinds: dict[str, int] = {}
    for events in cell.collapses.values():
        for kind, _ in events:
            kinds[kind] = kinds.get(kind, 0) + 1
    first = min(step for events in cell.collapses.values() for _, step in events)
    return (f"{len(cell.collapses)}/{len(cell.finals)} seeds: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
            + f" (first at step {first})")


def markdown(grid: dict[tuple[str, str, int], Cell], rows: list[Row], meta: dict, figure: str | None) -> str:
    margin = meta["margin"]
    out = ["# Stale samples: which loss and correction hold their score", "",
           f"Made by `{meta['command']}` at commit `{meta['commit']}` ({meta['machine']}). Margin: {margin:g} "
           f"points of greedy pass@1. {meta['runs']}", "",
           "The question: as the samples an update trains on grow stale (drawn by the policy of `eta` RL steps "
           "ago, as an asynchronous trainer's are), which combination of loss and correction keeps the score it "
           "reaches on policy, and which falls. The staleness is the deterministic lag `rollout.staleness = eta`, "
           "so the cells are exact and paired: each seed's cells start from one warm start and see the same "
           "prompts. An asynchronous run's staleness varies from step to step and is not reproducible; this "
           "grid is the controlled axis.", "",
           "How to read it: per (correction, algorithm) and eta, d_s is a seed's final greedy pass@1 at eta "
           "minus the same (correction, algorithm) on policy (eta 0). **Holds**: the 95 % t interval of mean d "
           f"lies wholly above -{margin:g} (no worse than the margin); **falls**: wholly below it; each decided "
           "by the one symmetric region test, Holm-adjusted over every row of this page. **Not decided**: "
           "neither; the MDE is how far beyond the edge the design detects with 80 % power at Holm's first "
           "level. Collapse events are the detector's (`collapse/*`), counted per cell.", "",
           "## The corrections", ""]
    for c in CORRECTIONS.values():
        out.append(f"- `{c.name}` ({', '.join(c.algos)}): {c.text}; "
                   + (", ".join(f"`{s}`" for s in c.sets) if c.sets else "no setting beside the lag") + ".")
    out += ["", "## Commands", "", "Each (eta, correction) is one experiment, `staleness-e<eta>-<correction>`, "
            "one store for a round's cells (`staleness --run --seeds ...` trains them all in one command; "
            "`staleness --runs A --runs B` joins two rounds' tables, each seed from one); the runs read here were "
            "made by these, with `--tracking-uri` naming the store, one seed at a time (a stopped job resumes "
            "with `--resume`):", "", "```bash"]
    out += [c for eta, corr in cells() for c in commands(eta, corr)]
    out += ["```", "", "## Final greedy pass@1 by staleness", "",
            "Mean over seeds (seeds in brackets). Cells may hold different seeds (a second round grows only "
            "some): compare two cells through the paired table below, which pairs the seeds both hold.", ""]
    table = [["correction", "algorithm", *(f"eta {e}" for e in ETAS)]]
    for corr, c in CORRECTIONS.items():
        for algo in c.algos:
            table.append([corr, algo, *(f"{_num(grid[corr, algo, e].mean)} ({len(grid[corr, algo, e].finals)})"
                                        for e in ETAS)])
    out += [tables.markdown(table[0], table[1:]), ""]
    if figure:
        out += [f"![staleness]({figure})", ""]
    out += ["## What holds and what falls", ""]
    head = ["correction", "algorithm", "eta", "seeds", "mean d", "95 % CI", "MDE", "p", "Holm p", "verdict",
            "collapse events at eta"]
    body = []
    for r in rows:
        ci = "-" if r.stat.ci is None else f"[{r.stat.ci[0]:+.1f}, {r.stat.ci[1]:+.1f}]"
        body.append([r.cell.correction, r.cell.algo, str(r.cell.eta), str(r.stat.n), _num(r.stat.mean, True), ci,
                     _num(r.mde), _p(r.p), _p(r.p_holm), f"**{r.verdict}**" if r.verdict != UNDECIDED else r.verdict,
                     _collapse_text(r.cell)])
    out += [tables.markdown(head, body), "", "## In words", ""]
    out += summary_lines(rows)
    out += ["", "Collapse events on policy (eta 0): " + "; ".join(
        f"{corr} {algo}: {_collapse_text(grid[corr, algo, 0])}" for corr, c in CORRECTIONS.items()
        for algo in c.algos) + ".", ""]
    return "\n".join(out)


def summary_lines(rows: list[Row]) -> list[str]:
    """Per (correction, algorithm): the etas it holds at and those it falls at (decided), in words."""
    lines = []
    for corr, c in CORRECTIONS.items():
        for algo in c.algos:
            mine = [r for r in rows if (r.cell.correction, r.cell.algo) == (corr, algo)]
            held = [str(r.cell.eta) for r in mine if r.verdict == HOLDS]
            fell = [f"{r.cell.eta} ({_num(r.stat.mean, True)} points)" for r in mine if r.verdict == FALLS]
            parts = []
            if held:
                parts.append(f"holds at eta {', '.join(held)}")
            if fell:
                parts.append(f"falls at eta {', '.join(fell)}")
            if (held or fell) and len(held) + len(fell) < len(mine):
                parts.append("not decided at the other etas")
            if not parts:
                parts.append("not decided at any eta" if any(r.stat.n for r in mine) else "not run")
            lines.append(f"- `{corr}` {algo}: " + "; ".join(parts) + ".")
    return lines


def plot_grid(grid: dict[tuple[str, str, int], Cell], path: Path) -> Path:
    """One panel per correction: final pass@1 against eta, a line per algorithm (mean, and each seed's dots)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from gspo_bench.reporting.figures import PALETTE, style_indices

    index = style_indices([a for c in CORRECTIONS.values() for a in c.algos])
    fig = Figure(figsize=(3.2 * len(CORRECTIONS), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(CORRECTIONS), sharey=True)
    for ax, (corr, c) in zip(axes, CORRECTIONS.items()):
        for algo in c.algos:
            color = PALETTE[index[algo] % len(PALETTE)]
            xs = [e for e in ETAS if grid[corr, algo, e].finals]
            ax.plot(xs, [grid[corr, algo, e].mean for e in xs], "-o", color=color, label=algo, ms=4)
            for e in xs:
                vals = list(grid[corr, algo, e].finals.values())
                ax.plot([e] * len(vals), vals, ".", color=color, alpha=0.35, ms=4)
        ax.set_title(corr, fontsize=9)
        ax.set_xticks(ETAS)
        ax.set_xlabel("eta (RL steps stale)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("final greedy pass@1 (%)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path

