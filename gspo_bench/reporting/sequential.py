"""Anytime-valid paired comparisons: a t confidence sequence for the mean paired difference, valid under any
stopping rule (``suite --until-decided``).

Why: adding seeds only to the comparisons that are still undecided, and testing again after each batch, is
optional stopping. The fixed-n paired t test of ``paired.py`` is then no longer a 5 % test: with a look after
every second seed from 3 to 20 seeds, a true difference of 0 is "decided" in about a fifth of the studies
(``tests/test_sequential.py`` measures it). A confidence sequence holds the true mean at *every* number of
seeds at once, with probability at least 1 - alpha, so whatever rule picks when to stop (including "stop at
the first decision") its decision keeps the error rate at alpha.

The method: the scale-invariant normal-mixture likelihood ratio for the one-sample t problem, the "t
confidence sequence" of Lai (1976), "On confidence sequences", Annals of Statistics 4(2), 265-280, in the form
that mixes the standardised effect ``delta = mu / sigma`` over a normal prior, ``delta ~ N(0, g)``, instead of
Lai's flat mixture: Wang and Ramdas (2023), "Anytime-valid t-tests and confidence sequences for Gaussian means
with unknown variance", arXiv:2310.03722, whose version is a test martingale. For the
differences ``d_1, d_2, ...`` (i.i.d. normal, unknown mean and sd) and a candidate mean ``mu0``, with ``t_n``
the usual t statistic of the first ``n`` differences against ``mu0`` and ``nu = n - 1``,

    E_n(mu0) = (1 + n g)^(-1/2) * [(1 + t_n^2 / nu) / (1 + t_n^2 / (nu (1 + n g)))]^(n / 2)

is the likelihood ratio of the scale-free part of the data (``d / |d_1|``: what is left once the unknown sd
is factored out, which is why a right-Haar mixture over sigma gives it) between "delta ~ N(0, g)" and
"mean = mu0". It is the Bayes factor of the normal-prior t test (Rouder et al. 2009, fixed g) and, under
mean = mu0, a nonnegative martingale with mean 1, whatever the sd. Ville's inequality then gives
P(E_n(mu0) >= 1/alpha for some n) <= alpha: so

- the **interval** at n seeds, ``{mu0 : E_n(mu0) < 1/alpha}``, is ``mean -/+ c_n * sd / sqrt(n)`` (``multiplier``
  solves for c_n in closed form), and these intervals hold the true mean at every n at once with probability
  >= 1 - alpha; their intersection over n is one too (``sequential_summary`` reports the intersection);
- the **sequential p value** ``p_n = min(1, 1 / max_{m <= n} E_m(0))`` is below alpha at any time with
  probability <= alpha when the true mean is 0, at whatever time one stops.

``g`` (``MIXTURE_G``, 4: a prior sd of 2 on delta) sets where the intervals are tightest; it is fixed before
any data, as it must be. At alpha 0.05 the multiplier c_n / sqrt(n) is 3.61 at 4 seeds, 2.40 at 5, 1.49 at 8,
1.11 at 12 and 0.81 at 20 (the fixed-n t interval's: 1.59, 1.24, 0.84, 0.64, 0.47): the price of being
allowed to look at every seed. Below ``r^((n-1)/2) > 1/alpha``, r = 1 + n g, the interval is the whole line
(no decision at all is possible yet): at alpha 0.05, under 4 seeds.

A family (``decide_family``): k comparisons (every algorithm against the baseline in one scenario) are decided
by Holm's method over their sequential p values: each p is valid at any stopping time, as Holm needs, so the
chance of any false decision in the family stays at most alpha whatever the stopping rule (including one that
depends on the other comparisons). The interval shown beside each comparison is the confidence sequence at
alpha / k (Bonferroni over the family): together they hold every true mean at every n with probability
>= 1 - alpha. Holm decides at least what those intervals decide, sometimes more (after the first decision it
tests the rest at alpha / (k - 1), ...).

Assumptions, as for the fixed-n t test: the differences of one comparison are independent and roughly normal
(symmetric, no outliers), taken in seed order. A prefix where every difference is equal (a tie, common with
few eval prompts: pass@1 moves in steps) has no spread to scale by and counts as no evidence (E = 1, the
whole line), so a tie stays undecided rather than being decided by its point.

Pure functions (numpy and math); the suite's planner (``suite/until_decided.py``) and its summary
call them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from gspo_bench.reporting.paired import holm, pair_by_seed

MIXTURE_G = 4.0  # the prior variance g of the standardised effect mu / sigma (see the module docstring)
ABOVE, BELOW = "above 0", "below 0"  # a decided comparison's side; None: not decided
METHOD = (f"anytime-valid t confidence sequence (Lai 1976; normal mixture over mu / sigma with g = {MIXTURE_G:g}, "
          "Wang & Ramdas 2023), Holm over the sequential p values")


@dataclass(frozen=True)
class SequentialStat:
    """One comparison after ``n`` paired differences (in seed order)."""

    n: int
    mean: float | None
    sd: float | None  # sample sd, ddof 1
    e: float  # max over the prefixes m <= n of E_m(0): the evidence against a true mean of 0
    p: float  # sequential p value min(1, 1 / e), valid at any stopping time
    side: int  # sign of the mean at the prefix where e was reached (+1, -1; 0 when e is 1, no evidence)
    level: float  # the level of ``ci``
    ci: tuple[float, float] | None  # the confidence sequence at ``level``, intersected over prefixes; None: whole line


@dataclass(frozen=True)
class FamilyDecision:
    """One comparison of a family: its statistic (interval at alpha / k), Holm-adjusted p and decision."""

    stat: SequentialStat
    p_holm: float
    decision: str | None  # ABOVE, BELOW, or None (not decided)
    edge: float = 0.0  # what the decision is above or below: 0, or the edge of a region a claim registered


def _check(alpha: float, g: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must lie in (0, 1)")
    if not (g > 0 and math.isfinite(g)):
        raise ValueError(f"g={g} must be a positive number")


def log_e(t: float, n: int, g: float = MIXTURE_G) -> float:
    """log E_n for a t statistic ``t`` of ``n`` >= 2 differences (module docstring); t may be +-inf."""
    if n < 2:
        raise ValueError(f"n={n}: the mixture needs 2 or more differences")
    nu, r = n - 1, 1 + n * g
    if math.isinf(t):  # the limit t^2 -> inf: (1/2)(n - 1) log r
        return 0.5 * (n - 1) * math.log(r)
    # log E_n = -(1/2) log(1 + n g) + (n/2) [log(1 + t^2/nu) - log(1 + t^2 / (nu (1 + n g)))]
    return -0.5 * math.log(r) + 0.5 * n * (math.log1p(t * t / nu) - math.log1p(t * t / (nu * r)))


def multiplier(n: int, alpha: float, g: float = MIXTURE_G) -> float | None:
    """c_n: the confidence sequence at n differences is mean -/+ c_n sd / sqrt(n); None when it is the whole line
    (n < 2, or r^((n-1)/2) <= 1/alpha with r = 1 + n g: even t = inf gives E_n below 1/alpha)."""
    _check(alpha, g)
    if n < 2:
        return None
    r = 1 + n * g
    # E_n = 1/alpha  <=>  (1 + u) / (1 + u / r) = K,  u = t^2 / nu,  K = (r / alpha^2)^(1/n)
    k = math.exp((math.log(r) - 2 * math.log(alpha)) / n)
    if k >= r:
        return None
    # u = (K - 1) / (1 - K / r);  c_n = sqrt(nu u)
    return math.sqrt((n - 1) * (k - 1) / (1 - k / r))


def _prefixes(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prefix length m = 2..n: m, the mean and the sample sd (ddof 1) of the first m values."""
    m = np.arange(1, len(xs) + 1, dtype=float)
    # prefix mean  d_bar_m = (1/m) sum_{i<=m} d_i
    mean = np.cumsum(xs) / m
    # prefix sum of squares about the mean, by Welford's update (stable where a naive sum of squares is not)
    ss = np.zeros(len(xs))
    for i in range(1, len(xs)):
        ss[i] = ss[i - 1] + (xs[i] - mean[i - 1]) * (xs[i] - mean[i])
    # s_m = sqrt(ss_m / (m - 1))
    sd = np.sqrt(np.maximum(ss[1:], 0.0) / (m[1:] - 1))
    return m[1:].astype(int), mean[1:], sd


def _spread(sd: float, mean: float) -> bool:
    """A prefix has a spread to scale by: sd > 0 beyond rounding of the mean's size (else it is a tie)."""
    return sd > 1e-12 * max(1.0, abs(mean))


def sequential_summary(diffs: list[float], alpha: float = 0.05, g: float = MIXTURE_G) -> SequentialStat:
    """The evidence, sequential p value and (1 - alpha) confidence sequence of the paired differences ``diffs``
    taken in their order (seed order): valid at this n whatever rule chose to stop here. A non-finite
    difference is a ValueError (the caller leaves out a pair it cannot compute)."""
    _check(alpha, g)
    xs = np.asarray([float(d) for d in diffs], dtype=float)
    if not np.all(np.isfinite(xs)):
        raise ValueError(f"paired differences must be finite, got {xs.tolist()}")
    n = len(xs)
    mean = float(xs.mean()) if n else None
    sd = float(xs.std(ddof=1)) if n >= 2 else None
    best_log_e, side, lo, hi, last = 0.0, 0, -math.inf, math.inf, None
    if n >= 2:
        for m, mu, s in zip(*_prefixes(xs)):
            if not _spread(s, mu):  # a tie: no evidence, the whole line
                continue
            # t_m = d_bar_m / (s_m / sqrt(m)), the t statistic against a mean of 0
            le = log_e(mu / (s / math.sqrt(m)), int(m), g)
            if le > best_log_e:
                best_log_e, side = le, (1 if mu > 0 else -1)
            c = multiplier(int(m), alpha, g)
            if c is not None:
                # CS_m = d_bar_m -/+ c_m s_m / sqrt(m); the running intersection is one too
                last = (mu - c * s / math.sqrt(m), mu + c * s / math.sqrt(m))
                lo, hi = max(lo, last[0]), min(hi, last[1])
    # an empty intersection (prefix intervals that miss each other: a rare miss, or differences far from normal)
    # says nothing by itself about where the mean is: the latest interval stands
    ci = None if last is None else ((float(lo), float(hi)) if lo <= hi else (float(last[0]), float(last[1])))
    # p_n = min(1, 1 / max_{m <= n} E_m(0))
    return SequentialStat(n, mean, sd, math.exp(best_log_e), min(1.0, math.exp(-best_log_e)), side, alpha, ci)


def decide_family(diffs: dict[str, list[float]], alpha: float = 0.05,
                  g: float = MIXTURE_G) -> dict[str, FamilyDecision]:
    """Every comparison of one family (name -> its paired differences in seed order), decided by Holm's method
    over the sequential p values at level ``alpha``; each interval is the confidence sequence at alpha / k.

    k counts every comparison given, with or without pairs (one with fewer than 2 has p = 1): the family is
    fixed before the data, never narrowed by them. A decided comparison's side is the sign of its mean where
    its evidence peaked.
    """
    _check(alpha, g)
    names = list(diffs)
    if not names:
        return {}
    k = len(names)
    stats = {name: sequential_summary(diffs[name], alpha / k, g) for name in names}
    adjusted = holm([stats[name].p for name in names])
    out = {}
    for name, q in zip(names, adjusted):
        st = stats[name]
        # decided  <=>  Holm-adjusted p <= alpha (Ville: P(sup_n E_n >= 1/alpha) <= alpha, so p <= alpha is level alpha)
        decided = q <= alpha and st.side != 0
        out[name] = FamilyDecision(st, q, (ABOVE if st.side > 0 else BELOW) if decided else None)
    return out


def versus_baseline(finals: dict[str, dict[str, float]], baseline: str, alpha: float = 0.05,
                    g: float = MIXTURE_G, edges: dict[str, float] | None = None) -> dict[str, FamilyDecision]:
    """One scenario's family: every algorithm of ``finals`` ({algo: {seed: final pass@1}}) but ``baseline``,
    paired with it seed by seed over the seeds where both have a value (``paired.pair_by_seed``, seed order),
    decided together by ``decide_family``. Empty when ``baseline`` is not in ``finals``.

    ``edges``: per algorithm, the edge of the region a claim registered for its comparison (pass@1 units,
    ``edge_of``). That comparison is then decided against the edge instead of 0, as its fixed-n pages test it:
    the confidence sequence of ``d_s - edge``, shifted back, and the decision above or below the edge (in points)."""
    if baseline not in finals:
        return {}
    edges = edges or {}
    # d_s = final(algo, s) - final(baseline, s), in seed order; tested against its edge: d_s - edge against 0
    diffs = {a: [d - edges.get(a, 0.0) for d in pair_by_seed(values, finals[baseline])[1]]
             for a, values in finals.items() if a != baseline}
    out = decide_family(diffs, alpha, g)
    for a, edge in edges.items():
        if a in out and edge:
            st = out[a].stat
            # back in the units of d_s: the mean and the interval move by the edge
            shifted = replace(st, mean=None if st.mean is None else st.mean + edge,
                              ci=None if st.ci is None else (st.ci[0] + edge, st.ci[1] + edge))
            # the side is the edge's: "above +3" (points), not "above 0"
            side = None if out[a].decision is None else out[a].decision.replace(" 0", f" {100 * edge:+g}")
            out[a] = replace(out[a], stat=shifted, decision=side, edge=edge)
    return out


def edge_of(region: tuple[float, float] | None, scale: float = 100.0) -> float | None:
    """The one finite edge of a claimed region in points (``claim_specs.region_lookup``), in pass@1 units
    (divided by ``scale``); None for no region, or one bounded on both sides (an equivalence: its fixed-n pages
    test it, the sequence tests against 0)."""
    if region is None:
        return None
    finite = [x for x in region if math.isfinite(x)]
    return finite[0] / scale if len(finite) == 1 else None
