"""``claims``: a verdict on every claim of ``claim_specs`` from the benchmark's own MLflow runs.

Per part (see ``claim_specs``): the per-seed differences ``d_s``, their mean and 95 % t interval
(``paired.paired_summary``), and a claimed region R = (lo, hi) registered before the runs, its edges at the
smallest effect of interest (the margin; never 0 for a directional claim). One symmetric standard decides:

    one test        p = the smallest level at which the two-sided (1 - p) t interval lies wholly inside R or
                    wholly outside it (``paired.region_test``), Holm-adjusted over the part's family
    reproduced      decided (Holm p below 0.05) with the interval inside R
    refuted         decided with the interval outside R: a null effect refutes "better by more than the
                    margin" as readily as a true effect reproduces it
    not decided     neither (or fewer than 2 seeds: no interval); the MDE says what the design could detect

A part's family: when the part is one of the paired tables' comparisons (``canonical_row``: one algorithm
against another in one experiment under the same settings, or one algorithm under two settings), that table's
family (the experiment's comparisons on final pass@1 within its split), and the part prints the table's row,
computed with the claims' registered regions, so every page that shows the comparison prints the same
interval, p, Holm p, MDE and verdict. Every other decisive part belongs to its claim's own family, Holm over
their region tests. A tie (every seed's difference equal) has no spread to test: its point interval decides.

A claim is *reproduced* when every decisive part is (an intersection-union test: each part at its own level,
no correction, since all must hold), *refuted* when any decisive part is refuted at its family's level, else
*not decided*; with no decisive part measured it is *not run*; a claim whose mechanism no miniature here can
show is *retired*, its parts shown with the reason.

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
from gspo_bench.reporting.claim_specs import EXPERIMENTS, Claim, Part, Term, region_lookup, table_comparison
from gspo_bench.reporting.frame import FINISHED, RunData, warm_start_of
from gspo_bench.reporting.leaderboard import before_dev_split
from gspo_bench.reporting.paired import (PairedStat, holm, holm_first_level, mde, paired_summary, region_test,
                                         signed_sum_by_seed, tost_power)
from gspo_bench.reporting.seeds import RUNS, SEED, per_seed, run_table

REPRODUCED, REFUTED, UNDECIDED, NOT_RUN = "reproduced", "refuted", "not decided", "not run"
RETIRED = "retired"  # no miniature here can show the claim's mechanism: its parts are shown, nothing is tested
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
    before_dev_split: bool = False  # some of its runs' warm starts were accepted on the eval split


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
    does not name would test something the claim does not say (a ConfigError: the command says it in one line)."""
    mine = [r for r in runs if r.status == FINISHED and r.seed != "?" and all(r.tags.get(k) == v for k, v in where)]
    table = run_table(mine, lambda r: {"run_id": r.run_id})
    counts = per_seed(table, [], values=[])[RUNS]
    if (counts > 1).any():
        # the first seed whose second run comes earliest in ``runs``, as the runs are listed
        seed = table.loc[table.duplicated(SEED), SEED].iloc[0]
        first, second = table.loc[table[SEED] == seed, "run_id"].iloc[:2]
        from gspo_bench.config import ConfigError  # a runs table the page cannot read: one line, exit 2

        raise ConfigError(f"two FINISHED runs match {dict(where)} at seed {seed}: {first} and {second} (runs of "
                          "other settings, a warm start's outcome included; the page pairs one per seed)")
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
    for seed in used:
        starts = {warm_start_of(chosen[seed]) for _, chosen in picks} - {""}
        if len(starts) > 1:
            from gspo_bench.config import ConfigError  # a runs table the page cannot pair: one line, exit 2

            raise ConfigError(f"the runs of part {part.label!r} at seed {seed} began from {len(starts)} warm "
                              f"starts ({', '.join(sorted(starts))}: pass@1/dev pass@1/steps, made on two "
                              "machines): a paired difference needs one; run that seed's cells again on one machine")
    stat = paired_summary(diffs)
    old = any(before_dev_split(chosen[seed]) for _, chosen in picks for seed in used)
    if not part.decisive and part.region == (-math.inf, math.inf):
        return PartResult(part, stat, used, READING, before_dev_split=old)
    return PartResult(part, stat, used, verdict(stat.ci, part.region), before_dev_split=old)


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


def _split(where: dict) -> dict:
    """The settings a term pins besides its algorithm and group: the paired tables' ``by`` split."""
    return {k: v for k, v in where.items() if k not in GROUP_TAGS}


def canonical_row(part: Part, runs: dict[str, list[RunData]], cache: dict) -> tuple[dict, str] | None:
    """The paired tables' row of ``part`` and its family in words, when the part is one of their comparisons
    (``claim_specs.table_comparison``): an algorithm against another under the same settings (the table
    against that baseline, split by the settings the terms pin, as ``report --by ... --baseline ALGO`` draws
    it), or one algorithm under two settings differing in one tag (the split table against the baseline's
    value, ``report --by ... --baseline TAG=VALUE``). Both are computed with the claims' registered regions
    (``claim_specs.region_lookup``), so the row's p, Holm p, MDE and verdict are the ones every page prints
    for the comparison. None for any other part (its family is then its claim's own)."""
    from gspo_bench.reporting.paired_table import paired_groups
    from gspo_bench.reporting.split_pairs import split_pair_groups

    got = table_comparison(part)
    if got is None or not runs.get(got[0]):
        return None
    experiment, a, b = got
    sa, sb = _split(a), _split(b)
    by = tuple(sorted(sa))
    if set(sb) != set(sa) or any(a.get(k) != b.get(k) for k in GROUP_TAGS if k != "algo"):
        return None
    mine = select(runs[experiment], part.terms[0].where)
    if not mine:
        return None
    group = next(iter(mine.values())).group
    differ = [k for k in by if sa[k] != sb[k]]
    if a["algo"] != b["algo"] and not differ:
        key = ("algo", experiment, b["algo"], by)
        if key not in cache:
            cache[key] = paired_groups(runs[experiment], b["algo"], ALPHA, POWER, by, region_lookup(experiment))
        groups = [g for g in cache[key] if g.key == (*group, *(sa[k] for k in by))]
        within = "".join(f", {k}={sa[k]}" for k in by)
        whom = b["algo"]
    elif a["algo"] == b["algo"] and len(differ) == 1:
        tag = differ[0]
        key = ("split", experiment, tag, sb[tag], by)
        if key not in cache:
            cache[key] = split_pair_groups(runs[experiment], tag, sb[tag], by, ALPHA, POWER,
                                           region_lookup(experiment))
        groups = [g for g in cache[key] if g.key == group]
        within, whom = "", f"{tag}={sb[tag]}"
    else:
        return None
    for g in groups:
        family = [r for r in g.rows if r.get("metric") == "final_pass1"]
        k = sum(r["p"] is not None for r in family)
        for row in family:
            if row["algo"] == a["algo"] and row.get("by", {}) == ({k_: sa[k_] for k_ in by} if by else {}):
                return row, (f"{experiment}{within}: {k} comparison{'' if k == 1 else 's'} against {whom}, "
                            "final pass@1")
    return None


def _decide(r: PartResult, p: float | None, q: float | None, inside: bool | None) -> None:
    """A decisive part's verdict from its test's Holm p ``q`` and side: reproduced when decided inside the
    region, refuted when decided outside, else not decided."""
    r.p, r.p_family = p, q
    if q is not None and q < ALPHA:
        r.verdict = REPRODUCED if inside else REFUTED
    else:
        r.verdict = UNDECIDED


def apply_families(results: list[PartResult], runs: dict[str, list[RunData]], cache: dict | None = None,
                   own: str = "this claim's region tests") -> None:
    """Set each decisive part's family, p values, MDE and verdict under the one standard (module docstring),
    for one claim's ``results``. Parts not run keep their verdict; parts that are not decisive keep their
    interval's reading. ``cache``: the paired tables already computed (shared across claims)."""
    cache = {} if cache is None else cache
    mine: list[PartResult] = []
    for r in results:
        if not r.part.decisive or r.verdict == NOT_RUN or r.stat.ci is None:
            continue
        if r.stat.tied:  # no spread, no test (the paired tables show n/a): the point interval decides
            r.family = "none (a tie: every seed's difference the same)"
            continue
        got = canonical_row(r.part, runs, cache)
        # the table's row tests the region registered at the default margin: under another margin (claims
        # --margin) its p would test a region this part does not claim, so the part keeps its own family then
        if (got is not None and got[0]["n"] == r.stat.n and got[0]["p"] is not None
                and got[0].get("region") == r.part.region):
            row, r.family = got
            # the table's own numbers, in points: one comparison, one set of numbers on every page
            r.stat = scaled(row["stat"], row["scale"])
            r.mde_alpha = row["mde_alpha"]
            r.mde = None if row["mde"] is None else row["scale"] * row["mde"]
            _decide(r, row["p"], row["p_holm"], row.get("inside"))
            continue
        mine.append(r)
    k = len(mine)
    level = holm_first_level(ALPHA, k)
    tests = [region_test(r.stat, r.part.region) for r in mine]
    for r, t, q in zip(mine, tests, holm([None if t is None else t[0] for t in tests])):
        r.family = f"{own} ({k})"
        r.mde_alpha = level
        r.mde = mde(r.stat.sd, r.stat.n, level, POWER)
        _decide(r, None if t is None else t[0], q, None if t is None else t[1])


def scaled(st: PairedStat, scale: float) -> PairedStat:
    """A paired summary in display units (pass@1 in points: x 100)."""
    from dataclasses import replace

    return replace(st, mean=None if st.mean is None else scale * st.mean,
                   sd=None if st.sd is None else scale * st.sd,
                   ci=None if st.ci is None else (scale * st.ci[0], scale * st.ci[1]),
                   mde=None if st.mde is None else scale * st.mde)


def evaluate(claims: tuple[Claim, ...], runs: dict[str, list[RunData]]) -> list[ClaimResult]:
    """Every claim's parts (``evaluate_part``), their verdicts under the one standard (``apply_families``,
    claim by claim, the paired tables shared) and each claim's verdict (``combine``). A retired claim's parts are
    all shown beside a verdict of ``retired``."""
    from dataclasses import replace

    cache: dict = {}
    out = []
    for c in claims:
        parts = tuple(replace(p, decisive=False) for p in c.parts) if c.retired else c.parts
        results = [evaluate_part(p, runs) for p in parts]
        apply_families(results, runs, cache)
        out.append(ClaimResult(c, results, RETIRED if c.retired else combine(results)))
    return out


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
    """Runs tables (path -> table, ``frame.read_frame``) as one. An experiment may be split across them by seed
    (a later round's seeds trained into a new store), but each of its seeds must come from one table: a seed of
    an experiment held by two is a ConfigError naming both (joining them would pair two stores' runs of one seed
    as if one store had made them, or count a run twice)."""
    import pandas as pd

    from gspo_bench.config import ConfigError

    where: dict[tuple[str, str], str] = {}
    for path, table in tables.items():
        cells = table[["experiment", "tags.seed"]].dropna().drop_duplicates()
        for name, seed in sorted(cells.itertuples(index=False), key=lambda c: (c[0], int(c[1]))):
            key = (name, str(seed))
            if key in where:
                raise ConfigError(f"--runs: seed {seed} of experiment {name!r} is in both {where[key]!r} and "
                                  f"{path!r}; give each seed of an experiment from one table")
            where[key] = path
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
    if r.before_dev_split:
        v += "; runs from before the dev split"
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
           "with its mean, 95 % t interval and the region the claim predicts for it, registered before the runs "
           "with its edges at the smallest effect of interest (the margin): 'better' is ahead by more than the "
           "margin, 'at least as well' no worse than minus the margin, 'equal' within it. **One test per part**, "
           "symmetric in its two answers: p is the smallest level at which the two-sided t interval lies wholly "
           "inside the region or wholly outside it, adjusted by Holm's method over the part's family. "
           "**Reproduced**: decided (Holm p below 0.05) inside; **refuted**: decided outside, so a null effect "
           "refutes a directional claim as readily as a true one reproduces it; **not decided**: neither, and the "
           "MDE is the distance beyond the region's edge that the deciding level (its α, Holm's first step over "
           "the family) detects with 80 % power (for a region bounded on both sides also the chance of landing "
           "inside were the truth its centre). A part that is a comparison of the paired tables (one algorithm "
           "against another in one experiment, or one algorithm under two settings) belongs to that table's "
           "family and prints that table's row, so every page shows the comparison with the same numbers and "
           "verdict; every other part belongs to its claim's own family. A claim is reproduced when every "
           "decisive part is (each at its own level: all must hold, so no correction), refuted when any decisive "
           "part is. Parts marked 'not in the verdict' are shown beside it; one marked 'a reading' claims no "
           "region. A claim marked **retired** cannot be shown by any miniature here, for the reason given: its "
           "parts are shown and nothing is tested. "
           "Scope: these are miniatures (models of ~1M parameters, arithmetic tasks, 40-80 RL steps); a refutation "
           "says the effect does not appear at this scale, not that the source is wrong at its own.", ""]
    out += tables.markdown(("#", "claim", "verdict"), [
        [i, r.claim.text, f"**{r.verdict}**" + (seeds_and_mde(r) if r.verdict == UNDECIDED else
                                                 f": {r.claim.retired}" if r.verdict == RETIRED else "")
         + (", on runs from before the dev split" if r.verdict != RETIRED and any(
             p.before_dev_split for p in r.parts if p.part.decisive) else "")]
        for i, r in enumerate(results, 1)]).rstrip("\n").split("\n")
    for i, r in enumerate(results, 1):
        c = r.claim
        why = f": {c.retired}" if r.verdict == RETIRED else seeds_and_mde(r)
        if any(p.before_dev_split for p in r.parts if p.part.decisive):
            why += ", on runs from before the dev split"
        out += ["", f"## {i}. {c.text}", "", f"**Verdict: {r.verdict}{why}.**", "",
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
