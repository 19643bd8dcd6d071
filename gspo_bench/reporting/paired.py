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
(algorithm, metric) on its own. There is no multiple-comparison correction:
with five algorithms and three metrics a group holds fifteen comparisons, and
if no algorithm truly differed from the baseline the chance that at least one
is marked would be up to 1 - 0.95^15, about 54 % (less, as the three metrics
are correlated). Read the marks as a screen, not as findings.

Pure functions (no MLflow); ``paired_table.paired_groups`` applies them to runs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedStat:
    """The summary of ``n`` paired differences. With n < 2: no sd, interval or MDE (None); with n = 0 no mean."""

    n: int
    mean: float | None
    sd: float | None  # sample sd, ddof 1
    ci: tuple[float, float] | None  # the (1 - alpha) t interval of the mean difference
    significant: bool  # the interval excludes 0 (False without an interval)
    mde: float | None  # minimum detectable effect of this design (see ``mde``)


def t_quantile(q: float, df: int) -> float:
    """The q quantile of Student's t with ``df`` degrees of freedom (scipy, imported here: importing
    scipy.stats costs most of a second, and every CLI command imports this module's callers)."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, df))


def _check_levels(alpha: float, power: float) -> None:
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha={alpha} and power={power} must both lie in (0, 1)")


def mde(sd: float | None, n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """Minimum detectable effect: the true mean paired difference that a two-sided paired t test at level
    ``alpha`` detects with probability ``power``, given the sd of the differences and ``n`` pairs.

    MDE = (t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n). This is the
    standard approximation, as in H. S. Bloom, "Minimum detectable effects: a
    simple way to report the statistical power of experimental designs",
    Evaluation Review 19(5):547-556, 1995 (multiplier M = t_{alpha/2} +
    t_{1-beta}, beta = 1 - power). The exact value needs the noncentral t
    distribution; the approximation is slightly optimistic with few pairs (at
    this MDE the exact power, for alpha 0.05 and power 0.8, is about 77 % with
    n = 3, 79 % with n = 5, 80 % from n = 8; with n = 2 only 73 %). None when
    n < 2 or sd is None (no estimate of the spread).
    """
    _check_levels(alpha, power)
    if sd is None or n < 2 or not math.isfinite(sd):
        return None
    df = n - 1
    # multiplier M = t_{1-alpha/2, n-1} + t_{power, n-1}
    m = t_quantile(1 - alpha / 2, df) + t_quantile(power, df)
    # MDE = M * sd / sqrt(n)  (sd / sqrt(n) = standard error of the mean difference)
    return m * sd / math.sqrt(n)


def paired_summary(diffs: list[float], alpha: float = 0.05, power: float = 0.8) -> PairedStat:
    """Mean, sample sd, (1 - alpha) t interval, significance and MDE of the paired differences ``diffs``.

    n = 0: everything None; n = 1: the mean alone. A non-finite difference is
    a ValueError (the caller leaves out a pair it cannot compute).
    """
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
    # interval  d_bar -/+ t_{1-alpha/2, n-1} * s_d / sqrt(n)
    half = t_quantile(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
    ci = (mean - half, mean + half)
    # significant  <=>  0 lies outside [lo, hi]  (sd = 0: the interval is the point d_bar)
    significant = ci[0] > 0 or ci[1] < 0
    return PairedStat(n, mean, sd, ci, significant, mde(sd, n, alpha, power))


def pooled_sd(sds: list[float]) -> float | None:
    """sqrt(mean of the variances): one sd for several algorithms' paired differences (None: no sd given)."""
    vs = [s * s for s in sds if s is not None and math.isfinite(s)]
    if not vs:
        return None
    # pooled sd = sqrt((1/k) sum_a sd_a^2), every algorithm weighted equally
    return math.sqrt(statistics.fmean(vs))
