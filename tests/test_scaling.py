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
from gspo_bench.reporting.scaling import (COMPLETIONS, TOKENS, SeedCurve, compute_axis, extrapolate,
                                          fit_algorithm, fit_curve, scaling_curve, seed_curve)
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
    # steps 0, 10 and 20 only: two distinct C > 0 in the first half, no check
    short = {s: SeedCurve(c.steps[::2][:5], c.C[::2][:5], c.R[::2][:5]) for s, c in curves.items()}
    assert extrapolate(short) is None


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
    # steps 10 and 20 are two compute values: the first half cannot fix 3 parameters
    assert all("n/a (2 distinct C > 0 at steps <= 20" in r for r in rows)
    assert "ScaleRL reads two A as different only beyond its ±0.02 band" in out
    assert "dapo: dynamic sampling" in out


def test_leaderboard_fit_csv_holds_the_numbers(arith, capsys):
    assert main(["leaderboard", "--fit", "--runs", str(ARITH), "--fit-resamples", "20", "--fit-split", "0.75",
                 "--format", "csv"]) == 0
    back = {r["algo"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    grpo = back["grpo"]
    assert (grpo["x"], grpo["seeds"], grpo["points"], grpo["seed_fits"]) == ("completions", "8", "32", "8")
    assert float(grpo["r0"]) <= float(grpo["A"]) <= 1.0 and float(grpo["rms"]) < 0.06
    assert float(grpo["A_low"]) <= float(grpo["A"]) <= float(grpo["A_high"])
    # at 0.75 the check fits steps <= 30 (3 compute values) and predicts step 40's mean over the 8 seeds
    observed = np.mean([r.history["eval/pass1"][-1][1] for r in arith if r.algo == "grpo"])
    assert (grpo["cut_step"], grpo["final_step"]) == ("30.0", "40")
    assert float(grpo["observed_final"]) == pytest.approx(observed)
    assert float(grpo["abs_error"]) == pytest.approx(abs(float(grpo["predicted_final"]) - observed))
    assert float(grpo["abs_error"]) < 0.1


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
