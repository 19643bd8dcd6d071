"""Compute-scaling fits: the sigmoidal curve of ScaleRL (Khatri et al., "The Art of Scaling Reinforcement
Learning Compute for LLMs", https://arxiv.org/abs/2510.13786) fitted to a run's evaluations against the compute
spent on rollouts.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

C is compute, R the score at C, R0 the score before RL (C = 0), A the asymptote (the score the method tends
to with unlimited compute), B the efficiency exponent (how steeply it climbs there) and C_mid the compute at
which half the gain A - R0 is reached. Everything here is pure: arrays (or ``RunData``) in, numbers out.

- ``scaling_curve``: the formula; ``fit_curve``: one fit (scipy's ``curve_fit`` with bounds), None when it
  fails or has fewer distinct compute values than free parameters; a parameter the fit leaves at an end of
  its range is marked (``CurveFit.at_bound``): the data do not identify it, and no interval is given for it.
- ``fit_algorithm``: an algorithm's per-seed fits, its pooled fit (every seed's points together) and bootstrap
  intervals for A, B and C_mid over seeds (seeds resampled with replacement, the pooled curve refitted). The
  pooled fit counts compute points as evaluation steps (``compute_points``): on the token axis every seed
  has its own C at a step, and 8 seeds at 2 steps are still 2 points of the curve, not 16.
- ``extrapolate``: the pooled fit on the evaluations of the first half of the steps, its prediction of the
  final evaluation against the observed one, beside the same prediction by a straight line in log C fitted
  to the same points (``fit_log_line``): the baseline the curve's extra parameters have to beat.
- ``compute_axis``: the compute of each evaluation of a run, in completions generated or generated tokens.

How the fit departs from the paper: ScaleRL's x is GPU-hours on one fixed cluster; here it is the generation
compute a run logs (completions, or tokens), which is machine-independent and is what the algorithms
spend differently. The paper fits the curve after a burn-in (it leaves out the first ~1.5k GPU-hours); here
every evaluation counts and R0 is the measured warm start, because these runs are short (5 evaluations on the
default preset) and the burn-in would leave nothing to fit. The paper's ±0.02 band on A (the spread of A it
measured over 3 runs of one recipe) is its noise floor; here the bootstrap over seeds gives each A its own
interval.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from gspo_bench.reporting.frame import RunData

B_BOUNDS = (1e-2, 10.0)  # B in (0, 10]: the lower end is 0.01 (a curve flatter than that gains nothing in range)
C_MID_SPAN = (1e-3, 100.0)  # C_mid in (0, 100 x max C]: from 1/1000 of the smallest C > 0 to 100 x the largest
A_MAX = 1.0  # A's upper bound for scores in [0, 1] (pass rates, mean rewards)
# a parameter within this share of its range's width (in the coordinates the fit moves: A's share of the gain,
# B, log C_mid, R0) from an end of the range is at that bound: the optimiser stopped there, the data did not
BOUND_TOL = 1e-3
B_STARTS = (0.5, 1.0, 2.0, 4.0)  # the multi-start grid of a fit: B, times C_mid at these quantiles of C
C_MID_STARTS = (0.25, 0.5, 1.0)
N_BOOT = 1000
LEVEL = 0.95
SPLIT = 0.5  # extrapolation: fit on the evaluations at steps <= SPLIT x the final step
COMPLETIONS, TOKENS = "completions", "tokens"  # the compute axes
# the histories ``compute_axis`` reads, beside the run params rollout.prompts_per_step and rollout.group_size
LENGTH_KEY = "response/length_mean"  # mean completion length (tokens) of the step's kept rollout
ROUNDS_KEY = "dynamic/gen_batches"  # DAPO's dynamic sampling: rollout rounds drawn at the step


@dataclass(frozen=True)
class CurveFit:
    """One fitted curve: its parameters, the RMS of its residuals over the points fitted (C > 0) and how many
    there were. ``r0_fixed``: R0 was the mean score at C = 0 (the warm start), not a fitted parameter.
    ``at_bound``: (name, bound) of each parameter the fit left at an end of its range (``BOUND_TOL``): its
    value is the bound, not a measurement (A at 1: the runs have not bent yet)."""

    A: float
    B: float
    C_mid: float
    R0: float
    rms: float
    n: int
    r0_fixed: bool = True
    at_bound: tuple[tuple[str, float], ...] = ()

    def predict(self, C) -> np.ndarray:
        """R(C) of this curve at ``C`` (an array or a number)."""
        return scaling_curve(C, self.A, self.B, self.C_mid, self.R0)

    def bound(self, name: str) -> float | None:
        """The bound parameter ``name`` sits at (then the data do not identify it), else None."""
        return dict(self.at_bound).get(name)


@dataclass(frozen=True)
class SeedCurve:
    """One seed's evaluations of a metric: RL step, compute C at that step and the score R, by step."""

    steps: np.ndarray
    C: np.ndarray
    R: np.ndarray


@dataclass(frozen=True)
class AlgoFit:
    """An algorithm's fits: one per seed (None where it failed), the pooled fit, and for each of A, B and
    C_mid the bootstrap percentile interval over seeds (None with one seed, or when fewer than half the
    resamples fitted; a parameter at its bound in the pooled fit has none). ``boot_ok``: the resamples that
    fitted, of ``boot``. ``points``: the seeds' distinct compute points (``compute_points``), ``free``: the
    curve's free parameters; the pooled fit is None when ``points < free``."""

    seeds: tuple[str, ...]
    per_seed: tuple[CurveFit | None, ...]
    pooled: CurveFit | None
    intervals: dict[str, tuple[float, float]] | None
    boot: int
    boot_ok: int
    points: int = 0
    free: int = 3


@dataclass(frozen=True)
class Extrapolation:
    """The pooled fit on the evaluations at steps <= ``cut_step`` and its prediction of the final evaluation
    (step ``final_step``), both as means over seeds: ``predicted`` (of each seed's R(C_final)), ``observed``
    (of each seed's final score). ``points``: the distinct compute points at steps <= ``cut_step``, ``free``:
    the curve's free parameters; ``fit`` and ``predicted`` are None when ``points < free`` or the fit failed.
    ``line`` (intercept, slope) and ``line_predicted``: the same for a straight line in log C fitted to the
    same points (``fit_log_line``; None with fewer than 2 compute points)."""

    cut_step: float
    final_step: int
    observed: float
    points: int
    free: int
    fit: CurveFit | None
    predicted: float | None
    line: tuple[float, float] | None = None
    line_predicted: float | None = None

    @property
    def error(self) -> float | None:
        # |predicted - observed|
        return None if self.predicted is None else abs(self.predicted - self.observed)

    @property
    def line_error(self) -> float | None:
        # |line_predicted - observed|
        return None if self.line_predicted is None else abs(self.line_predicted - self.observed)


def scaling_curve(C, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    C = np.asarray(C, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        # (C_mid / C)^B = exp(B (log C_mid - log C)), clipped so that C -> 0 gives +inf, not an overflow warning
        z = np.minimum(B * (math.log(C_mid) - np.log(C)), 700.0)
        return R0 + (A - R0) / (1.0 + np.exp(z))


def _model(r0: float | None, a_max: float):
    """The function ``curve_fit`` fits and its Jacobian, over theta = (g, B, log C_mid[, R0]) with
    A = R0 + g (a_max - R0), so that A in [R0, a_max] is a box bound on g in [0, 1] whether R0 is fixed or
    fitted."""
    def parts(C, g, B, log_c_mid, free_r0):
        R0 = r0 if r0 is not None else free_r0[0]
        # u = log C_mid - log C, z = B u, s = 1 / (1 + e^z): R = R0 + g (a_max - R0) s
        u = log_c_mid - np.log(C)
        s = 1.0 / (1.0 + np.exp(np.minimum(B * u, 700.0)))
        return R0, u, s

    def f(C, g, B, log_c_mid, *free_r0):
        R0, _, s = parts(C, g, B, log_c_mid, free_r0)
        return R0 + g * (a_max - R0) * s

    def jac(C, g, B, log_c_mid, *free_r0):
        R0, u, s = parts(C, g, B, log_c_mid, free_r0)
        gain, ds = a_max - R0, -s * (1.0 - s)  # ds/dz = -s (1 - s)
        # dR/dg = (a_max - R0) s; dR/dB = g (a_max - R0) ds u; dR/dlog C_mid = g (a_max - R0) ds B;
        # dR/dR0 = 1 - g s (R0 fitted)
        cols = [gain * s, g * gain * ds * u, g * gain * ds * B] + ([] if r0 is not None else [1.0 - g * s])
        return np.stack(cols, axis=-1)

    return f, jac


def fit_curve(C, R, a_max: float = A_MAX, start: CurveFit | None = None) -> CurveFit | None:
    """The curve fitted to the points (C, R): R0 fixed to the mean R at C = 0 when there is such a point (the
    warm start), else fitted in [0, a_max]; A in [R0, a_max], B in [0.01, 10], C_mid in [1e-3 x the smallest
    C > 0, 100 x the largest C], by least squares over the points with C > 0.

    None (no exception) when there are fewer distinct C > 0 values than free parameters (3 with R0 fixed,
    4 without: with fewer the curve is not determined, whatever the number of seeds at each C), when R0 leaves
    no room below ``a_max``, or when ``curve_fit`` fails or gives a non-finite result. ``start``: fit from this
    curve's parameters only (the bootstrap's refits); without it, from a grid of starts (``B_STARTS`` x
    ``C_MID_STARTS``), keeping the smallest residual. Points with C < 0 or a non-finite value are left out."""
    from scipy.optimize import OptimizeWarning, curve_fit  # on use: every CLI command imports this module

    C, R = np.asarray(C, dtype=float).ravel(), np.asarray(R, dtype=float).ravel()
    keep = np.isfinite(C) & np.isfinite(R) & (C >= 0)
    C, R = C[keep], R[keep]
    at_zero = C == 0
    x, y = C[~at_zero], R[~at_zero]
    r0 = float(R[at_zero].mean()) if at_zero.any() else None
    free = 3 if r0 is not None else 4
    if len(np.unique(x)) < free or (r0 is not None and not r0 < a_max):
        return None
    lo_c, hi_c = math.log(C_MID_SPAN[0] * x.min()), math.log(C_MID_SPAN[1] * x.max())
    lower = [0.0, B_BOUNDS[0], lo_c] + ([] if r0 is not None else [0.0])
    upper = [1.0, B_BOUNDS[1], hi_c] + ([] if r0 is not None else [a_max])
    model, jac = _model(r0, a_max)

    def inside(theta: list[float]) -> list[float]:
        # a start strictly inside the box (curve_fit refuses one on or past a bound)
        return [min(max(t, lo + 1e-9 * (hi - lo)), hi - 1e-9 * (hi - lo)) for t, lo, hi in zip(theta, lower, upper)]

    if start is not None:
        gain = (start.A - start.R0) / (a_max - start.R0) if a_max > start.R0 else 0.5
        starts = [[gain, start.B, math.log(start.C_mid)] + ([] if r0 is not None else [start.R0])]
    else:
        base = r0 if r0 is not None else float(y.min())
        top = float(np.clip(y.max(), base, a_max))
        gain = (top - base) / (a_max - base) if a_max > base else 0.5
        starts = [[gain, b, math.log(float(np.quantile(x, q)))] + ([] if r0 is not None else [base])
                  for b in B_STARTS for q in C_MID_STARTS]
    best, best_sse = None, math.inf
    for theta0 in starts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)  # no covariance: the fit itself still stands
                theta, _ = curve_fit(model, x, y, p0=inside(theta0), bounds=(lower, upper), jac=jac,
                                     max_nfev=2000)
        except (RuntimeError, ValueError):  # did not converge, or a non-finite residual on the way
            continue
        resid = y - model(x, *theta)
        sse = float(resid @ resid)
        if np.all(np.isfinite(theta)) and math.isfinite(sse) and sse < best_sse:
            best, best_sse = theta, sse
    if best is None:
        return None
    g, B, log_c_mid, *rest = (float(t) for t in best)
    R0 = r0 if r0 is not None else rest[0]
    # each parameter's range in its own units: g in [0, 1] is A in [R0, a_max]; log C_mid's ends are C_mid's
    ends = [("A", (R0, a_max)), ("B", B_BOUNDS), ("C_mid", (math.exp(lo_c), math.exp(hi_c)))]
    ends += [] if r0 is not None else [("R0", (0.0, a_max))]
    at_bound = tuple((name, span[side]) for (name, span), side in zip(ends, bound_sides(best, lower, upper))
                     if side is not None)
    # A = R0 + g (a_max - R0); RMS = sqrt(mean((R - R(C))^2)) over the points fitted
    return CurveFit(A=R0 + g * (a_max - R0), B=B, C_mid=math.exp(log_c_mid), R0=R0,
                    rms=math.sqrt(best_sse / len(y)), n=len(y), r0_fixed=r0 is not None, at_bound=at_bound)


def bound_sides(theta, lower, upper, tol: float = BOUND_TOL) -> list[int | None]:
    """Per parameter, which end of its range [lower, upper] it sits at: 0 (lower) or 1 (upper) when within
    ``tol`` x (upper - lower) of that end, else None."""
    out: list[int | None] = []
    for t, lo, hi in zip(theta, lower, upper):
        # at an end: |t - end| <= tol (hi - lo)
        near = tol * (hi - lo)
        out.append(0 if t - lo <= near else 1 if hi - t <= near else None)
    return out


def fit_log_line(C, R) -> tuple[float, float] | None:
    """The straight line in log compute, R = a + b ln C, fitted by least squares to the points with C > 0
    (finite values): (a, b). None with fewer than 2 distinct C > 0. The baseline of the extrapolation check:
    two parameters and no asymptote, so a curve that predicts no better has not earned its extra ones."""
    C, R = np.asarray(C, dtype=float).ravel(), np.asarray(R, dtype=float).ravel()
    keep = np.isfinite(C) & np.isfinite(R) & (C > 0)
    x, y = np.log(C[keep]), R[keep]
    if len(np.unique(x)) < 2:
        return None
    # b = sum((x - mean x)(R - mean R)) / sum((x - mean x)^2), a = mean R - b mean x, x = ln C
    dx = x - x.mean()
    b = float(dx @ (y - y.mean()) / (dx @ dx))
    return float(y.mean() - b * x.mean()), b


def log_line(C, a: float, b: float) -> np.ndarray:
    """R = a + b ln C at ``C`` (C > 0)."""
    return a + b * np.log(np.asarray(C, dtype=float))


def pooled_points(curves: list[SeedCurve]) -> tuple[np.ndarray, np.ndarray]:
    """Every seed's (C, R) points together (a seed drawn twice counts twice)."""
    if not curves:
        return np.empty(0), np.empty(0)
    return np.concatenate([c.C for c in curves]), np.concatenate([c.R for c in curves])


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central ``level`` percentile interval of ``values``: its (1 - level) / 2 and (1 + level) / 2 quantiles."""
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def compute_points(curves: list[SeedCurve]) -> int:
    """The distinct compute points of seeds pooled: their distinct evaluation steps with C > 0. On the token
    axis each seed has its own C at a step, and seeds evaluated at the same 2 steps spread around 2 places of
    the curve: 2 points, however many distinct C values they make."""
    return len({int(s) for c in curves for s in c.steps[c.C > 0]})


def free_parameters(curves: list[SeedCurve]) -> int:
    """The curve's free parameters on these seeds' points: A, B, C_mid, and R0 when no point is at C = 0."""
    return 3 if any((c.C == 0).any() for c in curves) else 4


def fit_pooled(curves: list[SeedCurve], a_max: float = A_MAX, start: CurveFit | None = None) -> CurveFit | None:
    """``fit_curve`` on every seed's points together; None when they hold fewer compute points
    (``compute_points``) than the curve has free parameters."""
    if compute_points(curves) < free_parameters(curves):
        return None
    return fit_curve(*pooled_points(curves), a_max=a_max, start=start)


def bootstrap(curves: list[SeedCurve], rng: np.random.Generator, n_boot: int = N_BOOT,
              start: CurveFit | None = None, a_max: float = A_MAX) -> np.ndarray:
    """(A, B, C_mid) of the pooled curve refitted to ``n_boot`` resamples of the seeds (k seeds drawn with
    replacement from the k, each bringing all its points), one row per resample that fitted; each refit
    starts from ``start`` (the pooled fit) when given."""
    k = len(curves)
    draws = rng.integers(0, k, size=(n_boot, k))
    out = []
    for draw in draws:
        fit = fit_pooled([curves[i] for i in draw], a_max=a_max, start=start)
        if fit is not None:
            out.append((fit.A, fit.B, fit.C_mid))
    return np.array(out, dtype=float).reshape(-1, 3)


def fit_algorithm(curves: dict[str, SeedCurve], rng: np.random.Generator, n_boot: int = N_BOOT,
                  level: float = LEVEL, a_max: float = A_MAX) -> AlgoFit:
    """Per-seed fits, the pooled fit and the bootstrap intervals (``bootstrap``; ``level`` percentile) of one
    algorithm's seeds (``curves``: seed -> its evaluations). The pooled fit tries the grid of starts; the
    per-seed fits and the resamples' start from it. With one seed, or no pooled fit, no intervals; a
    parameter at its bound in the pooled fit gets none either (the resamples pile up on the bound, and an
    interval such as [1.000, 1.000] would read as a measurement)."""
    seeds = tuple(curves)
    every = list(curves.values())
    pooled = fit_pooled(every, a_max=a_max)
    # each seed's fit starts from the pooled curve (a seed's few points are that curve plus noise)
    per_seed = tuple(fit_curve(curves[s].C, curves[s].R, a_max=a_max, start=pooled) for s in seeds)
    intervals, ok = None, 0
    if pooled is not None and len(seeds) > 1 and n_boot > 0:
        draws = bootstrap(every, rng, n_boot, start=pooled, a_max=a_max)
        ok = len(draws)
        if ok >= n_boot / 2:  # intervals from a minority of the resamples would describe only the easy ones
            intervals = {name: percentile_interval(draws[:, j], level) for j, name in enumerate(("A", "B", "C_mid"))
                         if pooled.bound(name) is None}
    return AlgoFit(seeds, per_seed, pooled, intervals, n_boot if len(seeds) > 1 and pooled is not None else 0, ok,
                   compute_points(every), free_parameters(every))


def extrapolate(curves: dict[str, SeedCurve], split: float = SPLIT, a_max: float = A_MAX) -> Extrapolation | None:
    """The pooled fit on each seed's evaluations at steps <= ``split`` x its final step, and its prediction of
    the final evaluation: the mean over seeds of R(C at the final step) against the mean observed final score;
    beside it the same prediction by a straight line in log C fitted to the same points (C > 0). The curve's
    fit and prediction are None when it fails (``fit_pooled``: e.g. the first half holds fewer compute points
    than parameters), the line's with fewer than 2 compute points. None when no seed has an evaluation."""
    finals = [c for c in curves.values() if len(c.steps)]
    if not finals:
        return None
    early = [SeedCurve(c.steps[m], c.C[m], c.R[m]) for c in finals for m in [c.steps <= split * c.steps.max()]]
    points = compute_points(early)
    fit = fit_pooled(early, a_max=a_max)
    line = fit_log_line(*pooled_points(early)) if points >= 2 else None
    # per seed, its evaluation(s) at its last step (several when runs of one seed are pooled):
    # predicted = mean_s R(C_final,s); observed = mean_s R_final,s
    at_end = [c.steps == c.steps.max() for c in finals]
    observed = float(np.mean([c.R[m].mean() for c, m in zip(finals, at_end)]))
    predicted = None if fit is None else float(np.mean([fit.predict(c.C[m]).mean() for c, m in zip(finals, at_end)]))
    # the line's: mean_s (a + b ln C_final,s)
    line_predicted = None if line is None else float(np.mean([log_line(c.C[m], *line).mean()
                                                              for c, m in zip(finals, at_end)]))
    last = max(int(c.steps.max()) for c in finals)
    return Extrapolation(split * last, last, observed, points, free_parameters(early), fit, predicted, line,
                         line_predicted)


# -- compute per evaluation -------------------------------------------------------------------------------------
def _param(run: RunData, name: str) -> float | None:
    """A run param by its resolved name, else its configured one (``rollout.prompts_per_step``)."""
    for key in (f"resolved.{name}", name):
        try:
            return float(run.params[key])
        except (KeyError, ValueError):
            continue
    return None


def compute_axis(run: RunData, steps, unit: str = COMPLETIONS) -> np.ndarray | None:
    """The rollout compute a run had spent at each of ``steps`` (RL steps; an evaluation at step s follows
    RL steps 1..s), in ``unit``:

    - ``completions``: sum over RL steps 1..s of prompts_per_step x group_size x rounds(step), rounds being
      the ``dynamic/gen_batches`` history where the run logged it (DAPO's dynamic sampling draws a whole
      rollout per round), else 1 (so a DAPO run without that history is counted at one round per step,
      a lower bound);
    - ``tokens``: the same sum with each step's completions weighted by its ``response/length_mean`` (mean
      tokens of a completion at that step): generated tokens.

    None when the run lacks ``rollout.prompts_per_step`` or ``rollout.group_size``, or (tokens) a
    ``response/length_mean`` value at some step up to the last of ``steps``. Evaluations do not count:
    every algorithm spends the same on them."""
    per_step, group = _param(run, "rollout.prompts_per_step"), _param(run, "rollout.group_size")
    steps = np.asarray(steps, dtype=int)
    if per_step is None or group is None:
        return None
    last = int(steps.max()) if len(steps) else 0
    rounds = dict(run.history.get(ROUNDS_KEY, []))
    # completions drawn at RL step s = prompts_per_step x group_size x rounds(s), steps 1..last
    drawn = np.array([per_step * group * rounds.get(s, 1.0) for s in range(1, last + 1)], dtype=float)
    if unit == TOKENS:
        length = dict(run.history.get(LENGTH_KEY, []))
        if any(s not in length for s in range(1, last + 1)):
            return None
        # tokens drawn at RL step s = completions(s) x mean length(s)
        drawn = drawn * np.array([length[s] for s in range(1, last + 1)], dtype=float)
    elif unit != COMPLETIONS:
        raise ValueError(f"compute unit {unit!r} is not one of: {COMPLETIONS}, {TOKENS}")
    # C(s) = sum_{s' = 1..s} drawn(s'); C(0) = 0
    total = np.concatenate([[0.0], np.cumsum(drawn)])
    return total[np.clip(steps, 0, last)]


def seed_curve(run: RunData, metric: str, unit: str = COMPLETIONS) -> SeedCurve | None:
    """A run's evaluations of ``metric`` (finite values) with their compute (``compute_axis``); None when
    it has none or its compute cannot be told."""
    points = [(s, v) for s, v in run.history.get(metric, []) if s >= 0 and math.isfinite(v)]
    if not points:
        return None
    steps = np.array([s for s, _ in points], dtype=int)
    C = compute_axis(run, steps, unit)
    if C is None:
        return None
    return SeedCurve(steps, C, np.array([v for _, v in points], dtype=float))
