"""Paired statistics: the MDE and t interval by hand, pairing by seed on hand-built runs, the --baseline errors."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy.stats import ttest_1samp

from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError
from gspo_bench.reporting.leaderboard import auc
from gspo_bench.reporting.frame import RunData
from gspo_bench.reporting.paired_table import check_baseline, paired_groups, paired_rows
from gspo_bench.reporting.paired import holm, mde, paired_summary, pooled_sd
from test_leaderboard import EXP, build_store

# t quantiles for 7 degrees of freedom, from a printed t table
T975_7, T80_7 = 2.3646, 0.8960


# -- (a) to (d): the pure functions ------------------------------------------------------------------------------------
def _power(d: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test at standardised effect ``d`` with ``n`` pairs, from the noncentral t
    directly: P(|T'| > t_{1-alpha/2, n-1}), T' ~ nct(n - 1, d sqrt(n))."""
    from scipy.stats import nct, t

    crit = t.ppf(1 - alpha / 2, n - 1)
    # the lower tail is below 1e-10 at these effects; scipy's turns NaN there at one degree of freedom
    lower = float(nct.cdf(-crit, n - 1, d * math.sqrt(n)))
    return float(nct.sf(crit, n - 1, d * math.sqrt(n))) + (0.0 if math.isnan(lower) else lower)


def test_mde_is_the_exact_effect_at_80_percent_power():
    # at the MDE the test has exactly 80 % power (noncentral t, computed here without statsmodels)
    for n in (2, 3, 5, 8, 20):
        assert _power(mde(1.0, n), n) == pytest.approx(0.8, abs=1e-4), n
    assert mde(0.04, 8) == pytest.approx(0.04 * 1.1560, abs=1e-5)  # d = 1.1560 for n = 8
    # the common shortcut (t_{0.975,7} + t_{0.8,7}) / sqrt(8) = 1.1528 is slightly optimistic: below the exact d
    assert (T975_7 + T80_7) * 0.04 / math.sqrt(8) < mde(0.04, 8)
    assert _power((T975_7 + T80_7) / math.sqrt(8), 8) < 0.8
    # more seeds, smaller MDE; more power, larger MDE; a stricter alpha, larger MDE
    assert mde(0.04, 16) < mde(0.04, 8) < mde(0.04, 4)
    assert mde(0.04, 8, power=0.9) > mde(0.04, 8) and mde(0.04, 8, alpha=0.01) > mde(0.04, 8)
    with pytest.raises(ValueError):
        mde(0.04, 8, alpha=1.5)


def _simulated_power(d: float, n: int, alpha: float, draws: int = 40_000, seed: int = 0) -> float:
    """The share of ``draws`` simulated studies of n normal paired differences (mean d, sd 1) whose two-sided
    paired t test rejects at ``alpha``: Monte Carlo, no formula shared with the code under test."""
    from scipy.stats import t

    x = np.random.default_rng(seed).normal(d, 1.0, size=(draws, n))
    stat = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
    return float((np.abs(stat) > t.ppf(1 - alpha / 2, n - 1)).mean())


@pytest.mark.parametrize("n", [3, 4, 8])
@pytest.mark.parametrize("alpha", [0.05, 0.05 / 14, 0.05 / 32, 0.05 / 64])
def test_the_mde_has_80_percent_power_in_simulated_studies(n, alpha):
    """At a Holm family's first step with few seeds (n 3, alpha 0.05 / 64) the quoted MDE has its 80 % power.
    statsmodels' solver returned its bracket's bound there (d = 10 at n = 3, alpha 0.05 / 14, where it is 12.25:
    38 % power, not 80 %)."""
    d = mde(1.0, n, alpha)
    # 40,000 studies: the share's sd is 0.002 at 80 %
    assert _simulated_power(d, n, alpha) == pytest.approx(0.8, abs=0.01), (n, alpha, d)


def test_the_effect_size_is_monotone_and_right_where_statsmodels_was_not():
    # the values a noncentral-t table gives (n = 3: d 12.25 at 0.05 / 14, 18.53 at 0.05 / 32)
    assert mde(1.0, 3, 0.05 / 14) == pytest.approx(12.25, abs=0.01)
    assert mde(1.0, 3, 0.05 / 32) == pytest.approx(18.53, abs=0.01)
    # falls with more pairs at every level, and with a looser level at every n (statsmodels' d at n = 4 was 3.54
    # at alpha 0.0083 and 3.40 at the stricter 0.0042)
    alphas = [0.05 / k for k in (1, 2, 3, 6, 12, 14, 24, 32, 64)]
    for alpha in alphas:
        ds = [mde(1.0, n, alpha) for n in range(2, 41)]
        assert all(a > b for a, b in zip(ds, ds[1:])), alpha
    for n in (2, 3, 4, 5, 8, 24):
        ds = [mde(1.0, n, alpha) for alpha in alphas]
        assert all(a < b for a, b in zip(ds, ds[1:])), n
    assert mde(1.0, 4, 0.0083) < mde(1.0, 4, 0.0042)


def test_known_difference_is_detected():
    diffs = [0.05, 0.06, 0.07, 0.08, 0.08, 0.09, 0.10, 0.11]  # mean 0.08, sd ~0.02
    st = paired_summary(diffs)
    sd = float(np.std(diffs, ddof=1))
    assert st.n == 8 and st.mean == pytest.approx(0.08) and st.sd == pytest.approx(sd)
    half = T975_7 * sd / math.sqrt(8)  # the interval by hand, t table for 7 df
    assert st.ci == pytest.approx((0.08 - half, 0.08 + half), abs=1e-4)
    assert st.significant and st.ci[0] > 0 and st.ci[0] < 0.08 < st.ci[1]
    assert st.mde == pytest.approx(mde(sd, 8)) and _power(st.mde / sd, 8) == pytest.approx(0.8, abs=1e-4)
    drawn = np.random.default_rng(7).normal(0.08, 0.02, 8).tolist()  # a random draw, fixed seed
    st = paired_summary(drawn)
    assert st.significant and st.ci[0] > 0 and st.ci[0] < 0.08 < st.ci[1]


def test_no_difference_is_not_marked():
    st = paired_summary([-0.03, -0.02, -0.01, 0.0, 0.0, 0.01, 0.02, 0.03])  # symmetric around 0
    assert st.mean == pytest.approx(0.0, abs=1e-12) and not st.significant
    assert st.ci[0] < 0 < st.ci[1] and st.mde > 0
    # a real but small difference under large noise is not marked either
    assert not paired_summary([0.10, -0.08, 0.05, -0.04]).significant


def test_fewer_than_two_pairs_give_none_never_nan():
    for st, mean in ((paired_summary([]), None), (paired_summary([0.3]), 0.3)):
        assert st.mean == mean and st.sd is None and st.ci is None and st.mde is None and not st.significant
    assert paired_summary([]).n == 0 and paired_summary([0.3]).n == 1
    assert mde(0.04, 1) is None and mde(0.04, 0) is None and mde(None, 8) is None
    # identical differences (a tie at an evaluation floor): sd 0, the interval is the point, no MDE, nothing NaN
    st = paired_summary([0.1, 0.1, 0.1])
    assert st.sd == 0 and st.tied and st.mean == pytest.approx(0.1)
    assert st.ci == pytest.approx((0.1, 0.1)) and st.significant and st.mde is None
    assert not paired_summary([0.1, 0.2]).tied and not paired_summary([0.1]).tied
    with pytest.raises(ValueError):
        paired_summary([0.1, float("nan")])


def test_pooled_sd_is_root_mean_variance():
    assert pooled_sd([0.03, 0.04]) == pytest.approx(math.sqrt((0.03 ** 2 + 0.04 ** 2) / 2))
    assert pooled_sd([]) is None and pooled_sd([None]) is None


def test_p_value_is_the_paired_t_test_by_hand():
    # d = 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 2 sqrt 3 on 2 df, where the t cdf is
    # 1/2 + t / (2 sqrt(2 + t^2)); so p = 2 (1/2 - 2 sqrt 3 / (2 sqrt 14)) = 1 - sqrt(12 / 14)
    assert paired_summary([1.0, 2.0, 3.0]).p == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)
    assert paired_summary([1.0]).p is None and paired_summary([]).p is None
    assert paired_summary([0.5, 0.5]).p == 0.0 and paired_summary([0.0, 0.0]).p == 1.0  # no spread


def test_holm_adjusts_over_the_family_by_hand():
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1: 0.03, 0.06, 0.04, then the running max: 0.03, 0.06, 0.06
    assert holm([None, 0.01, 0.04, 0.03]) == pytest.approx([None, 0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([None]) == [None] and holm([]) == []


# -- (e): pairing runs by seed -----------------------------------------------------------------------------------------
STEPS = (0, 10, 20)


def _rd(algo, seed, curve=(0.4, 0.4, 0.4), status="FINISHED", tuning=None):
    tags = {"algo": algo, "seed": str(seed), "task": "arith", "model": "tiny-dense", "preset": "default"}
    if tuning:
        tags["tuning"] = tuning
    history = {"eval/pass1": list(zip(STEPS, curve))} if status == "FINISHED" else {}
    return RunData(f"{algo}-{seed}-{status}", status, tags, {}, {}, history)


# grpo reaches +10 points at step 10, 20, never; gspo at 10, 10, 10 (seed 2: only gspo reached)
GRPO = {0: (0.40, 0.50, 0.60), 1: (0.40, 0.45, 0.55), 2: (0.40, 0.42, 0.45), 3: (0.40, 0.50, 0.50)}
GSPO = {0: (0.40, 0.60, 0.70), 1: (0.40, 0.52, 0.65), 2: (0.40, 0.55, 0.60)}
CISPO = {0: (0.40, 0.40, 0.50), 1: (0.40, 0.45, 0.60), 2: (0.40, 0.40, 0.40)}


@pytest.fixture
def runs():
    rs = [_rd("grpo", s, c) for s, c in GRPO.items()] + [_rd("gspo", s, c) for s, c in GSPO.items()]
    rs += [_rd("cispo", s, c) for s, c in CISPO.items()]
    rs += [_rd("gspo", 4, (0.4, 0.9, 0.9)),  # no grpo seed 4: unpaired
           _rd("gspo", 3, (0.4, 0.9, 0.9), status="FAILED"),  # grpo seed 3 exists, but this one failed
           _rd("grpo", 5, status="RUNNING"), _rd("gspo", 5, (0.4, 0.9, 0.9)),  # the baseline's seed 5 unfinished
           _rd("dapo", 0, (0.40, 0.50, 0.80))]  # one pair only
    rs += [_rd("grpo", 0, (0.4, 0.5, 0.6), tuning="tuned"), _rd("gspo", 0, (0.4, 0.5, 0.9), tuning="tuned")]
    rs += [_rd("gspo", 0, (0.4, 0.5, 0.9), tuning="solo")]  # a group without the baseline
    return rs


def _stat(rows, algo, metric, config="default"):
    (row,) = [r for r in rows if r["algo"] == algo and r["metric"] == metric and r["config"] == config]
    return row


def test_pairs_by_seed_leaving_out_unpaired_and_unfinished(runs):
    rows = paired_rows(runs, "grpo")
    final = _stat(rows, "gspo", "final_pass1")
    # seeds 0, 1, 2: 0.70 - 0.60, 0.65 - 0.55, 0.60 - 0.45 (not 4: no grpo; not 3: FAILED; not 5: RUNNING)
    assert final["seeds"] == "0,1,2" and final["n"] == 3 and final["common"] == 3
    assert final["mean_diff"] == pytest.approx((0.10 + 0.10 + 0.15) / 3)
    assert final["sd_diff"] == pytest.approx(float(np.std([0.10, 0.10, 0.15], ddof=1)))
    assert final["stat"] == paired_summary([0.70 - 0.60, 0.65 - 0.55, 0.60 - 0.45])
    area = [auc(list(zip(STEPS, GSPO[s]))) - auc(list(zip(STEPS, GRPO[s]))) for s in (0, 1, 2)]
    assert _stat(rows, "gspo", "auc_pass1")["mean_diff"] == pytest.approx(np.mean(area))
    assert area[0] == pytest.approx(0.575 - 0.5)  # by hand: (5 + 6.5) / 20 - (4.5 + 5.5) / 20


def test_holm_p_is_over_the_group_algorithms_per_metric(runs):
    rows = [r for r in paired_rows(runs, "grpo") if r["config"] == "default"]
    for metric in ("final_pass1", "auc_pass1"):
        family = [r for r in rows if r["metric"] == metric]
        ps = {r["algo"]: r["p"] for r in family}
        # gspo and cispo have 3 pairs (a p each), dapo one pair (no p): a family of two tests
        assert ps["dapo"] is None and ps["gspo"] is not None and ps["cispo"] is not None
        lo, hi = sorted((ps["gspo"], ps["cispo"]))
        # Holm with k = 2: the smaller p doubled, the larger kept, each at least the one before
        want = {a: min(1.0, 2 * lo) if p == lo else max(min(1.0, 2 * lo), hi) for a, p in ps.items() if p is not None}
        assert {r["algo"]: r["p_holm"] for r in family if r["p"] is not None} == pytest.approx(want)


def test_steps_to_target_drops_seeds_where_either_did_not_reach(runs):
    rows = paired_rows(runs, "grpo")
    steps = _stat(rows, "gspo", "steps_to_10")
    # where each crosses +10 points, read linearly between evaluations: grpo seed 0 at 10, seed 1 at 15
    # (0.45 -> 0.55); gspo seed 0 at 5 (0.40 -> 0.60), seed 1 at 10 / 1.2 (0.40 -> 0.52); seed 2 left out
    # (grpo never reached); 2 pairs of 3 common seeds
    assert steps["seeds"] == "0,1" and steps["n"] == 2 and steps["common"] == 3
    assert steps["mean_diff"] == pytest.approx(((5 - 10) + (10 / 1.2 - 15)) / 2)
    cispo = _stat(rows, "cispo", "steps_to_10")  # cispo seed 0 at 20, seed 1 at 10 + 10/3, seed 2 never
    assert cispo["seeds"] == "0,1" and cispo["mean_diff"] == pytest.approx(((20 - 10) + (10 + 10 / 3 - 15)) / 2)
    dapo = _stat(rows, "dapo", "final_pass1")
    assert dapo["n"] == 1 and dapo["mean_diff"] == pytest.approx(0.2) and dapo["ci_low"] is None
    assert dapo["mde"] is None and dapo["significant"] is False


def test_group_mde_pools_the_variances_and_groups_stay_apart(runs):
    groups = {g.key[3]: g for g in paired_groups(runs, "grpo")}
    g = groups["default"]
    sds = [_stat(g.rows, a, "final_pass1")["sd_diff"] for a in ("gspo", "cispo")]
    assert g.mde_algos == 2 and g.mde_n == 3  # dapo (one pair) is not pooled
    assert g.mde_sd == pytest.approx(math.sqrt((sds[0] ** 2 + sds[1] ** 2) / 2))
    # at the level Holm decides final pass@1 at for two algorithms with a p value: 0.05 / 2 (its first step)
    assert g.mde_algos_tested == 2 and g.mde_alpha == pytest.approx(0.025)
    assert g.mde == pytest.approx(mde(g.mde_sd, 3, alpha=0.025)) and g.mde > mde(g.mde_sd, 3) and g.note is None
    gspo = _stat(g.rows, "gspo", "final_pass1")
    assert gspo["mde_alpha"] == 0.025 and gspo["mde"] == pytest.approx(mde(gspo["sd_diff"], 3, alpha=0.025))
    assert [r["algo"] for r in g.rows[::3]] == ["dapo", "gspo", "cispo"]  # best mean final difference first
    tuned = groups["tuned"]
    assert [(r["algo"], r["n"]) for r in tuned.rows if r["metric"] == "final_pass1"] == [("gspo", 1)]
    assert tuned.rows[0]["mean_diff"] == pytest.approx(0.3) and tuned.mde is None
    solo = groups["solo"]
    assert solo.note == "no FINISHED grpo run in this group" and all(r["n"] == 0 for r in solo.rows)
    only = paired_groups([_rd("grpo", 0), _rd("grpo", 1)], "grpo")
    assert only[0].note == "only grpo in this group, nothing to pair" and only[0].rows == []


def test_a_seed_run_twice_counts_once_as_the_mean(runs):
    twice = runs + [_rd("gspo", 0, (0.40, 0.60, 0.80))]  # gspo seed 0 again: final 0.80 instead of 0.70
    final = _stat(paired_rows(twice, "grpo"), "gspo", "final_pass1")
    assert final["n"] == 3 and final["mean_diff"] == pytest.approx((0.15 + 0.10 + 0.15) / 3)


def test_check_baseline(runs):
    assert check_baseline(runs, "grpo") is None
    note = check_baseline([_rd("gspo", 0), _rd("grpo", 0, status="FAILED")], "grpo", strict=False)
    assert "no FINISHED run of 'grpo'" in note and "1 FAILED" in note and "--baseline" in note
    with pytest.raises(ConfigError, match="no run of 'ppo'"):
        check_baseline(runs, "ppo")
    # a name no run has: with --baseline given, an error; left at the default, the paired table is skipped
    with pytest.raises(ConfigError, match="unknown algorithm here: no run of 'nope'"):
        check_baseline(runs, "nope")
    assert "no run of 'nope' in the selection" in check_baseline(runs, "nope", strict=False)


# -- (f): the command line ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("paired"))


def _one_line(capsys) -> str:
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize("cmd", ["leaderboard", "report"])
def test_cli_bad_baseline_is_one_line_exit_2(cmd, store, tmp_path, capsys):
    out = ["--out", str(tmp_path / "r")] if cmd == "report" else []
    assert main([cmd, "--tracking-uri", store, "--experiment", EXP, "--baseline", "nope", *out]) == 2
    text = _one_line(capsys)
    assert "'nope'" in text and "unknown algorithm" in text and "grpo" in text
    # dapo exists in the store, but only FAILED and RUNNING
    assert main([cmd, "--tracking-uri", store, "--experiment", EXP, "--baseline", "dapo", *out]) == 2
    assert "no FINISHED run of 'dapo'" in _one_line(capsys)
    assert not (tmp_path / "r").exists()


def test_cli_baseline_switches_the_sign(store, capsys):
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "md",
                 "--baseline", "gspo"]) == 0
    out = capsys.readouterr().out
    assert "Paired differences vs gspo" in out
    assert "| arith | tiny-dense | default | default | grpo | gspo | final pass@1 (points) | 2 | -5.5 |" in out


def test_a_tie_at_the_evaluation_floor_is_n_a_and_no_member_of_a_holm_family():
    from gspo_bench.reporting.paired_table import render_paired

    # every algorithm is at exactly +10 points at the first evaluation (step 10) on every seed: steps-to
    # differences are 0, 0, 0, a tie, not an interval [0, 0] with p 1 and MDE 0
    curves = {"grpo": (0.40, 0.50, 0.60), "gspo": (0.40, 0.50, 0.64), "cispo": (0.40, 0.50, 0.61)}
    bumps = (0.0, 0.03, -0.02)
    rs = [_rd(a, s, (c[0], c[1], c[2] + b * (i + 1))) for i, (a, c) in enumerate(curves.items())
          for s, b in enumerate(bumps)]
    (g,) = paired_groups(rs, "grpo")
    steps = [r for r in g.rows if r["metric"] == "steps_to_10"]
    assert all(r["stat"].tied and r["mean_diff"] == 0 for r in steps)
    assert all(r["ci_low"] is None and r["p"] is None and r["p_holm"] is None and r["mde"] is None
               and r["significant"] is False for r in steps)
    finals = [r for r in g.rows if r["metric"] == "final_pass1"]
    assert all(r["p"] is not None and r["mde_alpha"] == pytest.approx(0.025) for r in finals)  # a family of 2
    md = render_paired([g], "md")
    assert "| steps to +10 pts (steps) | 3 | +0.0 | n/a | n/a | n/a | n/a | n/a |" in md
    assert "α 0.025 = 0.05 / 2, Holm's first step" in md


def test_seeds_needed_is_the_fewest_pairs_whose_mde_reaches_the_target():
    from gspo_bench.reporting.paired import sd_interval, seeds_needed

    n = seeds_needed(0.023, 0.03)
    assert mde(0.023, n) <= 0.03 < mde(0.023, n - 1)
    # at Holm's first step over 12 comparisons more seeds are needed for the same target
    strict = seeds_needed(0.023, 0.03, alpha=0.05 / 12)
    assert strict > n and mde(0.023, strict, 0.05 / 12) <= 0.03 < mde(0.023, strict - 1, 0.05 / 12)
    assert seeds_needed(0.0, 0.01) == 2 and seeds_needed(None, 0.01) is None
    assert seeds_needed(1.0, 1e-6, limit=50) is None  # beyond the limit: no plan
    # the sd's 95 % interval from 3 pairs spans about x0.52 to x6.3 (chi2 with 2 df), from 8 about x0.66 to x2.0
    lo, hi = sd_interval(1.0, 3)
    assert lo == pytest.approx(math.sqrt(2 / 7.377759), rel=1e-4) and hi == pytest.approx(math.sqrt(2 / 0.0506356),
                                                                                          rel=1e-4)
    lo8, hi8 = sd_interval(1.0, 8)
    assert 0.6 < lo8 < 0.7 and 1.9 < hi8 < 2.1
    assert sd_interval(0.0, 5) is None and sd_interval(1.0, 1) is None


@pytest.mark.parametrize("ds, region", [([1.0, 2.0, 1.5, 3.0], (0.0, math.inf)), ([-1.0, -2.5, -0.5], (0.0, math.inf)),
                                        ([4.0, 5.0, 3.5], (-3.0, 3.0)), ([-4.0, -5.5, -3.9, -4.2], (-3.0, 3.0)),
                                        ([0.5, -0.2, 0.1], (-3.0, 3.0))])
def test_outside_p_rejects_exactly_when_the_interval_lies_outside_the_region(ds, region):
    from scipy.stats import t as student

    from gspo_bench.reporting.paired import outside_p

    st = paired_summary(ds)
    n, se = len(ds), st.sd / math.sqrt(len(ds))
    lo, hi = region
    # by hand: the smaller one-sided p (below lo, above hi), doubled
    below = student.cdf((st.mean - lo) / se, n - 1) if math.isfinite(lo) else 1.0
    above = student.sf((st.mean - hi) / se, n - 1) if math.isfinite(hi) else 1.0
    assert outside_p(st, region) == pytest.approx(min(1.0, 2 * min(below, above)))
    outside = st.ci[1] <= lo or st.ci[0] >= hi
    assert (outside_p(st, region) < 0.05) == outside
    assert outside_p(paired_summary([1.0, 1.0, 1.0]), region) is None  # a tie: nothing to test
    assert outside_p(paired_summary([1.0]), region) is None


def test_tost_power_against_simulated_studies():
    import numpy as np
    from scipy.stats import t as student

    from gspo_bench.reporting.paired import tost_power

    rng = np.random.default_rng(0)
    for sd, n in ((2.0, 8), (2.0, 3), (1.0, 3), (3.0, 20)):
        crit = student.ppf(0.975, n - 1)
        # studies with the true mean at the centre of (-3, 3): how often the 95 % interval lands inside
        d = rng.normal(0.0, sd, size=(40000, n))
        m, half = d.mean(1), crit * d.std(1, ddof=1) / math.sqrt(n)
        inside = ((m - half > -3) & (m + half < 3)).mean()
        assert tost_power(sd, n, (-3.0, 3.0)) == pytest.approx(inside, abs=0.01), (sd, n)
    assert tost_power(2.0, 3, (-3.0, 3.0)) < tost_power(2.0, 8, (-3.0, 3.0)) < tost_power(2.0, 30, (-3.0, 3.0))
    assert tost_power(2.0, 8, (0.0, math.inf)) is None and tost_power(None, 8, (-3.0, 3.0)) is None
    assert tost_power(0.0, 8, (-3.0, 3.0)) == 1.0


def test_an_mde_past_the_pass1_scale_reads_as_more_than_100_points():
    from gspo_bench.reporting.pairing import points_text, stat_cells
    from gspo_bench.reporting.paired import paired_summary

    assert points_text(0.5149) == "51.5" and points_text(1.0) == "100.0" and points_text(1.561) == "> 100"
    st = paired_summary([0.1, -0.2, 0.05])

    def row(unit: str, scale: float, mde: float) -> dict:
        return {"label": "m", "unit": unit, "scale": scale, "n": 3, "common": 3, "mean_diff": st.mean,
                "ci_low": st.ci[0], "ci_high": st.ci[1], "significant": False, "stat": st, "mde": mde}

    assert stat_cells(row("points", 100.0, 1.561))[-1] == "> 100"
    assert stat_cells(row("points", 100.0, 0.4))[-1] == "40.0"
    assert stat_cells(row("steps", 1.0, 156.1))[-1] == "156.1"  # steps have no ceiling


# -- the claims' region test: inside or outside, whichever the interval shows first ---------------------------------
REGION_CASES = [([1.0, 2.0, 1.5, 3.0], (0.0, math.inf)), ([-1.0, -2.5, -0.5], (0.0, math.inf)),
                ([8.0, 9.0, 7.0, 8.5], (3.0, math.inf)), ([0.5, -0.5, 1.0, -1.0, 0.0, 0.5, -0.5, 0.0], (3.0, math.inf)),
                ([2.0, 4.0, 3.5], (3.0, math.inf)), ([-4.0, -5.5, -3.9, -4.2], (-math.inf, -3.0)),
                ([0.5, -0.2, 0.1, 0.3], (-3.0, 3.0)), ([4.0, 5.0, 3.5], (-3.0, 3.0)), ([1.0, 4.0, 2.0], (-3.0, 3.0)),
                ([-2.0, 1.0, 0.5], (-3.0, math.inf))]


@pytest.mark.parametrize("ds, region", REGION_CASES)
def test_inside_p_by_hand(ds, region):
    from scipy.stats import t as student

    from gspo_bench.reporting.paired import inside_p

    st = paired_summary(ds)
    n, mean = len(ds), sum(ds) / len(ds)
    se = statistics.stdev(ds) / math.sqrt(n)
    lo, hi = region
    # by hand: each finite edge a one-sided t test (above lo: H0 mean <= lo; below hi: H0 mean >= hi), the
    # larger p doubled (every edge must reject)
    ps = ([student.sf((mean - lo) / se, n - 1)] if math.isfinite(lo) else []) + \
         ([student.cdf((mean - hi) / se, n - 1)] if math.isfinite(hi) else [])
    assert inside_p(st, region) == pytest.approx(min(1.0, 2 * max(ps)))
    # the same one-sided tests as scipy's one-sample t test states them
    if math.isfinite(lo):
        assert student.sf((mean - lo) / se, n - 1) == pytest.approx(ttest_1samp(ds, lo, alternative="greater").pvalue)
    if math.isfinite(hi):
        assert student.cdf((mean - hi) / se, n - 1) == pytest.approx(ttest_1samp(ds, hi, alternative="less").pvalue)


@pytest.mark.parametrize("ds, region", REGION_CASES)
@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.2])
def test_region_test_decides_exactly_when_the_interval_lies_inside_or_outside(ds, region, alpha):
    from gspo_bench.reporting.paired import inside_p, outside_p, region_test

    st = paired_summary(ds, alpha=alpha)
    p, inside = region_test(st, region)
    p_in, p_out = inside_p(st, region), outside_p(st, region)
    assert p == pytest.approx(min(p_in, p_out)) and inside == (p_in <= p_out)
    lo, hi = region
    ci_lo, ci_hi = st.ci  # the two-sided (1 - alpha) t interval
    wholly_inside = lo < ci_lo and ci_hi < hi
    wholly_outside = ci_hi <= lo or ci_lo >= hi
    assert (p < alpha) == (wholly_inside or wholly_outside)
    if p < alpha:
        assert inside == wholly_inside


def test_region_test_against_zero_is_the_two_sided_paired_t_test():
    from gspo_bench.reporting.paired import region_test

    for ds in ([1.0, 2.0, 1.5, 3.0], [-1.0, -2.5, -0.5], [0.3, -0.2, 0.1, -0.4, 0.05], [-1.0, 2.0]):
        st = paired_summary(ds)
        p, inside = region_test(st, (0.0, math.inf))
        assert p == pytest.approx(ttest_1samp(ds, 0.0).pvalue) == pytest.approx(st.p)
        assert inside == (sum(ds) / len(ds) > 0)
        # and against any one edge e: the one-sample t test against e
        assert region_test(st, (1.0, math.inf))[0] == pytest.approx(ttest_1samp(ds, 1.0).pvalue)
        assert region_test(st, (-math.inf, 1.0))[0] == pytest.approx(ttest_1samp(ds, 1.0).pvalue)
        assert region_test(st, (-math.inf, 1.0))[1] == (sum(ds) / len(ds) < 1.0)


def test_region_test_of_an_equivalence_region_is_tost_by_hand():
    from scipy.stats import t as student

    from gspo_bench.reporting.paired import region_test

    # within (-3, +3): mean 0.175, sd 0.30, 4 pairs -> both one-sided tests reject at 0.025: equivalent
    ds = [0.5, -0.2, 0.1, 0.3]
    st = paired_summary(ds)
    n, mean, se = 4, 0.175, statistics.stdev(ds) / 2
    p_lo, p_hi = student.sf((mean + 3) / se, 3), student.cdf((mean - 3) / se, 3)
    p, inside = region_test(st, (-3.0, 3.0))
    assert inside and p == pytest.approx(2 * max(p_lo, p_hi)) and p < 0.05
    # beyond +3: 4, 5, 3.5 -> decided outside, the test of lying above +3
    ds = [4.0, 5.0, 3.5]
    st = paired_summary(ds)
    p, inside = region_test(st, (-3.0, 3.0))
    assert not inside and p == pytest.approx(2 * student.sf((st.mean - 3) / (st.sd / math.sqrt(3)), 2))
    assert p == pytest.approx(ttest_1samp(ds, 3.0, alternative="greater").pvalue * 2)
    # straddling +3 (1, 4, 2): neither side at 0.05
    p, _ = region_test(paired_summary([1.0, 4.0, 2.0]), (-3.0, 3.0))
    assert p > 0.05


def test_region_test_has_nothing_to_test_for_a_tie_one_pair_or_the_whole_line():
    from gspo_bench.reporting.paired import inside_p, region_test

    for region in ((3.0, math.inf), (-3.0, 3.0), (-math.inf, 3.0)):
        assert region_test(paired_summary([5.0, 5.0, 5.0]), region) is None  # a tie: no spread
        assert region_test(paired_summary([5.0]), region) is None  # one pair: no interval
        assert region_test(paired_summary([]), region) is None
        assert inside_p(paired_summary([5.0, 5.0]), region) is None and inside_p(paired_summary([1.0]), region) is None
    assert region_test(paired_summary([1.0, 2.0, 4.0]), (-math.inf, math.inf)) is None  # nothing claimed
