"""``claims``: a verdict on every claim of ``claim_specs`` from the benchmark's own MLflow runs.

Per part (see ``claim_specs``): the per-seed differences ``d_s``, their mean and 95 % t interval
(``paired.paired_summary``), and a verdict against the claimed region R = (lo, hi), under the project's one
multiplicity rule (docs/algorithms.md, "One multiplicity rule"):

    reproduced      the 95 % interval lies inside R
    refuted         the test that the mean lies outside R (``paired.outside_p``) rejects at the level its
                    family's Holm adjustment allows
    not decided     neither (or fewer than 2 seeds: no interval)

A part that is not decisive is shown beside the verdict with its interval; with no region at all (the whole
line) it is *a reading*, a measured quantity the claim's mechanism explains, and nothing is tested.

A part's family: when the part is one of the paired tables' comparisons (``shared_comparison``: an algorithm's
final pass@1 minus the baseline's in one experiment, its region bounded at 0), that table's family, the
experiment's algorithms against the baseline on final pass@1, and the part takes the table's verdict (decided
when its Holm p is below 0.05, on the side its mean falls), so the two pages agree. Every other decisive part
of the page is one family, the page's region tests, Holm over their ``outside_p``. A tie (every seed's
difference equal) has no spread to test: its point interval decides, outside any family.

A claim is *reproduced* when every decisive part is (an intersection-union test: each part at its own level,
no correction, since all must hold), *refuted* when any decisive part is refuted at its family's level, else
*not decided*; with no decisive part measured it is *not run*.

``evaluate(claims, runs_by_experiment)`` is pure; ``load`` reads MLflow; ``markdown`` and ``plot_claim``
render.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path

from gspo_bench import tables
from gspo_bench.reporting.claim_specs import EXPERIMENTS, Claim, Part, Term
from gspo_bench.reporting.frame import FINISHED, RunData
from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE
from gspo_bench.reporting.paired import (PairedStat, holm, holm_first_level, mde, outside_p, paired_summary,
                                         signed_sum_by_seed, tost_power)
from gspo_bench.reporting.seeds import RUNS, SEED, per_seed, run_table

REPRODUCED, REFUTED, UNDECIDED, NOT_RUN = "reproduced", "refuted", "not decided", "not run"
READING = "a reading"  # a part shown beside the verdict with no region claimed (the whole line): nothing to test
ALPHA, POWER = 0.05, 0.8  # every family's level, and the power its MDE is quoted at
GROUP_TAGS = ("algo", "task", "model", "preset", "tuning")  # a run's algorithm and group (its config: tuning)
METRICS = ("eval/pass1",)  # always loaded; ``needed_metrics`` adds what the claims measure and draw


def needed_metrics(specs) -> tuple[str, ...]:
    """Every metric history the claims read: the measures' keys (``log10:KEY``, ``mean:KEY``) and the curves'."""
    keys = list(METRICS)
    for c in specs:
        keys.append(c.curve_metric)
        keys += [t.measure.split(":", 1)[1] for p in c.parts for t in p.terms
                 if t.measure.startswith(("log10:", "mean:", "min:"))]
    return tuple(dict.fromkeys(keys))


@dataclass
class PartResult:
    part: Part
    stat: PairedStat
    seeds: list[str]
    verdict: str
    missing: str = ""  # why there is no data (an experiment or term without FINISHED runs)
    p: float | None = None  # the deciding test's p: outside the region, or the paired table's t test
    p_family: float | None = None  # that p, Holm-adjusted over the part's family
    family: str = ""  # which family, in words
    mde: float | None = None  # the effect beyond the region's edge the deciding level detects with 80 % power
    mde_alpha: float = ALPHA  # that level: Holm's first step over the family


@dataclass
class ClaimResult:
    claim: Claim
    parts: list[PartResult]
    verdict: str


def measure(run: RunData, name: str) -> float | None:
    """One number of a run (see ``claim_specs``); None when the run lacks it."""
    ev = run.history.get("eval/pass1", [])
    if name in ("final", "warm") or name.startswith("at:"):
        if not ev:
            return None
        if name == "final":
            return 100 * ev[-1][1]
        if name == "warm":
            return 100 * ev[0][1]
        step = int(name[3:])
        return next((100 * v for s, v in ev if s == step), None)
    kind, _, key = name.partition(":")
    values = [v for _, v in run.history.get(key, []) if math.isfinite(v)]
    if kind not in ("log10", "mean", "min") or not key:
        raise ValueError(f"unknown measure {name!r}")
    if not values:
        return None
    if kind == "min":
        return min(values)
    mean = statistics.fmean(values)
    if kind == "mean":
        return mean
    return math.log10(mean) if mean > 0 else None


def select(runs: list[RunData], where: tuple[tuple[str, str], ...]) -> dict[str, RunData]:
    """seed -> the FINISHED run whose tags include ``where``. Several runs of one seed are counted by the rule
    of ``seeds.py``; a seed it still counts more than one run for (runs of different settings, both matching
    ``where``) is a ValueError naming the first two: a term names one setting, and a mean over settings it
    does not name would test something the claim does not say."""
    mine = [r for r in runs if r.status == FINISHED and r.seed != "?" and all(r.tags.get(k) == v for k, v in where)]
    table = run_table(mine, lambda r: {"run_id": r.run_id})
    counts = per_seed(table, [], values=[])[RUNS]
    if (counts > 1).any():
        # the first seed whose second run comes earliest in ``runs``, as the runs are listed
        seed = table.loc[table.duplicated(SEED), SEED].iloc[0]
        first, second = table.loc[table[SEED] == seed, "run_id"].iloc[:2]
        raise ValueError(f"two FINISHED runs match {dict(where)} at seed {seed}: {first} and {second}")
    return {r.seed: r for r in mine}


def verdict(ci: tuple[float, float] | None, region: tuple[float, float]) -> str:
    """Reproduced / refuted / not decided: the interval against the claimed open region (lo, hi)."""
    if ci is None:
        return UNDECIDED
    lo, hi = region
    # inside: lo < ci_lo and ci_hi < hi; outside: ci_hi <= lo or ci_lo >= hi
    if lo < ci[0] and ci[1] < hi:
        return REPRODUCED
    if ci[1] <= lo or ci[0] >= hi:
        return REFUTED
    return UNDECIDED


def _where(t: Term) -> str:
    """A term's run tags as ``k=v, ...`` (the reasons a part is not run name them)."""
    return ", ".join(f"{k}={v}" for k, v in t.where)


def evaluate_part(part: Part, runs: dict[str, list[RunData]]) -> PartResult:
    """The paired differences of one part over the seeds where every term has a run with its measure."""
    picks: list[tuple[Term, dict[str, RunData]]] = []
    for t in part.terms:
        chosen = select(runs.get(t.experiment, []), t.where)
        if not chosen:
            why = (f"no runs of experiment {t.experiment}" if not runs.get(t.experiment)
                   else f"no FINISHED run of {t.experiment} with {_where(t)}")
            return PartResult(part, paired_summary([]), [], NOT_RUN, why)
        picks.append((t, chosen))
    values = [(t.sign, {s: measure(r, t.measure) for s, r in chosen.items()}) for t, chosen in picks]
    # d_s = sum_i sign_i * measure_i(run_i at seed s), over the seeds where every term is measured
    used, diffs = signed_sum_by_seed(values)
    if not diffs:
        # a term none of whose runs has its measure (say a metric its runs predate) is named
        bare = [f"{t.measure} of {_where(t)} in {t.experiment}"
                for (t, _), (_, got) in zip(picks, values)
                if all(v is None or not math.isfinite(v) for v in got.values())]
        why = "no seed has every term measured" + (f" (no run has {'; '.join(bare)})" if bare else "")
        return PartResult(part, paired_summary([]), [], NOT_RUN, why)
    stat = paired_summary(diffs)
    if not part.decisive and part.region == (-math.inf, math.inf):
        return PartResult(part, stat, used, READING)
    return PartResult(part, stat, used, verdict(stat.ci, part.region))


def combine(results: list[PartResult]) -> str:
    """A claim's verdict from its decisive parts' verdicts."""
    vs = [r.verdict for r in results if r.part.decisive and r.verdict != NOT_RUN]
    if not vs:
        return NOT_RUN
    if REFUTED in vs:
        return REFUTED
    if all(v == REPRODUCED for v in vs) and len(vs) == sum(r.part.decisive for r in results):
        return REPRODUCED
    return UNDECIDED


def shared_comparison(part: Part, baseline: str = DEFAULT_BASELINE) -> tuple[str, str] | None:
    """(experiment, algorithm) when ``part`` is one of the paired tables' comparisons: in one experiment, an
    algorithm's final pass@1 minus ``baseline``'s under the same other tags, with 0 an edge of the claimed
    region (the tables test against 0); None otherwise."""
    if len(part.terms) != 2 or 0.0 not in part.region:
        return None
    a, b = part.terms
    if a.experiment != b.experiment or (a.measure, b.measure) != ("final", "final") or (a.sign, b.sign) != (1, -1):
        return None
    ta, tb = dict(a.where), dict(b.where)
    algo = ta.pop("algo", None)
    if tb.pop("algo", None) != baseline or algo in (None, baseline) or ta != tb:
        return None
    return a.experiment, algo


def _table_rows(experiment: str, by: tuple[str, ...], runs: dict[str, list[RunData]], cache: dict) -> dict:
    """(group key, algorithm) -> the paired table's final pass@1 row and its family's size, for ``experiment``'s
    runs against the baseline, split by the run tags ``by`` as ``report --by`` splits them (computed once per
    experiment and split). The key is the group's (task, model, preset, config) and the ``by`` values: a part
    whose terms pin a setting (routing_replay=none) is that split's comparison, never an average over settings."""
    from gspo_bench.reporting.paired_table import paired_groups

    if (experiment, by) not in cache:
        cache[experiment, by] = {(g.key, r["algo"]): (r, g.mde_algos_tested)
                                 for g in paired_groups(runs.get(experiment, []), DEFAULT_BASELINE, ALPHA, POWER,
                                                        by=by)
                                 for r in g.rows if r["metric"] == "final_pass1"}
    return cache[experiment, by]


def _side(mean: float, region: tuple[float, float]) -> str:
    """Reproduced or refuted, for a mean decided away from 0 whose claimed region has 0 as an edge."""
    inside = mean > 0 if region[0] == 0.0 else mean < 0
    return REPRODUCED if inside else REFUTED


def apply_families(results: list[PartResult], runs: dict[str, list[RunData]]) -> None:
    """Set each decisive part's family, p values, MDE and verdict under the one multiplicity rule (module
    docstring). Parts not run keep their verdict; parts that are not decisive keep their interval's."""
    tables: dict = {}
    own: list[PartResult] = []
    for r in results:
        if not r.part.decisive or r.verdict == NOT_RUN or r.stat.ci is None:
            continue
        if r.stat.tied:  # no spread, no test (the paired tables show n/a): the point interval decides
            r.family = "none (a tie: every seed's difference the same)"
            continue
        shared = shared_comparison(r.part)
        if shared is not None:
            experiment, algo = shared
            # the settings the terms pin besides the algorithm: the table's split of this comparison
            split = tuple(sorted((k, v) for k, v in r.part.terms[0].where if k not in GROUP_TAGS))
            by = tuple(k for k, _ in split)
            group = next(iter(select(runs[experiment], r.part.terms[0].where).values())).group
            row, k = _table_rows(experiment, by, runs, tables).get(((*group, *(v for _, v in split)), algo),
                                                                   (None, 0))
            if row is not None and row["n"] == r.stat.n:
                within = "".join(f", {k_}={v}" for k_, v in split)
                r.family = f"{experiment}{within}: {k} algorithms against {DEFAULT_BASELINE}, final pass@1"
                r.p, r.p_family, r.mde_alpha = row["p"], row["p_holm"], row["mde_alpha"]
                r.mde = None if row["mde"] is None else 100 * row["mde"]
                decided = r.p_family is not None and r.p_family < ALPHA
                r.verdict = _side(r.stat.mean, r.part.region) if decided else UNDECIDED
                continue
        own.append(r)
    k = len(own)
    level = holm_first_level(ALPHA, k)
    for r, q in zip(own, holm([outside_p(r.stat, r.part.region) for r in own])):
        r.family = f"this page's {k} region tests"
        r.p, r.p_family, r.mde_alpha = outside_p(r.stat, r.part.region), q, level
        r.mde = mde(r.stat.sd, r.stat.n, level, POWER)
        inside = verdict(r.stat.ci, r.part.region) == REPRODUCED
        r.verdict = REPRODUCED if inside else (REFUTED if q is not None and q < ALPHA else UNDECIDED)


def evaluate(claims: tuple[Claim, ...], runs: dict[str, list[RunData]]) -> list[ClaimResult]:
    """Every claim's parts (``evaluate_part``), their verdicts under the one multiplicity rule over the whole
    page (``apply_families``), and each claim's verdict (``combine``)."""
    parts = [[evaluate_part(p, runs) for p in c.parts] for c in claims]
    apply_families([r for ps in parts for r in ps], runs)
    return [ClaimResult(c, ps, combine(ps)) for c, ps in zip(claims, parts)]


def check_table(frame, experiments: set[str], source: str) -> None:
    """A runs table read for the claims (``claims --runs``) holds one of their ``experiments`` at least, else a
    ConfigError naming the experiments read and those it holds: such a table would leave every claim 'not run'
    without saying why."""
    from gspo_bench.config import ConfigError

    held = sorted(frame["experiment"].dropna().unique())
    if not experiments & set(held):
        raise ConfigError(f"{source}: holds none of the experiments the claims read ({', '.join(sorted(experiments))}"
                          f"); it holds {', '.join(held) or 'no run'}")


def join_tables(tables: dict[str, object]):
    """Runs tables (path -> table, ``frame.read_frame``) as one: each experiment must come from one table, so
    an experiment held by two of them is a ConfigError naming both (joining them would pair runs of two
    stores by seed as if they were one experiment)."""
    import pandas as pd

    from gspo_bench.config import ConfigError

    where: dict[str, str] = {}
    for path, table in tables.items():
        for name in table["experiment"].dropna().unique():
            if name in where:
                raise ConfigError(f"--runs: experiment {name!r} is in both {where[name]!r} and {path!r}; "
                                  f"give each experiment from one table")
            where[name] = path
    return pd.concat(list(tables.values()), ignore_index=True)


def load(uris: dict[str, str] | None, experiments: set[str], metrics: tuple[str, ...] = METRICS,
         frame=None) -> tuple[dict[str, list[RunData]], dict[str, str], object]:
    """Runs of each experiment from its tracking URI (``uris[name]``), or from ``frame`` (a runs table holding
    them all, ``frame.read_frame``); an experiment that is not there is reported in the second dict (name ->
    reason), not raised. The third: the runs table of every experiment read (the page's raw data)."""
    import pandas as pd

    from gspo_bench.config import ConfigError
    from gspo_bench.reporting.frame import load_frame, runs_of

    runs, missing, frames = {}, {}, []
    for name in sorted(experiments):
        if frame is not None:
            mine = frame[frame["experiment"] == name]
            if mine.empty:
                missing[name] = f"experiment {name!r} is not in the runs table"
                continue
        else:
            try:
                mine = load_frame(uris[name], name, metrics=metrics)
            except ConfigError as e:
                missing[name] = str(e)
                continue
        frames.append(mine)
        runs[name] = runs_of(mine)
    return runs, missing, (pd.concat(frames, ignore_index=True) if frames else None)


# -- the seed planner ----------------------------------------------------------------------------------------------
def plan_parts(results: list[ClaimResult], target: float, power: float = POWER) -> list[dict]:
    """``claims --target-mde``: per decisive part with a spread, the seeds its design needs for an MDE of
    ``target`` (in the part's unit) at the level that decides it (``PartResult.mde_alpha``: Holm's first step over
    its family), at the observed sd and at the ends of that sd's 95 % interval (``paired.sd_interval``; None:
    more than ``seeds_needed``'s limit)."""
    from gspo_bench.reporting.paired import sd_interval, seeds_needed

    out = []
    for res in results:
        for r in res.parts:
            st = r.stat
            if not r.part.decisive or st.sd is None or st.tied or r.verdict == NOT_RUN:
                continue
            band = sd_interval(st.sd, st.n)
            out.append({"claim": res.claim.key, "part": r.part.label, "unit": r.part.unit, "n": st.n, "sd": st.sd,
                        "sd_ci": band, "level": r.mde_alpha, "verdict": r.verdict,
                        "seeds": seeds_needed(st.sd, target, r.mde_alpha, power),
                        "seeds_range": None if band is None else tuple(seeds_needed(x, target, r.mde_alpha, power)
                                                                       for x in band)})
    return out


def render_plan(rows: list[dict], target: float) -> str:
    """The plan as Markdown: how to read it, then one row per part."""
    def seeds(n: int | None) -> str:
        return "over 10000" if n is None else str(n)

    head = (f"**Seeds to detect {target:g} (in each part's unit) with 80 % power**, per decisive part, at the level "
            "that decides it (Holm's first step over its family), from the observed sd of its per-seed differences; "
            "the last column is the same at the ends of that sd's 95 % interval (from 3 seeds the sd is known only "
            "to within about x0.5 to x6).\n\n")
    if not rows:
        return head + "No decisive part has 2 or more seeds with a spread: nothing to plan from.\n"
    cells = [[r["claim"], r["part"], r["unit"], str(r["n"]), f"{r['sd']:.3g}",
              "-" if r["sd_ci"] is None else f"[{r['sd_ci'][0]:.3g}, {r['sd_ci'][1]:.3g}]", f"{r['level']:.2g}",
              r["verdict"], seeds(r["seeds"]),
              "-" if r["seeds_range"] is None else f"{seeds(r['seeds_range'][0])} to {seeds(r['seeds_range'][1])}"]
             for r in rows]
    return head + tables.markdown(("claim", "part", "unit", "seeds now", "sd", "sd 95 % CI", "α", "verdict",
                                   "seeds for the target", "over the sd's CI"), cells)


# -- rendering -----------------------------------------------------------------------------------------------------
def _num(x: float | None, unit: str) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    # points of pass@1 to 0.1, log10 ratios to 0.01, a raw metric (entropy, ...) to 0.001
    return f"{x:+.1f}" if unit == "points" else (f"{x:+.2f}" if unit == "log10" else f"{x:+.3f}")


def _region(region: tuple[float, float], unit: str) -> str:
    lo, hi = region
    if not (math.isfinite(lo) or math.isfinite(hi)):
        return "-"  # a reading: nothing claimed
    if unit == "log10":
        return f"({_num(lo, unit)}, {_num(hi, unit)})" if math.isfinite(lo) and math.isfinite(hi) else \
            (f"> {_num(lo, unit)}" if math.isfinite(lo) else f"< {_num(hi, unit)}")
    if math.isfinite(lo) and math.isfinite(hi):
        return f"({lo:+g}, {hi:+g})"
    return f"> {lo:+g}" if math.isfinite(lo) else f"< {hi:+g}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{10 ** x:.3g}x"


def part_row(r: PartResult) -> list[str]:
    st, unit = r.stat, r.part.unit
    mean = _num(st.mean, unit) + (f" ({_ratio(st.mean)})" if unit == "log10" and st.mean is not None else "")
    ci = "-" if st.ci is None else f"[{_num(st.ci[0], unit)}, {_num(st.ci[1], unit)}]" + (
        f" ({_ratio(st.ci[0])} to {_ratio(st.ci[1])})" if unit == "log10" else "")
    mde_cell = "-" if r.mde is None else f"{_num(r.mde, unit).lstrip('+')} (α {r.mde_alpha:.2g})"
    tost = tost_power(st.sd, st.n, r.part.region) if r.part.decisive and not st.tied else None
    if tost is not None:  # an equivalence claim: the chance to reproduce it were the truth the region's centre
        mde_cell += f"; {100 * tost:.0f} % to land inside at its centre"
    v = r.verdict + ("" if r.part.decisive else " (shown, not in the verdict)" if r.verdict != READING
                     else ", not in the verdict")
    if r.missing:
        v += f": {r.missing}"
    seeds = ",".join(r.seeds) or "-"
    ps = [_p(r.p), _p(r.p_family)]
    return [r.part.label, r.part.unit, f"{len(r.seeds)} ({seeds})", mean, ci, mde_cell, _region(r.part.region, unit),
            *ps, r.family or "-", v]


def _p(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2g}" if x < 0.01 else f"{x:.2f}")


def seeds_and_mde(res: ClaimResult) -> str:
    """' at n seeds (MDE ...)': the seed counts of the decisive parts, and the MDE of each undecided one."""
    decisive = [p for p in res.parts if p.part.decisive and p.stat.n]
    if not decisive:
        return ""
    ns = sorted({p.stat.n for p in decisive})
    mdes = [f"{p.part.label}: {p.mde:.2g} {'log10' if p.part.unit == 'log10' else 'points'} at α {p.mde_alpha:.2g}"
            for p in decisive if p.verdict == UNDECIDED and p.mde is not None]
    return f" at {'/'.join(map(str, ns))} seeds" + (f" (MDE {'; '.join(mdes)})" if mdes else "")


def markdown(results: list[ClaimResult], meta: dict, figures: dict[str, str]) -> str:
    """The claims page: a summary table, then per claim its experiment, commands, parts, figure, verdict."""
    out = ["# The sources' claims, checked in miniature", "",
           f"Made by `{meta['command']}` at commit `{meta['commit']}` ({meta['machine']}). "
           f"Margin: {meta['margin']:g} points of greedy pass@1."
           + (f" Note: {meta['set_aside']}." if meta.get("set_aside") else "")
           + (f" Note: {meta['predates']}." if meta.get("predates") else ""), "",
           "How to read it: each claim is split into parts. A part is a per-seed number d_s, mostly a paired "
           "difference (runs with the same seed share their warm start and prompt order), else one run's measure, "
           "with its mean, 95 % t interval and the region the claim predicts for it. **Reproduced**: the interval lies inside that region. **Refuted**: the "
           "test that the mean lies outside the region (p) rejects after Holm's adjustment over the part's "
           "family (Holm p below 0.05). A part that is also a comparison of the paired tables (an algorithm's "
           "final pass@1 against grpo in one experiment, the region bounded at 0) belongs to that table's "
           "family and gets its verdict, so both pages say the same; every other part belongs to this page's "
           "family of region tests. **Not decided**: neither; the MDE is then the distance beyond the region's "
           "edge that the deciding level (its α, Holm's first step over the family) detects with 80 % power, and "
           "for an equivalence region (bounded on both sides) the chance that the interval lands inside it were "
           "the true difference its centre (the power of the two one-sided tests, computed exactly). "
           "A claim is reproduced when every decisive part is (each at its own level: all must hold, so no "
           "correction), refuted when any decisive part is refuted at its family's level. Parts marked 'not in "
           "the verdict' are shown beside it; one marked 'a reading' claims no region and tests nothing. "
           "Scope: these are miniatures (models of ~1M parameters, arithmetic tasks, 40-80 RL steps); a refutation "
           "says the effect does not appear at this scale, not that the source is wrong at its own.", ""]
    out += tables.markdown(("#", "claim", "verdict"), [
        [i, r.claim.text, f"**{r.verdict}**{seeds_and_mde(r) if r.verdict == UNDECIDED else ''}"]
        for i, r in enumerate(results, 1)]).rstrip("\n").split("\n")
    for i, r in enumerate(results, 1):
        c = r.claim
        out += ["", f"## {i}. {c.text}", "", f"**Verdict: {r.verdict}{seeds_and_mde(r)}.**", "",
                f"Source: {c.source}.", "", f"Experiment: {c.design}", ""]
        for e in c.experiments:
            what, cmds = EXPERIMENTS[e]
            # every command that made the experiment's runs, one sub-item each
            out += [f"- `{e}`: {what}." + (f" **Missing**: {meta['missing'][e]}" if e in meta["missing"] else ""),
                    *(f"  - `{cmd}`" for cmd in cmds)]
        out += ["", *tables.markdown(("part", "unit", "seeds", "mean d", "95 % CI", "MDE", "claimed", "p",
                                                     "Holm p", "family", "verdict"),
                                     map(part_row, r.parts)).rstrip("\n").split("\n")]
        if c.key in figures:
            out += ["", f"![{c.key}]({figures[c.key]})"]
    return "\n".join(out) + "\n"


def plot_claim(res: ClaimResult, runs: dict[str, list[RunData]], path: Path) -> Path:
    """Left: the claim's curves (mean over seeds, min-max band); right: each part's interval and region, one
    panel per unit (points, log10 of a ratio, a raw metric) so that each has an axis of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from gspo_bench.reporting.figures import curve

    c = res.claim
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    rows = [p for p in res.parts if p.stat.mean is not None]
    units = list(dict.fromkeys(p.part.unit for p in rows)) or ["points"]
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 1])
    ax = fig.add_subplot(grid[0])
    right = grid[1].subgridspec(len(units), 1, height_ratios=[
        max(1, sum(p.part.unit == u for p in rows)) for u in units])
    log = c.curve_metric == "clip/frac"
    for i, cv in enumerate(c.curves):
        sel = list(select(runs.get(cv.experiment, []), cv.where).values())
        got = curve(sel, c.curve_metric, positive=log) if sel else None
        if got is None:
            continue
        steps, mean, lo, hi = got
        ax.plot(steps, mean, color=f"C{i}", marker="o" if len(steps) < 12 else None, ms=3,
                label=f"{cv.label} ({len(sel)} seeds)")
        if len(sel) > 1:
            ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.15)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("RL step")
    ax.set_ylabel(c.curve_metric)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    for k, unit in enumerate(units):
        fx = fig.add_subplot(right[k])
        mine = [p for p in rows if p.part.unit == unit]
        for y, p in enumerate(mine):
            color = {REPRODUCED: "tab:green", REFUTED: "tab:red"}.get(p.verdict, "tab:gray")
            if p.stat.ci is not None:
                fx.plot(p.stat.ci, [y, y], color=color, lw=2.5)
            fx.plot([p.stat.mean], [y], "o", color=color)
        fx.axvline(0, color="k", lw=0.8)
        a, b = fx.get_xlim()
        for y, p in enumerate(mine):  # the claimed region, cut to the axis
            lo, hi = p.part.region
            fx.fill_betweenx([y - 0.4, y + 0.4], max(lo, a), min(hi, b), color="tab:green", alpha=0.12, lw=0)
        fx.set_xlim(a, b)
        fx.set_ylim(len(mine) - 0.5, -0.5)
        fx.set_yticks(range(len(mine)), [textwrap.fill(p.part.label, 34) for p in mine], fontsize=7)
        fx.tick_params(axis="x", labelsize=7)
        fx.set_xlabel(f"[{unit}]", fontsize=7)
        if k == 0:
            fx.set_title("mean and 95 % CI; shaded: the claimed region", fontsize=7)
    fig.suptitle(c.text, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
