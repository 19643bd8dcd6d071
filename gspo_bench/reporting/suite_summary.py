"""``suite``'s outputs: each scenario's ``leaderboard.md``, and the cross-scenario ranking of ``summary.md``
and ``suite.json``.

Ranking (``rank_scenario``, pure): within one scenario each algorithm's
score is its mean final eval pass@1 (``eval/pass1`` at the last eval step)
over its FINISHED seeds, several runs of one seed counted by the rule of
``seeds.py``. Rank 1 = the highest mean; ties share the average of their places
(two algorithms tied for first both get 1.5). An algorithm with no FINISHED
seed gets no rank in that scenario.

Significantly best / worst: the top algorithm's per-seed paired difference
in final pass@1 to the runner-up (rank 2), over the seeds where both
FINISHED, and the bottom one's to the second-worst are one scenario's two
tests (paired t, n - 1 df, ``paired.paired_summary``, the same statistic as
``paired_table``), one family under the project's multiplicity rule: the top
one is *significantly best* when its Holm-adjusted p over the two is below
0.05 and its mean difference above 0, the bottom one *significantly worst*
likewise below 0 (with only two ranked algorithms the two tests are one, and
nothing is adjusted). Fewer than 2 pairs, or a tie: no test, never
significant. Beating the runner-up is enough to beat every lower-ranked
algorithm on the means, but it is one test, not one per rival.

Across scenarios (``rank_suite``, pure): per algorithm its rank in each
scenario, the mean of its ranks over the scenarios where it has one, the
number of scenarios where it was significantly best and worst, and its
collapse events (all its cell runs, every status). Rows are ordered by mean
rank (unranked last).
"""

from __future__ import annotations

import math
import statistics

import pandas as pd
from scipy.stats import rankdata

from gspo_bench import tables
from gspo_bench.reporting.leaderboard import NOTES, run_summary
from gspo_bench.reporting.frame import FINISHED, RunData, set_aside
from gspo_bench.reporting.paired import holm, pair_by_seed, paired_summary
from gspo_bench.reporting.paired_table import check_baseline, paired_groups, render_with_paired
from gspo_bench.reporting.seeds import per_seed, run_table
from gspo_bench.reporting.sequential import METHOD, versus_baseline
from gspo_bench.tracking.redact import redact

ALPHA = 0.05


# -- pure ranking ------------------------------------------------------------------------------------------------
def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else None


def _versus(finals: dict[str, dict[str, float]], a: str, b: str, alpha: float) -> dict:
    """Paired ``a - b`` over their common seeds: n, mean, 95 % interval, significant (interval excludes 0)."""
    common, diffs = pair_by_seed(finals[a], finals[b])
    st = paired_summary(diffs, alpha)
    return {"algo": a, "vs": b, "n": st.n, "seeds": common, "mean_diff": st.mean,
            "ci": list(st.ci) if st.ci else None, "significant": st.significant, "p": st.p}


def rank_scenario(finals: dict[str, dict[str, float]], alpha: float = ALPHA) -> dict:
    """Ranks and the best / worst tests of one scenario (see the module docstring).

    ``finals[algo][seed]`` = final pass@1 of that algorithm's FINISHED run(s) on that seed; an algorithm
    mapped to ``{}`` is listed, unranked. Returns ``means``, ``n`` (seeds per algorithm), ``ranks`` (None:
    unranked), ``order`` (ranked algorithms best first), ``best`` and ``worst`` (``_versus`` dicts with the
    result as ``significant``; None with fewer than two ranked algorithms).
    """
    finals = {a: {str(s): float(v) for s, v in d.items() if v is not None and math.isfinite(v)}
              for a, d in finals.items()}
    means = {a: _mean(d.values()) for a, d in finals.items()}
    order = sorted((a for a in finals if means[a] is not None), key=lambda a: (-means[a], a))
    ranks: dict[str, float | None] = {a: None for a in finals}
    # 1 = the best mean; ties share the average of their places
    for a, r in zip(order, rankdata([-means[a] for a in order], method="average")):
        ranks[a] = float(r)
    best = worst = None
    if len(order) >= 2:
        best = _versus(finals, order[0], order[1], alpha)
        worst = _versus(finals, order[-1], order[-2], alpha)
        # one family of two tests per scenario, Holm inside it; two ranked algorithms: one test, told twice
        ps = [best["p"], worst["p"]]
        best["p_holm"], worst["p_holm"] = ps if len(order) == 2 else holm(ps)
        for t, sign in ((best, 1), (worst, -1)):
            t["significant"] = bool(t["p_holm"] is not None and t["p_holm"] < alpha and sign * t["mean_diff"] > 0)
    return {"means": means, "n": {a: len(d) for a, d in finals.items()}, "ranks": ranks, "order": order,
            "best": best, "worst": worst}


def rank_suite(per_scenario: dict[str, dict[str, dict[str, float]]], collapses: dict[str, int] | None = None,
               alpha: float = ALPHA) -> dict:
    """``per_scenario[scenario][algo][seed]`` = final pass@1 -> ``{"scenarios": {name: rank_scenario(...)},
    "algorithms": [row, ...]}``, one row per algorithm (any algorithm in any scenario) with ``ranks``
    ({scenario: rank or None}), ``means``, ``mean_rank`` (over its ranked scenarios; None if none),
    ``ranked_in``, ``significantly_best``, ``significantly_worst`` and ``collapse_events``."""
    collapses = collapses or {}
    scen = {name: rank_scenario(f, alpha) for name, f in per_scenario.items()}
    algos = list(dict.fromkeys([a for f in per_scenario.values() for a in f] + list(collapses)))
    rows = []
    for a in algos:
        ranks = {name: s["ranks"].get(a) for name, s in scen.items()}
        got = [r for r in ranks.values() if r is not None]
        rows.append({
            "algo": a, "ranks": ranks, "means": {name: s["means"].get(a) for name, s in scen.items()},
            "mean_rank": statistics.fmean(got) if got else None, "ranked_in": len(got),
            "significantly_best": sum(bool(s["best"] and s["best"]["significant"] and s["best"]["algo"] == a)
                                      for s in scen.values()),
            "significantly_worst": sum(bool(s["worst"] and s["worst"]["significant"] and s["worst"]["algo"] == a)
                                       for s in scen.values()),
            "collapse_events": int(collapses.get(a, 0)),
        })
    rows.sort(key=lambda r: (r["mean_rank"] is None, r["mean_rank"] or 0.0, r["algo"]))
    return {"scenarios": scen, "algorithms": rows}


# -- from MLflow runs --------------------------------------------------------------------------------------------
def finals_of(runs: list[RunData], algos: list[str]) -> dict[str, dict[str, float]]:
    """{algo: {seed: final pass@1}} from FINISHED runs, several runs of one seed counted by the rule of
    ``seeds.py`` (a seed whose final pass@1 is missing is left out); every ``algos`` listed."""
    table = per_seed(run_table([r for r in runs if r.algo in algos],
                               lambda r: {"algo": r.algo, "final": run_summary(r)["final"]}), ["algo"], ["final"])
    finals = table["final"].dropna()
    return {a: {seed: final for (algo, seed), final in finals.items() if algo == a} for a in algos}


def collapses_of(runs: list[RunData]) -> dict[str, int]:
    """Collapse events per algorithm over all ``runs`` (FINISHED: as the leaderboard counts; others: their tag),
    the algorithms in the order their first run comes."""
    def events(r: RunData) -> int:
        if r.status == FINISHED:
            return run_summary(r)["collapses"]
        t = r.tags.get("collapse.count", "")
        return int(t) if t.isdigit() else 0

    table = pd.DataFrame({"algo": [r.algo for r in runs], "events": [events(r) for r in runs]}, dtype=object)
    return {a: int(n) for a, n in table.groupby("algo", sort=False)["events"].sum().items()}


def leaderboard_md(runs: list[RunData], scenario: str, experiment: str, baseline: str,
                   made_by: tuple[str, str] | None = None) -> str:
    """The scenario's leaderboard page: the leaderboard and the paired table vs ``baseline`` (as
    ``leaderboard --format md`` prints them), then the definitions. ``made_by``: (command, commit) stated on top."""
    from gspo_bench.reporting.leaderboard import summarise

    rows = summarise(runs)
    head = [f"# Leaderboard: scenario `{scenario}`", "", f"MLflow experiment `{experiment}`, the suite's cells only "
            f"(preset `{scenario}`, the suite's algorithms and seeds)."
            + (f" Made by `{redact(made_by[0])}` at commit `{made_by[1]}`." if made_by else ""), ""]
    if not rows:
        return "\n".join(head + ["No run.", ""])
    note = check_baseline(runs, baseline, strict=False)
    from gspo_bench.reporting.claim_specs import region_lookup

    body = render_with_paired(rows, "md", paired_groups(runs, baseline, regions=region_lookup(experiment)), baseline,
                              note)
    aside = set_aside(runs)
    return "\n".join(head) + "\n" + body + "\n" + (f"Note: {aside}.\n\n" if aside else "") + NOTES + "\n"


def sequential_json(per_scenario: dict[str, dict[str, dict[str, float]]], baseline: str, max_seeds: int,
                    seed_batch: int, rounds: int, alpha: float = ALPHA,
                    edges: dict[str, dict[str, float]] | None = None) -> dict:
    """``suite --until-decided``'s decisions, per scenario and algorithm against ``baseline``
    (``sequential.versus_baseline`` over the final pass@1 of every seed), with the method and the settings.
    ``edges``: per scenario, the edges claims registered for some of its comparisons (decided against them)."""
    scenarios = {}
    for name, finals in per_scenario.items():
        family = versus_baseline(finals, baseline, alpha, edges=(edges or {}).get(name))
        scenarios[name] = {a: {"n": d.stat.n, "mean_diff": d.stat.mean, "ci": list(d.stat.ci) if d.stat.ci else None,
                               "level": d.stat.level, "e": d.stat.e, "p": d.stat.p, "p_holm": d.p_holm,
                               "decision": d.decision, "edge": d.edge} for a, d in family.items()}
    return {"method": METHOD, "alpha": alpha, "baseline": baseline, "metric": "final eval pass@1",
            "max_seeds": max_seeds, "seed_batch": seed_batch, "rounds": rounds, "scenarios": scenarios}


def sequential_markdown(seq: dict, scenario_seeds: dict[str, list]) -> list[str]:
    """The summary's section on ``--until-decided``: every comparison's anytime-valid interval and decision."""
    md = ["## Until decided: sequential comparisons against " + f"`{seq['baseline']}`", "",
          f"Seeds were added in batches of {seq['seed_batch']} (up to {seq['max_seeds']} per scenario; "
          f"{seq['rounds']} round(s) run by this invocation) only to the algorithms whose paired difference in "
          f"{seq['metric']} to `{seq['baseline']}` was still undecided. Rule: {METHOD}. A confidence sequence "
          "holds the true mean "
          "difference at every number of seeds at once, so stopping at the first decision keeps the chance of "
          f"any false decision in a scenario's family at most {seq['alpha']:g}, which a t test repeated after "
          "each batch would not. *Decided* means the Holm-adjusted sequential p is at most "
          f"{seq['alpha']:g}: the difference is above 0 or below 0, or, for a comparison a claim registers a "
          "region for (marked with its edge), above or below that edge, as its other pages test it. The interval "
          "is the confidence sequence at "
          f"{seq['alpha']:g} / k for a family of k (it holds every comparison of the scenario at once); a tie "
          "(every difference equal) is no evidence. The best / worst marks above and the paired tables of "
          "`leaderboard.md` are fixed-n t tests: on seeds added until decided they are not at their nominal "
          "level; these decisions are.", ""]
    rows = []
    for name, family in seq["scenarios"].items():
        for a, d in family.items():
            diff = "-" if d["mean_diff"] is None else f"{100 * d['mean_diff']:+.1f}"
            ci = "whole line" if d["ci"] is None else f"[{100 * d['ci'][0]:+.1f}, {100 * d['ci'][1]:+.1f}]"
            edge = d.get("edge") or 0.0
            # a comparison a claim registered is decided against its region's edge, not 0: the cell says so
            against = f" (claimed edge {100 * edge:+g})" if edge else ""
            decision = f"**{d['decision']}**" if d["decision"] else "not decided"
            rows.append([f"`{name}`", f"`{a}`{against}", f"{d['n']}/{len(scenario_seeds.get(name, []))}", diff, ci,
                         f"{d['level']:.2g}", f"{d['p']:.2g}", f"{d['p_holm']:.2g}", decision])
    if not rows:
        return md + ["No comparison: no FINISHED run of the baseline.", ""]
    return md + [tables.markdown(("scenario", f"algo vs `{seq['baseline']}`", "pairs / seeds", "mean diff (pts)",
                                  "anytime-valid interval (pts)", "interval level", "sequential p", "Holm p",
                                  "decision"), rows)]


# -- the summary page --------------------------------------------------------------------------------------------
def _rank_cell(row: dict, name: str, n_seeds: int, ranking: dict) -> str:
    r, m, n = row["ranks"].get(name), row["means"].get(name), ranking["n"].get(row["algo"], 0)
    if r is None:
        return "-"
    cell = f"{r:g} ({m:.3f})"
    return cell + (f", {n}/{n_seeds} seeds" if n != n_seeds else "")


def _test_cell(t: dict | None, sign: str) -> str:
    if t is None:
        return "-"
    diff = "-" if t["mean_diff"] is None else f"{100 * t['mean_diff']:+.1f}"
    ci = f"[{100 * t['ci'][0]:+.1f}, {100 * t['ci'][1]:+.1f}]" if t["ci"] else "no interval"
    q = t.get("p_holm")
    holm_p = "" if q is None else f", Holm p {q:.2g}"
    return (f"`{t['algo']}` vs `{t['vs']}`: {diff} pts {ci}, n={t['n']}{holm_p}"
            + (f" **{sign}**" if t["significant"] else ""))


def limits_text(n_seeds: int, n_scenarios: int) -> list[str]:
    """What the ranks can and cannot support, for ``n_seeds`` seeds and ``n_scenarios`` scenarios."""
    if n_seeds < 2:
        power = f"With {n_seeds} seed there is no paired interval at all: nothing below is significant."
    else:
        from scipy.stats import t as student_t

        t = float(student_t.ppf(1 - ALPHA / 2, n_seeds - 1))
        power = (f"With n = {n_seeds} seeds a paired 95 % interval is mean ± {t:.2f} × sd / √{n_seeds} "
                 f"(t with {n_seeds - 1} df), so only differences several times the seed-to-seed spread are marked; "
                 "each scenario's `leaderboard.md` states its MDE, the smallest difference its seeds detect with "
                 "80 % power.")
    return [
        "## What these ranks can and cannot support", "",
        f"- A rank orders means over at most {n_seeds} seed(s); it ignores how far apart the means are. Neighbouring "
        "ranks are usually within seed noise: only the significance columns test a difference.", f"- {power}",
        "- *Significantly best* is one paired t test between the top two, chosen by the same numbers it tests "
        "(picking the winner first biases the difference upwards), with no correction over the "
        f"{2 * n_scenarios} best/worst tests of this page. Read the marks as a screen, not as findings.",
        f"- The mean rank describes these {n_scenarios} scenario(s) only: they are chosen stress settings, not a "
        "sample of tasks, and share the tiny models and tasks, so it says nothing about other tasks, models or "
        "scales, and one rank position in one scenario weighs as much as in any other.",
        "- Collapse events count detector firings (thresholds in `CollapseConfig`), over every cell run including "
        "failed ones; they are not weighed into the ranks.", ""]


def _seed_count(meta: dict, scenario: str) -> int:
    """The seeds of a scenario: the configured ones, or those ``--until-decided`` reached."""
    return len(meta["scenario_info"].get(scenario, {}).get("seeds", meta["seeds"]))


def summary_markdown(result: dict, meta: dict) -> str:
    """``summary.md`` from ``rank_suite``'s ``result`` and ``meta`` (command, commit, machine, times, plan)."""
    names = list(result["scenarios"])
    # with --until-decided the scenarios' seeds differ: the limits below are stated for the most of them
    n_seeds = max((_seed_count(meta, s) for s in names), default=len(meta["seeds"]))
    md = [f"# gspo_bench suite `{meta['prefix']}`", "",
          f"- command: `{meta['command']}`", f"- commit: `{meta['commit']}`", f"- machine: {meta['machine']}",
          f"- tracking URI: `{meta['tracking_uri']}`; experiments `{meta['prefix']}-<scenario>`",
          f"- scenarios: {', '.join(f'`{s}`' for s in names)}; algorithms: "
          f"{', '.join(f'`{a}`' for a in meta['algos'])}; seeds: {', '.join(map(str, meta['seeds']))}",
          f"- cells: {meta['cells']} ({meta['finished']} FINISHED; {meta['ran']} run by this invocation, "
          f"{meta['skipped']} already done)",
          f"- wall time of this invocation: {meta['wall_s']:.0f} s; training time of all FINISHED cells "
          f"(sum of `time/wall_s`): {meta['cell_s']:.0f} s",
          *([f"- cells run as Ray tasks, {meta['workers']} at a time (`--backend ray`)"]
            if meta.get("backend") == "ray" else []),
          *([f"- seeds per scenario, until decided: " + "; ".join(
              f"`{s}` {', '.join(map(str, meta['scenario_info'][s]['seeds']))}" for s in names)]
            if "sequential" in meta else []), "",
          "## Ranking across scenarios", "",
          "Cell: rank in that scenario by mean final eval pass@1 over seeds (1 = best, ties share the average "
          "place), the mean in brackets. Significantly best / worst: scenarios where its paired final-pass@1 "
          "difference to the runner-up / second-worst has a 95 % t interval excluding 0 (see below).", ""]
    cols = ["algo", *names, "mean rank", "significantly best", "significantly worst", "collapse events"]
    ranked = []
    for row in result["algorithms"]:
        mr = "-" if row["mean_rank"] is None else f"{row['mean_rank']:.2f}"
        if row["mean_rank"] is not None and row["ranked_in"] != len(names):
            mr += f" (over {row['ranked_in']})"
        ranked.append([f"`{row['algo']}`", *(_rank_cell(row, s, _seed_count(meta, s), result["scenarios"][s])
                                             for s in names),
                       mr, str(row["significantly_best"]), str(row["significantly_worst"]),
                       str(row["collapse_events"])])
    md += [tables.markdown(cols, ranked)]
    md += ["## Per scenario", "",
           "Paired differences in final pass@1 points (100 × pass@1), mean and 95 % t interval over the seeds "
           "where both FINISHED.", ""]
    scen = [[f"`{s}`", f"{info['task']} / {info['model']}", f"{info['finished']}/{info['cells']}",
             _test_cell(sc["best"], "significantly best"), _test_cell(sc["worst"], "significantly worst"),
             info["outputs"]]
            for s in names for info, sc in [(meta["scenario_info"][s], result["scenarios"][s])]]
    md += [tables.markdown(("scenario", "task / model", "cells FINISHED", "best vs runner-up",
                            "worst vs second-worst", "outputs"), scen)]
    if "sequential" in meta:
        md += sequential_markdown(meta["sequential"], {s: meta["scenario_info"][s]["seeds"] for s in names})
    md += [*limits_text(n_seeds, len(names))]
    return redact("\n".join(md))  # the tracking URI and command line, without their credentials

