"""Paired differences between two algorithms over seeds: mean, t interval, minimum detectable effect.

What is paired: within one leaderboard group (task, model, preset, config)
every algorithm trains from the same warm start and sees the same prompt
order for a given seed. So seed ``s`` of algorithm A and seed ``s`` of the
baseline B share their luck, and the per-seed difference
``d_s = metric(A, s) - metric(B, s)`` cancels it; its spread over seeds is
smaller than either algorithm's own spread, and a comparison of the ``d_s``
is sharper than one of two independent means.

Why t: there are few seeds (typically 3 to 8), so the sample sd of the
``d_s`` is itself uncertain; the t distribution with ``n - 1`` degrees of
freedom accounts for that, where a normal interval would be too narrow.
It assumes the differences are roughly normal, in practice roughly
symmetric without outliers; with this few seeds a bootstrap has too few
distinct resamples, and a signed-rank test cannot reach 5 % below six pairs.

"Significant" here means only that the 95 % interval excludes 0, for each
(algorithm, metric) on its own. With five algorithms and three metrics a
group holds fifteen comparisons, and if no algorithm truly differed from the
baseline the chance that at least one is marked would be up to
1 - 0.95^15, about 54 % (less, as the three metrics are correlated). So the
paired tables also give each comparison's p value adjusted by Holm's method
over the group's algorithms, per metric (``holm``): a Holm p below 0.05 is a
finding for the whole family, a mark alone is a screen.

Pure functions (no MLflow), the one place the project pairs and tests: the
paired tables (``pairing.py``, viewed by ``paired_table.py`` and
``split_pairs.py``), the suite's best/worst tests (``suite_summary.py``) and
the claims (``claims.py``) all pair with ``pair_by_seed`` and summarise with
``paired_summary``; several runs of one seed reach them counted by the one
rule of ``seeds.py``. The interval is scipy's (``ttest_1samp`` on the
differences, i.e. ``ttest_rel`` on the pairs); the MDE is solved exactly from
the noncentral t (``t_test_power``, integrated over the sample sd: statsmodels' ``TTestPower`` returned its bracket's
bound at few pairs and small levels).
"""

from __future__ import annotations

import functools
import math
import statistics
import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedStat:
    """The summary of ``n`` paired differences. With n < 2: no sd, interval or MDE (None); with n = 0 no mean."""

    n: int
    mean: float | None
    sd: float | None  # sample sd, ddof 1
    ci: tuple[float, float] | None  # the (1 - alpha) t interval of the mean difference
    significant: bool  # the interval excludes 0 (False without an interval)
    mde: float | None  # minimum detectable effect of this design (see ``mde``)
    p: float | None = None  # two-sided p value of the paired t test (None without an interval)

    @property
    def tied(self) -> bool:
        """Two or more differences, all equal: no spread (the paired tables show no interval, test or MDE: n/a)."""
        return self.n >= 2 and self.sd == 0


def _check_levels(alpha: float, power: float) -> None:
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha={alpha} and power={power} must both lie in (0, 1)")


def mde(sd: float | None, n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """Minimum detectable effect: the true mean paired difference that a two-sided paired t test at level
    ``alpha`` detects with probability ``power``, given the sd of the differences and ``n`` pairs.

    Solved exactly: the standardised effect ``d`` at which the noncentral t with ``n - 1`` degrees of freedom
    and noncentrality ``d sqrt(n)`` exceeds the two-sided critical value with probability ``power``
    (``t_test_power``, ``_effect_size``); MDE = d * sd. The common shortcut (t_{1-alpha/2, n-1} +
    t_{power, n-1}) * sd / sqrt(n) (Bloom 1995) is slightly optimistic with few pairs: for alpha 0.05 and
    power 0.8 the exact d is 3.26 with n = 3 (shortcut 3.10), 1.68 with n = 5 (1.66), 1.16 with n = 8 (1.15),
    and 11.5 with n = 2 (9.96). None when n < 2 or sd is None (no estimate of the spread).
    """
    _check_levels(alpha, power)
    if sd is None or n < 2 or not math.isfinite(sd):
        return None
    # d: power = P(|T'| > t_{1-alpha/2, n-1}), T' ~ noncentral t(n - 1, d sqrt(n))
    d = _effect_size(n, alpha, power)
    # MDE = d * sd  (the difference, in the metric's own units)
    return d * sd


def t_test_power(d: float, n: int, alpha: float) -> float:
    """The power of the two-sided paired t test at level ``alpha`` with ``n`` pairs when the true mean difference is
    ``d`` sds: P(|T'| > t*), T' ~ noncentral t(n - 1, d sqrt(n)), t* = t_{1-alpha/2, n-1}.

    Computed by integrating over the sample sd, as ``tost_power`` does, not from scipy's noncentral t, whose
    tails turn NaN at the few pairs and small levels a family's Holm step asks for (n = 3, alpha 0.05 / 64): with
    the true sd 1, the mean m ~ N(d, 1/n) and the sample sd s, (n - 1) s^2 ~ chi2(n - 1), are independent, so
    P = E_s[Phi(d sqrt(n) - t* s) + Phi(-d sqrt(n) - t* s)]."""
    from scipy.integrate import quad
    from scipy.special import ndtr
    from scipy.stats import t as student

    df = n - 1
    crit, shift = float(student.ppf(1 - alpha / 2, df)), d * math.sqrt(n)
    # log of the chi2(df) density's constant: -(df/2) log 2 - log Gamma(df/2) (scalar math: the integrand runs
    # hundreds of times per solve, and scipy.stats' per-call overhead made one solve take a second)
    log_c = -0.5 * df * math.log(2.0) - math.lgamma(0.5 * df)

    def rejects(q: float) -> float:
        if q <= 0.0:
            return 0.0
        s = math.sqrt(q / df)  # the sample sd at chi-square value q
        # chi2 density: q^(df/2 - 1) exp(-q/2) / (2^(df/2) Gamma(df/2))
        density = math.exp(log_c + (0.5 * df - 1.0) * math.log(q) - 0.5 * q)
        # P(|m| > t* s / sqrt(n)) = Phi(d sqrt(n) - t* s) + Phi(-d sqrt(n) - t* s)
        return float(ndtr(shift - crit * s) + ndtr(-shift - crit * s)) * density

    # the chi-square's mass lies within its mean + 40 sds: the integral over [0, that] is the whole to 1e-12
    top = df + 40 * math.sqrt(2 * df)
    return min(1.0, quad(rejects, 0, top, limit=400, epsabs=1e-13, epsrel=1e-11, points=[df])[0])


@functools.lru_cache(maxsize=1024)
def _effect_size(n: int, alpha: float, power: float) -> float:
    """d solving ``t_test_power(d, n, alpha) = power``: a bracket that doubles until it holds the root, then
    Brent's method. The power rises with d, with n and with alpha, so d falls with both (tested)."""
    from scipy.optimize import brentq

    hi = 1.0
    while t_test_power(hi, n, alpha) < power:
        hi *= 2.0
    return float(brentq(lambda d: t_test_power(d, n, alpha) - power, 0.0, hi, xtol=1e-10, rtol=1e-12))


def paired_summary(diffs: list[float], alpha: float = 0.05, power: float = 0.8) -> PairedStat:
    """Mean, sample sd, (1 - alpha) t interval, significance and MDE of the paired differences ``diffs``.

    n = 0: everything None; n = 1: the mean alone; every difference equal (sd 0, ``PairedStat.tied``): the
    interval is the point and there is no MDE. A non-finite difference is a ValueError (the caller leaves out a
    pair it cannot compute).
    """
    from scipy import stats

    _check_levels(alpha, power)
    xs = [float(d) for d in diffs]
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"paired differences must be finite, got {xs}")
    n = len(xs)
    if n == 0:
        return PairedStat(0, None, None, None, False, None)
    # mean difference  d_bar = (1/n) sum_s d_s
    mean = statistics.fmean(xs)
    if n == 1:
        return PairedStat(1, mean, None, None, False, None)
    # sample sd  s_d = sqrt(sum_s (d_s - d_bar)^2 / (n - 1))
    sd = statistics.stdev(xs)
    if sd == 0:  # every pair differs by the same amount: the interval's limit is that point, and there is no
        # spread to size an MDE by (the paired tables show such a tie as n/a: a floor of the measure, most often)
        ci, p = (mean, mean), (1.0 if mean == 0 else 0.0)
        return PairedStat(n, mean, 0.0, ci, ci[0] > 0 or ci[1] < 0, None, p)
    # interval  d_bar -/+ t_{1-alpha/2, n-1} * s_d / sqrt(n): the one-sample t test of the differences
    with warnings.catch_warnings():  # differences equal up to rounding: scipy warns, the interval stands
        warnings.simplefilter("ignore", RuntimeWarning)
        test = stats.ttest_1samp(xs, 0.0)
        lo, hi = test.confidence_interval(confidence_level=1 - alpha)
    # p = 2 * P(T_{n-1} > |d_bar| / (s_d / sqrt(n)))
    ci, p = (float(lo), float(hi)), float(test.pvalue)
    # significant  <=>  0 lies outside [lo, hi]
    significant = ci[0] > 0 or ci[1] < 0
    return PairedStat(n, mean, sd, ci, significant, mde(sd, n, alpha, power), p)


def sd_interval(sd: float, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The ``confidence`` interval of the true sd of paired differences from their sample sd over ``n`` pairs,
    assuming normal differences: (n - 1) s^2 / sigma^2 ~ chi2(n - 1). With 3 pairs it spans about x0.5 to x6
    of the sample sd; None when n < 2 or the sd is not a positive number."""
    from scipy.stats import chi2

    if n < 2 or sd is None or not math.isfinite(sd) or sd <= 0:
        return None
    tail = (1 - confidence) / 2
    # sigma in [s sqrt((n-1) / chi2_{1-tail}), s sqrt((n-1) / chi2_{tail})]
    return (sd * math.sqrt((n - 1) / chi2.ppf(1 - tail, n - 1)), sd * math.sqrt((n - 1) / chi2.ppf(tail, n - 1)))


def seeds_needed(sd: float, target: float, alpha: float = 0.05, power: float = 0.8,
                 limit: int = 10_000) -> int | None:
    """The fewest pairs n (at least 2) whose MDE (``mde``) at level ``alpha`` and ``power`` is at most ``target``
    for paired differences of sd ``sd``; None when even ``limit`` pairs would not do, or the sd is unknown. The
    MDE falls as n grows, so a bisection over n finds it."""
    _check_levels(alpha, power)
    if sd is None or not math.isfinite(sd) or target <= 0:
        return None
    if sd == 0 or mde(sd, 2, alpha, power) <= target:
        return 2
    if mde(sd, limit, alpha, power) > target:
        return None
    lo, hi = 2, limit  # mde(lo) > target >= mde(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mde(sd, mid, alpha, power) <= target else (mid, hi)
    return hi


def _edge_tests(stat: PairedStat, region: tuple[float, float]) -> list[tuple[float, float]] | None:
    """Per finite edge of the open ``region`` (lo, hi), the one-sided paired t tests' p values (towards the
    inside, towards the outside); None without an interval, or for a tie (no spread to test)."""
    from scipy.stats import t as student

    if stat.ci is None or stat.sd is None or stat.tied:
        return None
    lo, hi = region
    se = stat.sd / math.sqrt(stat.n)
    out = []
    if math.isfinite(lo):
        # above lo (H0: mean <= lo): P(T_{n-1} >= (mean - lo) / se); below it: P(T_{n-1} <= (mean - lo) / se)
        t_lo = (stat.mean - lo) / se
        out.append((float(student.sf(t_lo, stat.n - 1)), float(student.cdf(t_lo, stat.n - 1))))
    if math.isfinite(hi):
        # below hi (H0: mean >= hi): P(T_{n-1} <= (mean - hi) / se); above it: P(T_{n-1} >= (mean - hi) / se)
        t_hi = (stat.mean - hi) / se
        out.append((float(student.cdf(t_hi, stat.n - 1)), float(student.sf(t_hi, stat.n - 1))))
    return out


def outside_p(stat: PairedStat, region: tuple[float, float]) -> float | None:
    """The p value of the test that the true mean difference lies outside the open ``region`` (lo, hi): each
    finite edge is a one-sided paired t test (H0: mean >= lo, against mean < lo; H0: mean <= hi, against
    mean > hi), the smaller p doubled, so that p < alpha exactly when the two-sided (1 - alpha) interval lies
    wholly outside the region on one side (the claims' "refuted"). None without an interval, or for a tie
    (no spread to test)."""
    tests = _edge_tests(stat, region)
    # two one-sided tests at alpha / 2 each: the two-sided interval's rule
    return min(1.0, 2 * min(p for _, p in tests)) if tests else None


def inside_p(stat: PairedStat, region: tuple[float, float]) -> float | None:
    """The p value of the test that the true mean difference lies inside the open ``region`` (lo, hi): each
    finite edge is a one-sided paired t test (H0: mean <= lo, against mean > lo; H0: mean >= hi, against
    mean < hi), the larger p doubled (all must reject: an intersection-union test), so that p < alpha exactly
    when the two-sided (1 - alpha) interval lies wholly inside the region. For a region bounded on both sides
    that is the two one-sided tests of equivalence (TOST) at alpha / 2 each. None without an interval, for a
    tie, or for the whole line (nothing claimed)."""
    tests = _edge_tests(stat, region)
    return min(1.0, 2 * max(p for p, _ in tests)) if tests else None


def region_test(stat: PairedStat, region: tuple[float, float]) -> tuple[float, bool] | None:
    """One test of a claimed ``region``, symmetric in its two answers: ``(p, inside)``, p the smallest level at
    which the two-sided (1 - p) t interval lies wholly inside the region (``inside`` True, ``inside_p``) or
    wholly outside it (False, ``outside_p``), whichever comes first. A null effect can therefore show a region
    bounded away from 0 wrong as readily as a true effect shows it right. For the region (0, inf) p is the
    two-sided paired t test's p and ``inside`` the sign of the mean: the paired tables' test is this one with
    the edge at 0. None without an interval, for a tie, or for the whole line."""
    p_in, p_out = inside_p(stat, region), outside_p(stat, region)
    if p_in is None or p_out is None:
        return None
    # p = min(p_in, p_out): the interval at level p touches the edge from one side
    return (p_in, True) if p_in <= p_out else (p_out, False)


def tost_power(sd: float | None, n: int, region: tuple[float, float], alpha: float = 0.05) -> float | None:
    """The chance that the (1 - alpha) t interval of n paired differences lands inside a bounded ``region``
    (lo, hi) when the true mean is its centre c and the true sd is ``sd``: the power of the two one-sided tests
    (TOST) that reproduce an equivalence claim. Exact: the mean m ~ N(c, sd^2 / n) and the sample sd s, with
    (n - 1) s^2 / sd^2 ~ chi2(n - 1), are independent, so P = E_s[P(lo + t* s / sqrt(n) < m < hi - t* s /
    sqrt(n))], t* the t quantile at 1 - alpha / 2 with n - 1 df, integrated over the chi-square. None without an
    sd, with fewer than 2 seeds, or for an unbounded region (no centre)."""
    from scipy.integrate import quad
    from scipy.stats import chi2, norm
    from scipy.stats import t as student

    lo, hi = region
    if sd is None or n < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if sd == 0:
        return 1.0
    crit, se, centre, df = float(student.ppf(1 - alpha / 2, n - 1)), sd / math.sqrt(n), (lo + hi) / 2, n - 1

    def inside(q: float) -> float:
        half = crit * sd * math.sqrt(q / df) / math.sqrt(n)  # t* s / sqrt(n) at s = sd sqrt(q / (n - 1))
        # P(lo + half < m < hi - half), m ~ N(centre, se^2)
        p = norm.cdf((hi - half - centre) / se) - norm.cdf((lo + half - centre) / se)
        return max(0.0, float(p)) * float(chi2.pdf(q, df))

    return min(1.0, quad(inside, 0, math.inf, limit=200)[0])


def holm_first_level(alpha: float, k: int) -> float:
    """The level Holm's method tests the smallest of ``k`` p values at: alpha / k. A comparison is decided
    for the family only below the level of its step (alpha / k, then alpha / (k - 1), ...), so an effect
    detectable at alpha / k is detectable whatever the other p values are: the MDE quoted beside Holm p
    values is at this level."""
    # Holm's first step: p_(1) < alpha / k
    return alpha / max(k, 1)


def holm(ps: list[float | None]) -> list[float | None]:
    """Holm-adjusted p values of a family of tests (None stays None and is not counted in the family).

    With k tests ordered p_(1) <= ... <= p_(k): p~_(i) = max_{j <= i} min(1, (k - j + 1) p_(j)). Rejecting
    where p~ < alpha keeps the chance of any false rejection in the family at or below alpha, whatever the
    dependence between the tests. The same values as statsmodels' ``multipletests(method="holm")`` (tested),
    computed here: that function runs ``gc.collect()`` on every call (about 0.1 s in a process holding torch),
    and the sequential planner adjusts a family after every batch of seeds.
    """
    idx = [i for i, p in enumerate(ps) if p is not None]
    out: list[float | None] = [None] * len(ps)
    k, running = len(idx), 0.0
    # in the order p_(1) <= ... <= p_(k): p~_(j) = max(p~_(j-1), min(1, (k - j + 1) p_(j)))
    for j, i in enumerate(sorted(idx, key=lambda i: ps[i])):
        running = max(running, min(1.0, (k - j) * ps[i]))
        out[i] = running
    return out


def signed_sum_by_seed(terms: list[tuple[float, dict]]) -> tuple[list, list[float]]:
    """The seeds where every term's values (seed -> value) hold a finite value, in seed order, and per seed
    ``d_s = sum_i sign_i * value_i[s]``: the pairing of every comparison here (two terms for a paired
    difference, four for a difference of differences)."""
    def finite(x) -> bool:
        return x is not None and math.isfinite(x)

    common = set.intersection(*(set(values) for _, values in terms)) if terms else set()
    seeds = sorted((s for s in common if all(finite(values[s]) for _, values in terms)), key=seed_key)
    # d_s = sum_i sign_i * value_i(s)
    return seeds, [sum(sign * values[s] for sign, values in terms) for s in seeds]


def pair_by_seed(a: dict, b: dict) -> tuple[list, list[float]]:
    """The seeds both ``a`` and ``b`` (seed -> value) have a finite value for, and ``a[s] - b[s]``."""
    return signed_sum_by_seed([(1.0, a), (-1.0, b)])


def seed_key(s):
    """Seeds in numeric order (tags are strings: "10" after "9"), anything else after them."""
    s = str(s)
    return (0, int(s), s) if s.lstrip("-").isdigit() else (1, 0, s)


def pooled_sd(sds: list[float]) -> float | None:
    """sqrt(mean of the variances): one sd for several algorithms' paired differences (None: no sd given)."""
    vs = [s * s for s in sds if s is not None and math.isfinite(s)]
    if not vs:
        return None
    # pooled sd = sqrt((1/k) sum_a sd_a^2), every algorithm weighted equally
    return math.sqrt(statistics.fmean(vs))
