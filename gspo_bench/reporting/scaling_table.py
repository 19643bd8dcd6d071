"""``leaderboard --fit`` and the report's compute-scaling section (h): ScaleRL's curve fitted per leaderboard
group and algorithm (the math: ``scaling.py``).

Per group (task, model, preset, config, then the ``--by`` values), over its FINISHED runs with a history of
the metric (``eval/pass1`` by default; ``eval/mean_at_<k>`` and any score in [0, 1] work alike), per
algorithm: each seed's evaluations against the compute spent (``scaling.seed_curve``; several runs of one
seed pool their points), the per-seed fits, the pooled fit with bootstrap intervals over seeds, and the
extrapolation check (fit on the first half of the steps, predict the final evaluation), beside the same check
by a straight line in log compute. What the data do not determine is printed as such: a parameter at an end
of its range is "not identified", with no interval; a fit with fewer compute points than parameters is not
printed at all, and its cell says so.

The x axis is chosen per group, so that every algorithm of a group is on the same one: generated tokens when
every run has a ``response/length_mean`` value at every step (what an MLflow store holds), else completions
generated (a runs table holds no length history). ``--fit-x`` forces one; a run without it is then left out,
with a note.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from gspo_bench import tables
from gspo_bench.config import ConfigError
from gspo_bench.reporting.frame import FINISHED, RunData
from gspo_bench.reporting.grouping import split_values, with_by
from gspo_bench.reporting.pairing import group_title
from gspo_bench.reporting.paired import seed_key
from gspo_bench.reporting.scaling import (A_MAX, COMPLETIONS, LENGTH_KEY, LEVEL, N_BOOT, ROUNDS_KEY, SPLIT, TOKENS,
                                          AlgoFit, CurveFit, Extrapolation, SeedCurve, compute_axis, extrapolate,
                                          fit_algorithm, seed_curve)

FIT_METRIC = "eval/pass1"
AUTO = "auto"
X_CHOICES = (AUTO, COMPLETIONS, TOKENS)
MEAN_AT = "eval/mean_at_"  # eval/mean_at_<k>: fitted by the report beside eval/pass1 when the runs logged it
# the histories a reader loads for the fits, beside the metric: the token axis and DAPO's rollout rounds
SCALING_HISTORIES = (LENGTH_KEY, ROUNDS_KEY)
BOOT_SEED = 0  # the bootstrap's numpy Generator seed: the same table on every reading
UNIT_TEXT = {COMPLETIONS: "completions generated", TOKENS: "generated tokens"}

NOTES = (
    "ScaleRL's curve (arXiv 2510.13786) per algorithm: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), C = rollout "
    "compute (completions generated = RL steps x prompts_per_step x group_size x rollout rounds, or generated "
    "tokens = the same weighted by each step's response/length_mean; evaluations not counted), R0 = the mean "
    "step-0 score (the warm start, fixed; fitted when no run has a step-0 value), A = asymptote in [R0, 1], "
    "B = efficiency exponent in (0, 10], C_mid = compute at half the gain A - R0, in (0, 100 x the largest C]; "
    "least squares over the evaluations with C > 0. Pooled = every seed's points together; [95 % CI] = "
    "percentile interval of the pooled refit over bootstrap resamples of the seeds (with replacement, seeded "
    "Generator); RMS = root mean square residual of the pooled fit; A per seed = mean ± sd of the per-seed fits' "
    "A where it is identified (those/seeds; the seeds whose A is at a bound are counted apart). A fit needs at "
    "least as many compute points (distinct evaluation steps with C > 0: seeds at one step are one point, "
    "whatever their C) as free parameters (3; 4 when R0 is fitted); with fewer it is not shown, and n/a says "
    "why. 'at bound x: not identified': the fit left the parameter at an end of its range (within 1/1000 of the "
    "range's width), so its value is that bound, not a measurement, and it has no interval (A at 1: the runs "
    "are still rising, and the curve has not bent). C_mid 'beyond' = past the last evaluation's C, where the "
    "curve is extrapolated. First half -> final: the pooled fit on the evaluations at steps <= half the final "
    "step (--fit-split: another share) predicts the final evaluation's mean over seeds; error = |predicted - "
    "observed|; line in log C: error = the same for the least-squares line R = a + b ln C fitted to the same "
    "points (C > 0), the baseline the curve's extra parameters have to beat. ScaleRL reads two A as "
    "different only beyond its ±0.02 band (the spread of A over 3 runs of one recipe).")


@dataclass(frozen=True)
class AlgoScaling:
    """One algorithm of a group: its seeds' curves, fits and extrapolation check."""

    algo: str
    curves: dict[str, SeedCurve]
    fit: AlgoFit
    extrapolation: Extrapolation | None


@dataclass(frozen=True)
class ScalingGroup:
    """One group's fits: ``key`` = (task, model, preset, config, *by values), the metric, the x unit, its
    algorithms (best pooled A first) and sentences on what was left out or is a lower bound."""

    key: tuple[str, ...]
    by: tuple[str, ...]
    metric: str
    unit: str
    algos: list[AlgoScaling]
    notes: tuple[str, ...] = ()
    split: float = SPLIT  # the extrapolation check's fraction of the steps

    @property
    def title(self) -> str:
        return group_title(self.key, self.by)


def histories(runs: list[RunData], metric: str) -> list[RunData]:
    """The FINISHED runs with at least one finite value of ``metric``'s history."""
    return [r for r in runs if r.status == FINISHED and any(math.isfinite(v) for _, v in r.history.get(metric, []))]


def check_metric(runs: list[RunData], metric: str, flag: str = "--fit") -> None:
    """ConfigError (one line) when no FINISHED run has a history of ``metric``, or one of its values lies outside
    [0, 1] (the fit bounds A by 1: it is for scores such as pass rates)."""
    have = histories(runs, metric)
    if not have:
        held = sorted({k for r in runs if r.status == FINISHED for k in r.history if k.startswith("eval/")})
        raise ConfigError(f"{flag} {metric!r}: no FINISHED run in the selection has a history of it (eval "
                          f"histories held: {', '.join(held) or 'none'})")
    values = [v for r in have for _, v in r.history[metric] if math.isfinite(v)]
    if min(values) < 0 or max(values) > A_MAX:
        raise ConfigError(f"{flag} {metric!r}: values from {min(values):.4g} to {max(values):.4g}; the fit bounds "
                          f"the asymptote by {A_MAX:g}, for scores in [0, 1] such as eval/pass1")


def fit_metrics(runs: list[RunData]) -> list[str]:
    """The metrics the report fits: ``eval/pass1``, then each ``eval/mean_at_<k>`` some FINISHED run logged, by k."""
    held = {k for r in runs if r.status == FINISHED for k in r.history}
    mean_at = sorted((k for k in held if k.startswith(MEAN_AT) and k[len(MEAN_AT):].isdigit()),
                     key=lambda k: int(k[len(MEAN_AT):]))
    return [m for m in (FIT_METRIC, *mean_at) if histories(runs, m)]


def _unit(runs: list[RunData], metric: str, x: str) -> str:
    """The x unit of a group: ``x`` unless it is auto; auto is tokens when every run can give them."""
    if x != AUTO:
        return x
    steps = [[s for s, _ in r.history[metric]] for r in runs]
    return TOKENS if all(compute_axis(r, st, TOKENS) is not None for r, st in zip(runs, steps)) else COMPLETIONS


def _dynamic(run: RunData) -> bool:
    """The run drew rollouts with DAPO's dynamic sampling (its resolved setting, else its configured one)."""
    return (run.params.get("resolved.rollout.dynamic_sampling") or run.params.get("rollout.dynamic_sampling")) == "True"


def _merged(curves: list[SeedCurve]) -> SeedCurve:
    """The curves of several runs of one seed as one, by step (its points pooled)."""
    if len(curves) == 1:
        return curves[0]
    order = np.argsort(np.concatenate([c.steps for c in curves]), kind="stable")
    return SeedCurve(*(np.concatenate([getattr(c, f) for c in curves])[order] for f in ("steps", "C", "R")))


def scaling_groups(runs: list[RunData], metric: str = FIT_METRIC, x: str = AUTO, by: tuple[str, ...] = (),
                   n_boot: int = N_BOOT, split: float = SPLIT, level: float = LEVEL,
                   seed: int = BOOT_SEED) -> list[ScalingGroup]:
    """The fits of every group of ``runs`` holding FINISHED runs with ``metric`` (see the module docstring);
    groups in sorted order. ``n_boot`` resamples per algorithm, from ``np.random.default_rng(seed)`` afresh
    for each (an algorithm's intervals do not depend on which others are in the group)."""
    if x not in X_CHOICES:
        raise ConfigError(f"--fit-x {x!r} is not one of: {', '.join(X_CHOICES)}")
    if not 0 < split < 1:
        raise ConfigError(f"--fit-split {split:g}: the share of the steps the check fits on must be in (0, 1)")
    if n_boot < 0:
        raise ConfigError(f"--fit-resamples {n_boot}: must be >= 0 (0: no intervals)")
    cells: dict[tuple, list[RunData]] = {}
    for r in histories(runs, metric):
        cells.setdefault((*r.group, *split_values(r.tags, by)), []).append(r)
    out = []
    for key in sorted(cells):
        mine = cells[key]
        unit = _unit(mine, metric, x)
        notes, algos = [], []
        for algo in sorted({r.algo for r in mine}):
            rs = [r for r in mine if r.algo == algo]
            per_seed: dict[str, list[SeedCurve]] = {}
            missing = 0
            for r in rs:
                c = seed_curve(r, metric, unit)
                if c is None:
                    missing += 1
                else:
                    per_seed.setdefault(r.seed, []).append(c)
            if missing:
                notes.append(f"{algo}: {missing} run(s) left out, without the {UNIT_TEXT[unit]} at every step "
                             + ("(no response/length_mean history)" if unit == TOKENS else
                                "(no rollout.prompts_per_step or rollout.group_size param)"))
            if any(_dynamic(r) and ROUNDS_KEY not in r.history for r in rs):
                notes.append(f"{algo}: dynamic sampling, and no {ROUNDS_KEY} history to count its extra rollout "
                             "rounds: its compute is counted at one round per step, a lower bound")
            if not per_seed:
                continue
            curves = {s: _merged(per_seed[s]) for s in sorted(per_seed, key=seed_key)}
            fit = fit_algorithm(curves, np.random.default_rng(seed), n_boot, level)
            algos.append(AlgoScaling(algo, curves, fit, extrapolate(curves, split)))
        # best pooled A first (to 4 decimals, so that A at its bound ties), then the steeper B; no fit last
        algos.sort(key=lambda a: (-round(a.fit.pooled.A, 4), -a.fit.pooled.B) if a.fit.pooled is not None else
                   (math.inf, math.inf))
        out.append(ScalingGroup(tuple(key), by, metric, unit, algos, tuple(notes), split))
    if x == TOKENS and not any(g.algos for g in out):
        raise ConfigError(f"--fit-x {TOKENS}: no FINISHED run has a {LENGTH_KEY} value at every step up to its "
                          f"evaluations (a runs table written before the fits holds none): use --fit-x {COMPLETIONS}")
    return out


# -- rendering ---------------------------------------------------------------------------------------------------
COLUMNS = ("algo", "seeds", "R0", "A [95 % CI]", "B [95 % CI]", "C_mid [95 % CI]", "RMS", "A per seed",
           "final: predicted from first half", "observed", "error", "line in log C: error")
CHECK_COLUMN = COLUMNS.index("final: predicted from first half")
# <name>_at_bound: the bound a parameter sits at (its value and interval cells are then empty: not identified)
CSV_FIELDS = ("task", "model", "preset", "config", "algo", "metric", "x", "seeds", "points", "compute_points",
              "r0", "r0_at_bound", "A", "A_low", "A_high", "A_at_bound", "B", "B_low", "B_high", "B_at_bound",
              "C_mid", "C_mid_low", "C_mid_high", "C_mid_at_bound", "rms", "resamples", "resamples_fitted",
              "seed_fits", "seed_fits_at_bound", "A_seed_mean", "A_seed_sd", "cut_step", "final_step",
              "check_points", "predicted_final", "observed_final", "abs_error", "line_predicted_final",
              "line_abs_error")


def compact(x: float) -> str:
    """A compute value in 3 significant digits with k / M / G (12.3k, 4.56M)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _max_c(a: AlgoScaling) -> float:
    return max(float(c.C.max()) for c in a.curves.values())


def _with_ci(value: float, ci: tuple[float, float] | None, fmt) -> str:
    return fmt(value) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")


def _estimate(fit: CurveFit, name: str, ci: dict, fmt, bound_fmt) -> str:
    """A parameter's cell: its value with its interval, or, at a bound, that it is not identified."""
    bound = fit.bound(name)
    if bound is not None:
        return f"at bound {bound_fmt(bound)}: not identified"
    return _with_ci(getattr(fit, name), ci.get(name), fmt)


def seed_asymptotes(f: AlgoFit) -> tuple[list[float], int]:
    """The per-seed fits' A where it is identified, and how many per-seed fits have A at a bound."""
    fitted = [p for p in f.per_seed if p is not None]
    return [p.A for p in fitted if p.bound("A") is None], sum(p.bound("A") is not None for p in fitted)


def _too_few(points: int, free: int, where: str = "") -> str:
    return f"n/a: {points} compute point{'s' if points != 1 else ''}{where} for {free} parameters"


def _cells(a: AlgoScaling) -> list[str]:
    f, e = a.fit, a.extrapolation
    seeds = f"{len(a.curves)}"
    known, bounded = seed_asymptotes(f)
    # the per-seed fits' identified A: mean ± sample sd (identified / seeds, those at a bound counted apart)
    spread = f" ± {statistics.stdev(known):.3f}" if len(known) > 1 else ""
    per_seed = ((f"{statistics.fmean(known):.3f}{spread}" if known else "n/a") + f" ({len(known)}/{len(f.seeds)}"
                + (f"; {bounded} at a bound" if bounded else "") + ")")
    check = ["-", "-", "-", "-"]
    if e is not None:
        where = f" at steps <= {e.cut_step:g}"
        if e.predicted is not None:
            predicted = f"{e.predicted:.3f} (steps <= {e.cut_step:g})"
        elif e.points < e.free:
            predicted = _too_few(e.points, e.free, where)
        else:
            predicted = f"n/a: the fit{where} failed"
        check = [predicted, f"{e.observed:.3f}", "-" if e.error is None else f"{e.error:.3f}",
                 "-" if e.line_error is None else f"{e.line_error:.3f}"]
    p = f.pooled
    if p is None:
        why = _too_few(f.points, f.free) if f.points < f.free else "n/a: the fit failed"
        return [a.algo, seeds, "-", why, "-", "-", "-", per_seed, *check]
    ci = f.intervals or {}
    r0 = f"at bound {p.bound('R0'):.3g}: not identified" if p.bound("R0") is not None else f"{p.R0:.3f}"
    a_text = _estimate(p, "A", ci, lambda v: f"{v:.3f}", lambda v: f"{v:.3g}")
    b_text = _estimate(p, "B", ci, lambda v: f"{v:.2f}", lambda v: f"{v:g}")
    c_text = _estimate(p, "C_mid", ci, compact, compact)
    c_text += " beyond" if p.bound("C_mid") is None and p.C_mid > _max_c(a) else ""
    return [a.algo, seeds, r0, a_text, b_text, c_text, f"{p.rms:.3f}", per_seed, *check]


def axis_text(g: ScalingGroup) -> str:
    """The group's x axis and its range: ``completions generated, C up to 20.5k``."""
    top = max((_max_c(a) for a in g.algos), default=0.0)
    return f"{UNIT_TEXT[g.unit]}, C up to {compact(top)}"


def heading(g: ScalingGroup) -> str:
    """The line above a group's table: its title, the metric, the x axis with its range and the resamples."""
    boot = max((a.fit.boot for a in g.algos), default=0)
    return (f"{g.title}: {g.metric} against {axis_text(g)}"
            + (f" (intervals from {boot} bootstrap resamples of the seeds)" if boot else ""))


def group_markdown(g: ScalingGroup) -> str:
    """One group's table (``COLUMNS``) and its notes, if any, as Markdown."""
    columns = list(COLUMNS)
    if g.split != SPLIT:
        columns[CHECK_COLUMN] = f"final: predicted from the first {g.split:g} of the steps"
    text = tables.markdown(columns, [_cells(a) for a in g.algos])
    return text + "".join(f"\nNote: {n}.\n" for n in g.notes)


def records(groups: list[ScalingGroup]) -> list[dict]:
    """One CSV record per group and algorithm, raw numbers (an empty cell: none)."""
    out = []
    for g in groups:
        task, model, preset, config, *vals = g.key
        for a in g.algos:
            f, p, e = a.fit, a.fit.pooled, a.extrapolation
            ci = f.intervals or {}
            known, bounded = seed_asymptotes(f)
            row = {"task": task, "model": model, "preset": preset, "config": config, **dict(zip(g.by, vals)),
                   "algo": a.algo, "metric": g.metric, "x": g.unit, "seeds": len(a.curves),
                   "points": sum(int((c.C > 0).sum()) for c in a.curves.values()), "compute_points": f.points,
                   "resamples": f.boot, "resamples_fitted": f.boot_ok, "seed_fits": len(known) + bounded,
                   "seed_fits_at_bound": bounded, "A_seed_mean": statistics.fmean(known) if known else None,
                   "A_seed_sd": statistics.stdev(known) if len(known) > 1 else None}
            if p is not None:
                row |= {"r0": p.R0, "A": p.A, "B": p.B, "C_mid": p.C_mid, "rms": p.rms}
                for name, (lo, hi) in ci.items():
                    row |= {f"{name}_low": lo, f"{name}_high": hi}
                # a parameter at a bound: the bound in its own column, no value (``fit_algorithm`` gave it no
                # interval)
                for name, bound in p.at_bound:
                    column = "r0" if name == "R0" else name
                    row |= {column: None, f"{column}_at_bound": bound}
            if e is not None:
                row |= {"cut_step": e.cut_step, "final_step": e.final_step, "check_points": e.points,
                        "predicted_final": e.predicted, "observed_final": e.observed, "abs_error": e.error,
                        "line_predicted_final": e.line_predicted, "line_abs_error": e.line_error}
            out.append(row)
    return out


def render_scaling(groups: list[ScalingGroup], fmt: str = "md") -> str:
    """``md``: per group a heading line and its table, then the definitions (``NOTES``); ``csv``: one table of
    every group (``records``), the ``--by`` tags as columns after config."""
    by = groups[0].by if groups else ()
    if fmt == "csv":
        return tables.csv_text(with_by(CSV_FIELDS, by), records(groups))
    if fmt != "md":
        raise ConfigError(f"format {fmt!r} is not one of: md, csv")
    parts = [f"### {heading(g)}\n\n{group_markdown(g)}" for g in groups]
    return "\n".join(parts) + f"\n{NOTES}\n"

