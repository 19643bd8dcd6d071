"""The anytime-valid t confidence sequence (``reporting/sequential.py``): its closed form against the integral it
stands for, its interval against its evidence, and, on synthetic paired differences, that stopping at the first
decision keeps the false-decision rate at alpha where a t test repeated after each batch does not, and that a
large effect stops early."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from gspo_bench.reporting.paired import holm
from gspo_bench.reporting.sequential import (ABOVE, BELOW, MIXTURE_G, decide_family, log_e,
                                             multiplier, sequential_summary, versus_baseline)

ALPHA = 0.05
MAX_SEEDS = 20
LOOKS = [*range(3, MAX_SEEDS, 2), MAX_SEEDS]  # the suite's 3 configured seeds, then batches of 2, up to 20
STUDIES = 2000


def _mc_margin(rate: float, studies: int) -> float:
    """3 Monte-Carlo standard errors of a rate estimated from ``studies`` independent studies."""
    return 3 * math.sqrt(rate * (1 - rate) / studies)


# -- the formula -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 5])
def test_closed_form_is_the_scale_invariant_mixture_likelihood_ratio(n):
    # E_n = int int prod_i N(x_i; delta sigma, sigma^2) N(delta; 0, g) d(delta) dsigma/sigma
    #       / int prod_i N(x_i; 0, sigma^2) dsigma/sigma   (right-Haar over sigma), computed by quadrature
    x = np.random.default_rng(n).normal(0.6, 1.7, n)

    def num_at(s: float) -> float:
        f = lambda d: np.prod(stats.norm.pdf(x, d * s, s)) * stats.norm.pdf(d, 0, math.sqrt(MIXTURE_G))
        return integrate.quad(f, -40, 40, limit=200)[0] / s

    num = integrate.quad(num_at, 0, np.inf, limit=200)[0]
    den = integrate.quad(lambda s: np.prod(stats.norm.pdf(x, 0, s)) / s, 0, np.inf, limit=200)[0]
    t = x.mean() / (x.std(ddof=1) / math.sqrt(n))
    assert math.exp(log_e(t, n)) == pytest.approx(num / den, rel=1e-5)


def test_the_interval_edge_is_where_the_evidence_reaches_one_over_alpha():
    for n in (4, 5, 8, 20):
        c = multiplier(n, ALPHA)
        assert c is not None and math.exp(log_e(c, n)) == pytest.approx(1 / ALPHA)
        # wider than the fixed-n t interval: the price of looking at every n
        assert c > stats.t.ppf(1 - ALPHA / 2, n - 1)
    # below r^((n-1)/2) > 1/alpha no t is evidence enough: the whole line
    assert multiplier(3, ALPHA) is None and math.exp(log_e(math.inf, 3)) < 1 / ALPHA
    assert multiplier(1, ALPHA) is None


def test_summary_intersects_the_intervals_and_a_tie_is_no_evidence():
    st = sequential_summary([0.10, 0.12, 0.09, 0.11, 0.13, 0.10], ALPHA)
    assert st.n == 6 and st.mean == pytest.approx(0.108333, abs=1e-6) and st.p == pytest.approx(1 / st.e)
    lo, hi = st.ci
    # every prefix's interval holds the intersection, the last one included
    m, s = np.mean([0.10, 0.12, 0.09, 0.11, 0.13, 0.10]), np.std([0.10, 0.12, 0.09, 0.11, 0.13, 0.10], ddof=1)
    c = multiplier(6, ALPHA)
    assert m - c * s / math.sqrt(6) <= lo < hi <= m + c * s / math.sqrt(6)
    assert lo > 0 and st.p <= ALPHA and st.side == 1
    tie = sequential_summary([0.05] * 8, ALPHA)
    assert (tie.e, tie.p, tie.side, tie.ci) == (1.0, 1.0, 0, None)
    assert sequential_summary([0.3], ALPHA).ci is None and sequential_summary([], ALPHA).mean is None
    with pytest.raises(ValueError):
        sequential_summary([0.1, math.nan])


def test_family_uses_holm_over_the_sequential_p_and_intervals_at_alpha_over_k():
    rng = np.random.default_rng(7)
    diffs = {"big": list(rng.normal(1.0, 0.3, 10)), "neg": list(rng.normal(-1.0, 0.3, 10)),
             "none": list(rng.normal(0.0, 0.3, 10)), "few": [0.4]}
    fam = decide_family(diffs, ALPHA)
    assert [fam[k].decision for k in diffs] == [ABOVE, BELOW, None, None]
    assert all(d.stat.level == pytest.approx(ALPHA / 4) for d in fam.values())
    assert [fam[k].p_holm for k in diffs] == pytest.approx(holm([fam[k].stat.p for k in diffs]))
    rng = np.random.default_rng(3)
    for ps in ([0.01, 0.04, 0.03, 0.2], [1.0, 1.0, 0.001], rng.uniform(0, 0.2, 9).tolist(), [0.5]):
        from statsmodels.stats.multitest import multipletests

        assert holm(ps) == pytest.approx(list(multipletests(ps, method="holm")[1]))
    # versus_baseline pairs by seed in seed order: "10" after "9"
    finals = {"grpo": {str(s): 0.5 for s in range(11)}, "x": {str(s): 0.5 + 0.01 * s for s in range(11)}}
    assert versus_baseline(finals, "grpo")["x"].stat.mean == pytest.approx(0.05)
    assert versus_baseline({"x": {"0": 1.0}}, "grpo") == {}


# -- simulated studies -------------------------------------------------------------------------------------------
def _first_decision(x: np.ndarray, decide) -> int | None:
    """The first look at which ``decide(differences so far)`` decides, or None: the study stops there."""
    for n in LOOKS:
        if decide(x[:n]):
            return n
    return None


def _naive_rejects(studies: np.ndarray, n: int) -> np.ndarray:
    """Per study (row), whether the fixed-n two-sided paired t test on its first ``n`` differences rejects."""
    x = studies[:, :n]
    # t = d_bar / (s_d / sqrt(n)),  p = 2 P(T_{n-1} > |t|)
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
    return 2 * stats.t.sf(np.abs(t), n - 1) < ALPHA


def _sequential(xs: np.ndarray) -> bool:
    return sequential_summary(xs.tolist(), ALPHA).p <= ALPHA


def test_stopping_at_the_first_decision_keeps_the_false_decision_rate_at_alpha_and_the_naive_test_does_not():
    rng = np.random.default_rng(20240601)
    sds = (0.004, 0.05, 1.0, 30.0)  # the rule is scale-free: a true mean of 0 at any spread
    studies = np.stack([rng.normal(0.0, sds[i % len(sds)], MAX_SEEDS) for i in range(STUDIES)])
    seq = sum(_first_decision(x, _sequential) is not None for x in studies) / STUDIES
    # the naive rule stops at the first look whose t test rejects: a false decision if any look does
    naive = float(np.mean(np.any([_naive_rejects(studies, n) for n in LOOKS], axis=0)))
    print(f"\nfalse-decision rate over {STUDIES} null studies, looks at {LOOKS}: sequential {seq:.4f}, "
          f"naive repeated t {naive:.4f} (alpha {ALPHA})")
    # (a) at most alpha, up to 3 Monte-Carlo standard errors of a rate of alpha
    assert seq <= ALPHA + _mc_margin(ALPHA, STUDIES)
    # (b) the repeated t test is far above alpha: more than alpha + 3 standard errors, and at least 2.5 alpha
    assert naive > ALPHA + _mc_margin(ALPHA, STUDIES) and naive > 2.5 * ALPHA
    # and each look alone is a 5 % test: the excess is the repeated looking, not the test
    for n in (LOOKS[0], LOOKS[-1]):
        assert np.mean(_naive_rejects(studies, n)) <= ALPHA + _mc_margin(ALPHA, STUDIES)
    assert _naive_rejects(studies[:3], 5).tolist() == [stats.ttest_1samp(x[:5], 0.0).pvalue < ALPHA
                                                       for x in studies[:3]]


def test_a_family_grown_only_where_undecided_keeps_its_familywise_rate():
    """The suite's rule on a scenario of one baseline and 4 algorithms, no true difference: per seed a shared
    luck (the warm start and prompts) plus each algorithm's own noise; seeds added only to the undecided ones
    by the planner itself. Any decision is a false one."""
    from gspo_bench.suite.until_decided import next_cells, scenario_seeds

    rng = np.random.default_rng(11)
    algos, studies, falses = ["grpo", "a", "b", "c", "d"], 600, 0
    for _ in range(studies):
        luck, noise = rng.normal(0.5, 0.1, MAX_SEEDS), rng.normal(0.0, 0.03, (len(algos), MAX_SEEDS))
        value = {a: luck + noise[i] for i, a in enumerate(algos)}
        finals = {a: {str(s): float(value[a][s]) for s in range(3)} for a in algos}
        while cells := next_cells(finals, scenario_seeds([0, 1, 2], finals), algos, "grpo", MAX_SEEDS, 2):
            for a, s in cells:
                finals[a][str(s)] = float(value[a][s])
        falses += any(d.decision for d in versus_baseline(finals, "grpo").values())
    rate = falses / studies
    print(f"\nfamilywise false-decision rate, 4 comparisons grown until decided: {rate:.4f} over {studies} studies")
    assert rate <= ALPHA + _mc_margin(ALPHA, studies)


def test_a_large_effect_stops_with_far_fewer_seeds_than_the_maximum():
    rng = np.random.default_rng(5)
    effect, studies = 1.5, 1000  # a true mean of 1.5 sd of the paired differences
    stops = [_first_decision(rng.normal(effect, 1.0, MAX_SEEDS), _sequential) for _ in range(studies)]
    decided = [n for n in stops if n is not None]
    mean_stop = float(np.mean([MAX_SEEDS if n is None else n for n in stops]))
    saving = 1 - mean_stop / MAX_SEEDS
    print(f"\neffect {effect} sd: decided in {len(decided) / studies:.3f} of {studies} studies, mean stop "
          f"{mean_stop:.2f} of {MAX_SEEDS} seeds (saving {saving:.0%})")
    assert len(decided) / studies >= 0.95
    assert mean_stop <= 0.6 * MAX_SEEDS
    # every decision on this effect is "above": the sign comes from the data
    assert all(sequential_summary(rng.normal(effect, 1.0, 12).tolist(), ALPHA).side >= 0 for _ in range(50))


def test_a_comparison_a_claim_registers_is_decided_against_its_edge():
    from gspo_bench.reporting.claim_specs import sequence_edges
    from gspo_bench.reporting.sequential import edge_of, sequential_summary, versus_baseline
    from gspo_bench.reporting.suite_summary import sequential_json, sequential_markdown

    # the claims register suite-long's gspo - grpo as "> +3": its sequence is decided against +3 points
    assert sequence_edges("suite-long", ["grpo", "gspo", "dr_grpo"], "grpo") == {"gspo": 0.03}
    assert sequence_edges("my-suite-long", ["grpo", "gspo"], "grpo") == {}  # another experiment: against 0
    assert edge_of((3.0, math.inf)) == 0.03 and edge_of((-math.inf, -3.0)) == -0.03
    assert edge_of((-3.0, 3.0)) is None and edge_of(None) is None
    rng = np.random.default_rng(3)
    base = {str(s): 0.5 for s in range(12)}
    for lead, want in ((0.08, "above +3"), (0.0, "below +3")):
        gspo = {str(s): 0.5 + lead + float(rng.normal(0, 0.01)) for s in range(12)}
        got = versus_baseline({"grpo": base, "gspo": gspo}, "grpo", edges={"gspo": 0.03})["gspo"]
        ds = [gspo[str(s)] - 0.5 for s in range(12)]
        # by hand: the sequence of d - 0.03 against 0, shifted back by 0.03
        by_hand = sequential_summary([d - 0.03 for d in ds], 0.05)
        assert got.stat.p == pytest.approx(by_hand.p) and got.edge == 0.03 and got.decision == want
        assert got.stat.mean == pytest.approx(np.mean(ds))
        assert got.stat.ci == pytest.approx((by_hand.ci[0] + 0.03, by_hand.ci[1] + 0.03))
        # against 0, the same data: a null lead is not "below 0"
        plain = versus_baseline({"grpo": base, "gspo": gspo}, "grpo")["gspo"]
        assert plain.edge == 0.0 and (plain.decision == ABOVE if lead else plain.decision != "below +3")
    seq = sequential_json({"long": {"grpo": base, "gspo": gspo}}, "grpo", 12, 2, 1, edges={"long": {"gspo": 0.03}})
    assert seq["scenarios"]["long"]["gspo"]["edge"] == 0.03
    page = "\n".join(sequential_markdown(seq, {"long": list(range(12))}))
    assert "| `long` | `gspo` (claimed edge +3) |" in page and "**below +3**" in page
