"""Compute-scaling fits (``reporting/scaling.py``, ``scaling_table.py``): ScaleRL's curve on synthetic curves
with known parameters, the compute axis by hand, and ``leaderboard --fit`` on the arith-default runs table.

Synthetic curves: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) with A = 0.8, B = 1.5, C_mid = 5120 (the
completions of 10 steps at 64 prompts x 8 samples), R0 = 0.3, evaluated every 5 steps from 0 to 60 with
Gaussian noise of sd 0.005 (a fixed numpy Generator).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
import pytest
from mlflow_fakes import one_line

from gspo_bench.cli.main import main
from gspo_bench.reporting.frame import RunData, history_keys, read_frame, runs_of
from gspo_bench.reporting.scaling import (COMPLETIONS, TOKENS, SeedCurve, bound_sides, compute_axis, extrapolate,
                                          fit_algorithm, fit_curve, fit_log_line, log_line, scaling_curve,
                                          seed_curve)
from gspo_bench.reporting.scaling_table import check_metric, fit_metrics, render_scaling, scaling_groups

TRUE = {"A": 0.8, "B": 1.5, "C_mid": 5120.0, "R0": 0.3}
PER_STEP = 64 * 8  # completions per RL step
STEPS = np.arange(0, 61, 5)
# the arith-default runs as they were before the dev split (no length histories: the completions axis), frozen
# here so that re-running that results folder does not move these numbers
ARITH = Path(__file__).parent / "data" / "arith-default-before-dev-split.csv.gz"


def _curve(rng: np.random.Generator, noise: float = 0.005, steps=STEPS, **true) -> SeedCurve:
    p = {**TRUE, **true}
    C = steps * float(PER_STEP)
    R = scaling_curve(C, p["A"], p["B"], p["C_mid"], p["R0"]) + rng.normal(0.0, noise, len(C))
    R[0] = p["R0"]  # the warm start, measured at step 0
    return SeedCurve(np.array(steps), C, R)


def _run(seed: int, evals, history=None, params=None, algo: str = "grpo") -> RunData:
    return RunData(f"{algo}-{seed}", "FINISHED", {"algo": algo, "seed": str(seed), "task": "arith",
                                                   "model": "tiny-dense", "preset": "default"},
                   {"rollout.prompts_per_step": "64", "rollout.group_size": "8", **(params or {})}, {},
                   {"eval/pass1": list(evals), **(history or {})})


def test_the_curve_starts_at_r0_is_halfway_at_c_mid_and_tends_to_a():
    A, B, C_mid, R0 = 0.8, 1.5, 1000.0, 0.3
    got = scaling_curve([0.0, C_mid, 2 * C_mid, 1e12], A, B, C_mid, R0)
    # R(2 C_mid) = R0 + (A - R0) / (1 + 2^-B) = 0.3 + 0.5 / (1 + 0.35355) = 0.66940
    assert got == pytest.approx([0.3, 0.55, 0.3 + 0.5 / (1 + 2 ** -1.5), 0.8], abs=1e-5)
    assert got[2] == pytest.approx(0.66940, abs=1e-5)


def test_a_noisy_curve_gives_back_its_parameters():
    rng = np.random.default_rng(0)
    c = _curve(rng)
    fit = fit_curve(c.C, c.R)
    assert fit is not None and fit.r0_fixed and fit.R0 == 0.3 and fit.n == len(STEPS) - 1
    assert fit.A == pytest.approx(0.8, abs=0.02) and fit.B == pytest.approx(1.5, rel=0.15)
    assert fit.C_mid == pytest.approx(5120, rel=0.1)
    assert fit.rms < 0.008  # the residuals are the noise (sd 0.005)
    # without the step-0 point R0 is a fourth parameter, fitted
    free = fit_curve(c.C[1:], c.R[1:])
    assert free is not None and not free.r0_fixed
    assert free.R0 == pytest.approx(0.3, abs=0.05) and free.A == pytest.approx(0.8, abs=0.03)
    # exact points: exact parameters
    exact = fit_curve(c.C, scaling_curve(c.C, 0.7, 2.0, 5000.0, 0.3))
    assert (exact.A, exact.B, exact.C_mid) == pytest.approx((0.7, 2.0, 5000.0), rel=1e-4)


def test_too_few_distinct_compute_values_give_no_fit():
    C = np.array([0.0, 1000.0, 2000.0])
    assert fit_curve(C, [0.3, 0.5, 0.6]) is None  # R0 fixed: 2 points for 3 parameters
    # many seeds at the same two C values still pin only two points of the curve
    many = np.tile(C, 8)
    assert fit_curve(many, np.tile([0.3, 0.5, 0.6], 8) + np.linspace(0, 0.01, 24)) is None
    assert fit_curve([0.0, 1000.0, 2000.0, 4000.0], [0.3, 0.5, 0.6, 0.65]) is not None  # 3 for 3
    assert fit_curve([1000.0, 2000.0, 4000.0], [0.5, 0.6, 0.65]) is None  # R0 fitted: 4 parameters
    assert fit_curve([0.0, 1.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]) is None  # R0 = 1: no room to gain
    assert fit_curve([], []) is None


def test_the_bootstrap_interval_over_seeds_covers_the_true_asymptote():
    rng = np.random.default_rng(100)
    curves = {str(s): _curve(rng, noise=0.01) for s in range(6)}  # 6 seeds, evaluation noise sd 0.01
    fit = fit_algorithm(curves, np.random.default_rng(0), n_boot=200)
    assert fit.pooled.A == pytest.approx(0.8, abs=0.02)
    assert fit.boot == 200 and fit.boot_ok == 200 and all(p is not None for p in fit.per_seed)
    lo, hi = fit.intervals["A"]
    assert lo < 0.8 < hi and hi - lo < 0.05
    lo, hi = fit.intervals["C_mid"]
    assert lo < 5120 < hi
    # a seeded Generator: the same intervals again
    assert fit_algorithm(curves, np.random.default_rng(0), n_boot=200).intervals == fit.intervals
    # and over 12 such sets of seeds (this one first) the 95 % interval holds the true A in at least 11 of them
    # (all 12 do; 38 of 40 sets did)
    covered = 0
    for k in range(12):
        sets = np.random.default_rng(100 + k)
        lo, hi = fit_algorithm({str(s): _curve(sets, noise=0.01) for s in range(6)}, np.random.default_rng(0),
                               n_boot=60).intervals["A"]
        covered += lo < 0.8 < hi
    assert covered >= 11
    # one seed: fits, no interval
    one = fit_algorithm({"0": curves["0"]}, np.random.default_rng(0), n_boot=200)
    assert one.pooled is not None and one.intervals is None and one.boot == 0


def test_the_first_half_predicts_the_final_evaluation():
    rng = np.random.default_rng(2)
    curves = {str(s): _curve(rng) for s in range(3)}
    e = extrapolate(curves)
    assert e.cut_step == 30 and e.final_step == 60
    true_final = float(scaling_curve(60 * PER_STEP, **TRUE))  # 0.3 + 0.5 / (1 + 6^-1.5) = 0.7682
    assert e.observed == pytest.approx(true_final, abs=0.01)
    assert e.predicted == pytest.approx(true_final, abs=0.02) and e.error < 0.02
    assert e.error == pytest.approx(abs(e.predicted - e.observed))
    # steps 0, 10, ..., 40: two compute points (steps 10 and 20) in the first half, no check by the curve
    short = {s: SeedCurve(c.steps[::2][:5], c.C[::2][:5], c.R[::2][:5]) for s, c in curves.items()}
    e = extrapolate(short)
    assert (e.points, e.free, e.fit, e.predicted, e.error) == (2, 3, None, None, None)
    assert e.line_error is not None  # a line has 2 parameters: 2 points determine it


# steps 0, 2, 4, 8, 16 at 512 completions a step: C = 0, 1024, 2048, 4096, 8192, each C twice the one before;
# the score gains 0.1 at each doubling, a straight line in log C that does not bend: a curve levelling off below
# 1 would have to bend, so the fit drives A to its bound 1
BOUND_STEPS = [0, 2, 4, 8, 16]
BOUND_R = [0.3, 0.5, 0.6, 0.7, 0.8]


def _rows(md: str, algo: str = "grpo") -> list[str]:
    """The cells of ``algo``'s row of a Markdown fits table."""
    (row,) = [line for line in md.splitlines() if line.startswith(f"| {algo} |")]
    return [c.strip() for c in row.strip("|").split("|")]


def test_a_parameter_at_its_bound_is_reported_as_not_identified_without_an_interval(capsys):
    # within 1/1000 of the range's width from an end: 0.9995 is at 1 on [0, 1], 0.0015 is not at 0
    assert bound_sides([0.9995, 5.0, 0.0015, 0.012], [0.0, 0.01, 0.0, 0.01], [1.0, 10.0, 1.0, 10.0]) == [
        1, None, None, 0]
    C = np.array(BOUND_STEPS) * float(PER_STEP)
    fit = fit_curve(C, BOUND_R)
    assert fit.A == pytest.approx(1.0, abs=1e-6) and fit.at_bound == (("A", 1.0),)
    assert fit.bound("A") == 1.0 and fit.bound("B") is None and fit.bound("C_mid") is None
    # a curve that bends below 1 has no parameter at a bound
    assert fit_curve(C, scaling_curve(C, 0.7, 2.0, 2000.0, 0.3)).at_bound == ()
    # a jump between C = 2048 and 4096: the steepest B allowed, 10, at its bound
    jump = fit_curve(C, [0.3, 0.3, 0.3, 0.7, 0.7])
    assert jump.bound("B") == 10.0 and jump.bound("A") is None and jump.A == pytest.approx(0.7, abs=0.01)

    # three seeds, 0.01 apart after the warm start: every seed and every resample puts A at 1, and the table
    # printed it as "1.000 [1.000, 1.000] bound", an interval of zero width that reads as a measurement
    runs = [_run(s, zip(BOUND_STEPS, [0.3] + [r + 0.01 * s for r in BOUND_R[1:]])) for s in range(3)]
    (g,) = scaling_groups(runs, n_boot=40)
    f = g.algos[0].fit
    assert f.pooled.bound("A") == 1.0 and f.boot_ok == 40 and set(f.intervals) == {"B", "C_mid"}
    cells = _rows(render_scaling([g]))
    assert cells[3] == "at bound 1: not identified" and "[" in cells[4] and "[" in cells[5]
    assert cells[7] == "n/a (0/3; 3 at a bound)"  # A per seed: no seed's A is identified either
    assert "1.000" not in " ".join(cells[3:8])
    (row,) = csv.DictReader(io.StringIO(render_scaling([g], "csv")))
    assert (row["A"], row["A_low"], row["A_high"], row["A_at_bound"]) == ("", "", "", "1.0")
    assert float(row["B_low"]) <= float(row["B"]) <= float(row["B_high"]) and row["B_at_bound"] == ""
    assert (row["seed_fits"], row["seed_fits_at_bound"], row["A_seed_mean"]) == ("3", "3", "")
    # B at its bound in a table: not identified, no interval
    steep = [_run(s, zip(BOUND_STEPS, [0.3, 0.3 + 0.01 * s, 0.3, 0.7 + 0.01 * s, 0.7])) for s in range(3)]
    (g,) = scaling_groups(steep, n_boot=20)
    assert _rows(render_scaling([g]))[4] == "at bound 10: not identified"
    (row,) = csv.DictReader(io.StringIO(render_scaling([g], "csv")))
    assert (row["B"], row["B_low"], row["B_at_bound"]) == ("", "", "10.0")


def _token_runs(steps, n_seeds: int = 3) -> list[RunData]:
    """Runs on the token axis whose seeds write different lengths (seed s: 16 + s tokens a completion), so
    that each seed has its own C at every evaluation step; scores from the synthetic curve."""
    out = []
    for s in range(n_seeds):
        length = {"response/length_mean": [(t, 16.0 + s) for t in range(1, max(steps) + 1)]}
        C = np.array(steps) * float(PER_STEP) * 16
        R = scaling_curve(C, **TRUE) + 0.002 * s
        R[0] = TRUE["R0"]
        out.append(_run(s, zip(steps, R.tolist()), length))
    return out


def test_a_fit_with_fewer_compute_points_than_parameters_is_not_shown():
    # 3 seeds evaluated at steps 0, 10, 20 on the token axis: 6 distinct C > 0, but two places of the curve,
    # 2 compute points for 3 parameters (the fit on the 6 values was printed before)
    (g,) = scaling_groups(_token_runs([0, 10, 20]), n_boot=20)
    a = g.algos[0]
    assert g.unit == TOKENS and len({float(x) for c in a.curves.values() for x in c.C if x > 0}) == 6
    assert (a.fit.points, a.fit.free, a.fit.pooled, a.fit.intervals) == (2, 3, None, None)
    cells = _rows(render_scaling([g]))
    assert cells[3] == "n/a: 2 compute points for 3 parameters" and cells[4:7] == ["-", "-", "-"]
    # the check fits steps <= 10: one compute point, neither the curve nor the line
    assert cells[8] == "n/a: 1 compute point at steps <= 10 for 3 parameters" and cells[10:] == ["-", "-"]
    (row,) = csv.DictReader(io.StringIO(render_scaling([g], "csv")))
    assert (row["compute_points"], row["A"], row["B"], row["predicted_final"]) == ("2", "", "", "")

    # steps 0, 10, ..., 40: the full fit has 4 points and is shown; its first half (steps 10 and 20) has 2, and
    # its check is not (report.md printed it), while the line's, 2 points for 2 parameters, is
    (g,) = scaling_groups(_token_runs([0, 10, 20, 30, 40]), n_boot=20)
    e = g.algos[0].extrapolation
    assert g.algos[0].fit.pooled is not None and (e.points, e.predicted) == (2, None) and e.line is not None
    cells = _rows(render_scaling([g]))
    assert cells[3].startswith("0.") and cells[8] == "n/a: 2 compute points at steps <= 20 for 3 parameters"
    assert cells[9] == f"{e.observed:.3f}" and cells[10] == "-" and cells[11] == f"{e.line_error:.3f}"
    (row,) = csv.DictReader(io.StringIO(render_scaling([g], "csv")))
    assert (row["check_points"], row["predicted_final"], row["abs_error"]) == ("2", "", "")
    assert float(row["line_abs_error"]) == pytest.approx(e.line_error)


def test_the_straight_line_in_log_compute_is_least_squares_and_is_shown_beside_the_curve():
    # R = 0.5 + 0.1 log2(C / 1000) through three points: slope 0.1 / ln 2, and 0.8 at C = 8000
    a, b = fit_log_line([0.0, 1000.0, 2000.0, 4000.0], [0.3, 0.5, 0.6, 0.7])  # C = 0 left out
    assert b == pytest.approx(0.1 / math.log(2)) and a == pytest.approx(0.5 - 0.1 * math.log2(1000))
    assert float(log_line(8000.0, a, b)) == pytest.approx(0.8)
    assert fit_log_line([1000.0, 1000.0], [0.5, 0.6]) is None  # one distinct C: no line
    # noisy points: the same numbers as numpy.polyfit of R on ln C
    rng = np.random.default_rng(6)
    C, R = rng.uniform(100, 1e5, 12), rng.uniform(0.3, 0.8, 12)
    assert fit_log_line(C, R) == pytest.approx(tuple(np.polyfit(np.log(C), R, 1)[::-1]))

    # the check: the line fitted to the same points as the curve (steps <= 30, C > 0, every seed), its
    # prediction of each seed's final C averaged, against the mean observed final score
    rng = np.random.default_rng(2)
    curves = {str(s): _curve(rng) for s in range(3)}
    e = extrapolate(curves)
    early = [(c.C[m], c.R[m]) for c in curves.values() for m in [(c.steps <= 30) & (c.C > 0)]]
    slope, intercept = np.polyfit(np.log(np.concatenate([x for x, _ in early])),
                                  np.concatenate([y for _, y in early]), 1)
    line_final = np.mean([intercept + slope * math.log(c.C[-1]) for c in curves.values()])
    observed = np.mean([c.R[-1] for c in curves.values()])
    assert e.line_predicted == pytest.approx(line_final) and e.line_error == pytest.approx(abs(line_final - observed))
    # the curve saturates after step 30 and a line in log C does not: here the curve earns its parameters
    assert e.error < 0.02 < e.line_error
    runs = [_run(s, zip(STEPS.tolist(), c.R.tolist())) for s, c in curves.items()]
    (g,) = scaling_groups(runs, n_boot=0)
    md = render_scaling([g])
    assert "| error | line in log C: error |" in md
    cells = _rows(md)
    assert cells[10:] == [f"{g.algos[0].extrapolation.error:.3f}", f"{e.line_error:.3f}"]


def test_compute_by_hand_completions_rounds_and_tokens():
    run = _run(0, [(0, 0.4), (2, 0.5), (3, 0.6)], {"response/length_mean": [(1, 10.0), (2, 20.0), (3, 30.0)]})
    assert compute_axis(run, [0, 2, 3]).tolist() == [0.0, 2 * 512.0, 3 * 512.0]
    # tokens: 512 x (10 + 20) at step 2, + 512 x 30 at step 3
    assert compute_axis(run, [0, 2, 3], TOKENS).tolist() == [0.0, 512.0 * 30, 512.0 * 60]
    # DAPO's dynamic sampling: 3 rounds at step 2 draw 3 rollouts
    dapo = _run(0, [], {"dynamic/gen_batches": [(1, 1.0), (2, 3.0)]})
    assert compute_axis(dapo, [1, 2], COMPLETIONS).tolist() == [512.0, 4 * 512.0]
    # the resolved param wins over the configured one
    resolved = _run(0, [], params={"resolved.rollout.prompts_per_step": "32"})
    assert compute_axis(resolved, [1]).tolist() == [256.0]
    no_length = _run(0, [], {"response/length_mean": [(1, 10.0), (3, 30.0)]})
    assert compute_axis(no_length, [3], TOKENS) is None  # step 2's length is missing
    assert compute_axis(RunData("x", "FINISHED", {}, {}, {}), [1]) is None  # no rollout params
    assert seed_curve(run, "eval/pass1").C.tolist() == [0.0, 1024.0, 1536.0]


def test_groups_take_tokens_only_when_every_run_has_them():
    rng = np.random.default_rng(3)
    length = {"response/length_mean": [(s, 16.0) for s in range(1, 61)]}
    runs = [_run(s, zip(STEPS.tolist(), _curve(rng).R.tolist()), length) for s in range(3)]
    (g,) = scaling_groups(runs, n_boot=0)
    assert g.unit == TOKENS and g.algos[0].curves["0"].C[-1] == 60 * 512 * 16
    (g,) = scaling_groups(runs + [_run(9, zip(STEPS.tolist(), _curve(rng).R.tolist()))], n_boot=0)
    assert g.unit == COMPLETIONS and g.algos[0].fit.pooled.C_mid == pytest.approx(5120, rel=0.1)
    assert fit_metrics(runs) == ["eval/pass1"]


def test_history_keys_take_a_prefix_pattern():
    latest = {"eval/pass1": 1, "eval/mean_at_4": 1, "eval/mean_at_1": 1, "collapse/x": 1, "reward/mean": 1}
    assert history_keys(latest, ("eval/pass1", "eval/mean_at_*", "gone")) == [
        "eval/pass1", "eval/mean_at_1", "eval/mean_at_4", "collapse/x"]


@pytest.fixture(scope="module")
def arith():
    return runs_of(read_frame(ARITH))


def test_leaderboard_fit_on_the_arith_default_runs(arith, capsys):
    assert main(["leaderboard", "--fit", "--runs", str(ARITH), "--fit-resamples", "20"]) == 0
    out = capsys.readouterr().out
    assert "arith / tiny-dense: eval/pass1 against completions generated, C up to 20.5k" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| algo")]
    algos = sorted({r.algo for r in arith})
    assert len(algos) == 13 and sorted(r.split(" | ")[0][2:] for r in rows) == algos
    # R0 = the mean step-0 eval/pass1 over every seed (the warm starts): the same for every algorithm
    r0 = np.mean([r.history["eval/pass1"][0][1] for r in arith if r.algo == "grpo"])
    assert all(f"| 8 | {r0:.3f} |" in r for r in rows)
    # steps 10 and 20 are two compute points: the first half cannot fix 3 parameters
    assert all("| n/a: 2 compute points at steps <= 20 for 3 parameters |" in r for r in rows)
    assert "ScaleRL reads two A as different only beyond its ±0.02 band" in out
    assert "dapo: dynamic sampling" in out


def test_leaderboard_fit_csv_holds_the_numbers(arith, capsys):
    assert main(["leaderboard", "--fit", "--runs", str(ARITH), "--fit-resamples", "20", "--fit-split", "0.75",
                 "--format", "csv"]) == 0
    back = {r["algo"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    grpo = back["grpo"]
    assert (grpo["x"], grpo["seeds"], grpo["points"], grpo["compute_points"]) == ("completions", "8", "32", "4")
    # grpo's A sits at its bound 1 (the runs still rise at step 40): no value, no interval, the bound instead
    assert (grpo["A"], grpo["A_low"], grpo["A_high"], grpo["A_at_bound"]) == ("", "", "", "1.0")
    assert grpo["seed_fits"] == "8" and 0 < int(grpo["seed_fits_at_bound"]) < 8 and float(grpo["rms"]) < 0.06
    assert float(grpo["B_low"]) <= float(grpo["B"]) <= float(grpo["B_high"]) and grpo["B_at_bound"] == ""
    luspo = back["luspo"]
    assert float(luspo["r0"]) <= float(luspo["A_low"]) <= float(luspo["A"]) < 1.0 and luspo["A_at_bound"] == ""
    # at 0.75 the check fits steps <= 30 (3 compute values) and predicts step 40's mean over the 8 seeds
    observed = np.mean([r.history["eval/pass1"][-1][1] for r in arith if r.algo == "grpo"])
    assert (grpo["cut_step"], grpo["final_step"]) == ("30.0", "40")
    assert float(grpo["observed_final"]) == pytest.approx(observed)
    assert float(grpo["abs_error"]) == pytest.approx(abs(float(grpo["predicted_final"]) - observed))
    assert float(grpo["abs_error"]) < 0.1 and grpo["check_points"] == "3"
    assert float(grpo["line_abs_error"]) == pytest.approx(abs(float(grpo["line_predicted_final"]) - observed))


def test_fit_with_a_metric_no_run_has_is_one_line_exit_2(capsys):
    assert main(["leaderboard", "--fit", "eval/nope", "--runs", str(ARITH)]) == 2
    text = one_line(capsys)
    assert "--fit 'eval/nope'" in text and "eval/pass1" in text
    assert main(["leaderboard", "--fit", "--paired", "--runs", str(ARITH)]) == 2
    assert "--paired and --target-mde" in one_line(capsys)


def test_a_metric_outside_0_1_is_refused():
    runs = [_run(0, [(0, 0.4)], {"response/length_mean": [(1, 30.0)]})]
    from gspo_bench.config import ConfigError

    with pytest.raises(ConfigError, match="values from 30 to 30"):
        check_metric(runs, "response/length_mean")


def test_the_report_section_draws_the_fits(tmp_path):
    from gspo_bench.reporting.report import scaling_section

    rng = np.random.default_rng(4)
    runs = [_run(s, zip(STEPS.tolist(), _curve(rng).R.tolist()), algo=a) for a in ("grpo", "gspo") for s in range(3)]
    groups = scaling_groups(runs, n_boot=50)
    md, figs = scaling_section(groups, "arith / tiny-dense", "arith_tiny-dense", tmp_path)
    text = "\n".join(md)
    assert [f.name for f in figs] == ["scaling_arith_tiny-dense.png"]
    assert figs[0].read_bytes().startswith(b"\x89PNG") and "](scaling_arith_tiny-dense.png)" in text
    assert "**eval/pass1** against completions generated, C up to 30.7k" in text
    assert text.count("| grpo | 3 | 0.300 |") == 1 and text.count("| gspo | 3 | 0.300 |") == 1
    render = render_scaling(groups)
    a = groups[0].algos[0].fit.pooled.A
    assert math.isclose(a, 0.8, abs_tol=0.02) and f"| {a:.3f} [" in render
    md, figs = scaling_section([], "t", "n", tmp_path)
    assert figs == [] and "Skipped" in md[2]


def test_leaderboard_fit_reads_the_token_axis_and_mean_at_k_from_mlflow(tmp_path_factory, capsys):
    from mlflow_fakes import log_run, new_store

    uri, client, ids = new_store(tmp_path_factory, "scaling", "fit")
    rng = np.random.default_rng(5)
    steps = STEPS[:9].tolist()  # 0..40 every 5
    for seed in range(3):
        c = _curve(rng, steps=STEPS[:9])
        # 16 tokens a completion on every step: C in tokens = 16 x the completions
        extra = [("response/length_mean", s, 16.0) for s in range(1, 41)]
        extra += [("eval/mean_at_2", s, v / 2) for s, v in zip(steps, c.R)]
        log_run(client, ids["fit"], algo="grpo", seed=seed, evals=zip(steps, c.R.tolist()), steps=40, metrics=extra,
                params={"rollout.prompts_per_step": "64", "rollout.group_size": "8"})
    assert main(["leaderboard", "--tracking-uri", uri, "--experiment", "fit", "--fit", "--fit-resamples", "30",
                 "--format", "csv"]) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert (row["x"], row["seeds"], row["points"]) == ("tokens", "3", "24")
    assert float(row["C_mid"]) == pytest.approx(16 * 5120, rel=0.15) and float(row["A"]) == pytest.approx(0.8, abs=0.03)
    assert main(["leaderboard", "--tracking-uri", uri, "--experiment", "fit", "--fit", "eval/mean_at_2",
                 "--fit-resamples", "0", "--fit-x", "completions", "--format", "csv"]) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    # mean@2 is half of pass@1 here: R0 0.15, A about 0.4
    assert row["x"] == "completions" and float(row["r0"]) == pytest.approx(0.15) and row["A_low"] == ""
    assert float(row["A"]) == pytest.approx(0.4, abs=0.03)


def test_tokens_asked_of_runs_without_lengths_is_one_line_exit_2(capsys):
    assert main(["leaderboard", "--fit", "--fit-x", "tokens", "--runs", str(ARITH)]) == 2
    text = one_line(capsys)
    assert "--fit-x tokens: no FINISHED run has a response/length_mean value" in text and "completions" in text
