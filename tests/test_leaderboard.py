"""Leaderboard numbers by hand on a synthetic MLflow store; md/csv round trips; CLI errors.

The store (``build_store``, also used by test_report.py), experiment ``bench``:

| run            | eval/pass1 @ 0, 10, 20 | clip/frac @ 1..4 | wall s | other                          |
|----------------|------------------------|------------------|--------|--------------------------------|
| grpo s0        | .40 .45 .60            | .01 .02 0 .03    | 8      |                                |
| grpo s1        | .40 .55 .50            | .02 x4           | 12     |                                |
| gspo s0        | .40 .50 .70            | .3 .5 .4 .4      | 10     | moe, collapse reward_drop @ 15 |
| gspo s1        | .42 .47 .51            | .4 x4            | 10     | moe                            |
| dapo s0 FAILED | .99 x3 (must never be averaged)                                                |
| dapo s1 RUNNING| .99 x3 (must never be averaged)                                                |
| grpo s0 tuned  | .40 .60 .80            | .05 x4           | 10     | tag tuning=tuned: own group    |

gspo s0 also has ``ratios/step_0010.json`` and ``step_0020.json`` artifacts.
Every finished run logs reward/mean at steps 1..20 and uses 4 prompts x 2
samples, so completions/s = 4 * 2 * 20 / wall.
"""

from __future__ import annotations

import csv
import math
import io
import statistics
import time

import mlflow
import numpy as np
import pytest
from mlflow.entities import Metric, Param

from gspo_bench.cli.main import main
from gspo_bench.reporting.leaderboard import auc, collect, render, steps_to_gain

EXP = "bench"
EVAL_STEPS = (0, 10, 20)


def _run(client, exp_id, algo, seed, status="FINISHED", eval_=(), clip=(), wall=10.0, tags=None, extra=None):
    run = client.create_run(exp_id, run_name=f"{algo}-s{seed}",
                            tags={"algo": algo, "task": "arith", "model": "tiny-dense", "seed": str(seed),
                                  "preset": "default", "moe": "false", "git.commit": "abc1234",
                                  "machine": "test box", "collapse.count": "0", **(tags or {})})
    rid, now = run.info.run_id, int(time.time() * 1000)
    metrics = [Metric("eval/pass1", v, now, s) for s, v in zip(EVAL_STEPS, eval_)]
    metrics += [Metric("eval/reward_mean", v / 2, now, s) for s, v in zip(EVAL_STEPS, eval_)]
    metrics += [Metric("clip/frac", v, now, s) for s, v in enumerate(clip, start=1)]
    metrics += [Metric("reward/mean", 0.5, now, s) for s in range(1, 21)]
    metrics += [Metric("time/wall_s", wall, now, 20)] + [Metric(k, v, now, s) for k, v, s in (extra or [])]
    params = [Param("rollout.prompts_per_step", "4"), Param("rollout.group_size", "2"), Param("train.steps", "20"),
              Param("train.minibatches", "2"), Param("train.lr", "0.001"), Param("train.eval_every", "10"),
              Param("preset", "default")]
    client.log_batch(rid, metrics=metrics, params=params)
    if status != "RUNNING":
        client.set_terminated(rid, status)
    return rid


def build_store(root) -> str:
    uri = f"sqlite:///{root}/m.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment(EXP, artifact_location=str(root / "artifacts"))
    client.create_experiment("other", artifact_location=str(root / "artifacts_other"))
    _run(client, exp, "grpo", 0, eval_=(0.40, 0.45, 0.60), clip=(0.01, 0.02, 0.0, 0.03), wall=8.0)
    _run(client, exp, "grpo", 1, eval_=(0.40, 0.55, 0.50), clip=(0.02,) * 4, wall=12.0)
    flips = [("moe/expert_flip_rate", 0.01 * s, s) for s in range(1, 21)]
    g0 = _run(client, exp, "gspo", 0, eval_=(0.40, 0.50, 0.70), clip=(0.3, 0.5, 0.4, 0.4),
              tags={"moe": "true", "collapse.count": "1", "collapse.reward_drop": "15"},
              extra=[("collapse/reward_drop", 1.0, 15), ("collapse/events", 1.0, 15)] + flips)
    client.log_dict(g0, [{"kind": "reward_drop", "step": 15, "time": 0.0, "value": 0.1, "threshold": 0.2,
                          "detail": "running mean 0.100 vs best 0.500"}], "collapse_events.json")
    rng = np.random.default_rng(0)
    for step in (10, 20):
        client.log_dict(g0, {"algo": "gspo", "step": step, "eps_low": 3e-4, "eps_high": 4e-4,
                             "token_log_ratio": rng.normal(0, 0.08, 400).round(6).tolist(),
                             "seq_log_ratio": rng.normal(0, 0.03, 64).round(6).tolist()},
                        f"ratios/step_{step:04d}.json")
    _run(client, exp, "gspo", 1, eval_=(0.42, 0.47, 0.51), clip=(0.4,) * 4, tags={"moe": "true"}, extra=flips)
    _run(client, exp, "dapo", 0, status="FAILED", eval_=(0.99, 0.99, 0.99), clip=(0.5,))
    _run(client, exp, "dapo", 1, status="RUNNING", eval_=(0.99, 0.99, 0.99), clip=(0.5,))
    _run(client, exp, "grpo", 0, eval_=(0.40, 0.60, 0.80), clip=(0.05,) * 4, tags={"tuning": "tuned"})
    return uri


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("lb"))


@pytest.fixture(scope="module")
def rows(store):
    return collect(store, EXP)


def _row(rows, algo, status="FINISHED", config="default"):
    (row,) = [r for r in rows if r["algo"] == algo and r["status"] == status and r["config"] == config]
    return row


def test_curve_helpers_by_hand():
    assert auc([(0, 0.4), (10, 0.45), (20, 0.6)]) == pytest.approx((10 * 0.85 / 2 + 10 * 1.05 / 2) / 20)
    assert auc([(0, 0.3), (5, 0.3), (20, 0.3)]) == pytest.approx(0.3)  # uneven steps, flat curve
    assert auc([(0, 0.7)]) == 0.7 and auc([]) is None
    assert steps_to_gain([(0, 0.4), (10, 0.5), (20, 0.7)]) == pytest.approx(10)  # 0.4 + 0.1 counts as reached
    # between evaluations: 0.40 -> 0.55 crosses 0.50 two thirds of the way from step 0 to step 10, and
    # 0.40 -> 0.45 -> 0.60 a third of the way from step 10 to 20: no tie at the first evaluation
    assert steps_to_gain([(0, 0.4), (10, 0.55)]) == pytest.approx(20 / 3)
    assert steps_to_gain([(0, 0.4), (10, 0.45), (20, 0.60)]) == pytest.approx(10 + 10 / 3)
    assert steps_to_gain([(0, 0.42), (10, 0.47), (20, 0.51)]) is None


def test_finished_rows_mean_sample_std_auc_steps(rows):
    grpo = _row(rows, "grpo")
    assert grpo["n"] == 2 and grpo["seeds"] == "0,1"
    assert grpo["final_pass1"] == pytest.approx(0.55) and grpo["final_pass1_std"] == pytest.approx(0.05 * 2 ** 0.5)
    assert grpo["best_pass1"] == pytest.approx(0.575) and grpo["best_pass1_std"] == pytest.approx(0.025 * 2 ** 0.5)
    assert grpo["auc_pass1"] == pytest.approx((0.475 + 0.5) / 2)
    # 0.45 -> 0.60 crosses 0.50 a third of the way from step 10 to 20; 0.40 -> 0.55 two thirds of the way to 10
    assert grpo["steps_to_10"] == pytest.approx((10 + 10 / 3 + 20 / 3) / 2) and grpo["reached_10"] == 2
    assert grpo["clip_frac"] == pytest.approx((0.015 + 0.02) / 2)
    assert grpo["wall_s"] == pytest.approx(10.0) and grpo["collapses"] == 0
    assert grpo["completions_per_s"] == pytest.approx((4 * 2 * 20 / 8 + 4 * 2 * 20 / 12) / 2)
    gspo = _row(rows, "gspo")
    assert gspo["final_pass1"] == pytest.approx(0.605) and gspo["final_pass1_std"] == pytest.approx(0.19 / 2 ** 0.5)
    assert gspo["auc_pass1"] == pytest.approx((0.525 + 0.4675) / 2)
    assert gspo["steps_to_10"] == pytest.approx(10) and gspo["reached_10"] == 1  # seed 1 never gets +10 points
    assert gspo["clip_frac"] == pytest.approx(0.4) and gspo["collapses"] == 1
    assert gspo["warm_pass1"] == pytest.approx(0.41)


def test_failed_and_running_are_rows_never_averaged(rows):
    failed, running = _row(rows, "dapo", "FAILED"), _row(rows, "dapo", "RUNNING")
    assert failed["n"] == 1 and running["n"] == 1 and failed.get("final_pass1") is None
    assert failed["collapses"] == 0 and running.get("clip_frac") is None
    assert all(r.get("final_pass1") != pytest.approx(0.99) for r in rows)


def test_tuning_tag_is_its_own_group_and_order_is_best_first(rows):
    tuned = _row(rows, "grpo", config="tuned")
    assert tuned["n"] == 1 and tuned["final_pass1"] == pytest.approx(0.8) and tuned["final_pass1_std"] is None
    default = [(r["algo"], r["status"]) for r in rows if r["config"] == "default"]
    assert default == [("gspo", "FINISHED"), ("grpo", "FINISHED"), ("dapo", "FAILED"), ("dapo", "RUNNING")]


def test_task_and_model_filters(store):
    assert collect(store, EXP, task="arith", model="tiny-dense")
    assert collect(store, EXP, task="other-task") == [] and collect(store, EXP, model="tiny-moe") == []


def test_csv_round_trip(rows):
    back = list(csv.DictReader(io.StringIO(render(rows, "csv"))))
    assert len(back) == len(rows)
    g = next(r for r in back if r["algo"] == "grpo" and r["config"] == "default")
    assert float(g["final_pass1"]) == pytest.approx(0.55) and int(g["reached_10"]) == 2
    f = next(r for r in back if r["status"] == "FAILED")
    assert f["final_pass1"] == "" and f["n"] == "1"


def test_markdown_parses_back(rows):
    lines = render(rows, "md").strip().splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    head, body = cells[0], cells[2:]
    assert len(body) == len(rows) and all(len(c) == len(head) for c in body)
    gspo = dict(zip(head, next(c for c in body if c[head.index("algo")] == "gspo")))
    assert gspo["final pass@1"] == "0.605 ± 0.134" and gspo["steps to +10 pts"] == "10 (1/2)"
    assert gspo["clip/frac"] == "40.0 %" and gspo["collapses"] == "1"
    tuned = dict(zip(head, next(c for c in body if c[head.index("config")] == "tuned")))
    assert tuned["final pass@1"] == "0.800"  # one seed: the mean alone
    failed = dict(zip(head, next(c for c in body if "FAILED" in c[head.index("status")])))
    assert failed["status"] == "FAILED ×1" and failed["final pass@1"] == "-"
    assert "gspo" in render(rows, "table")


def _one_line_error(capsys) -> str:
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert len(text.splitlines()) == 1, text
    return text


def test_cli_unknown_experiment_is_one_line_exit_2(store, capsys):
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", "nope"]) == 2
    text = _one_line_error(capsys)
    assert "'nope'" in text and "bench" in text and "other" in text


def test_cli_no_runs_and_missing_db_exit_2(store, tmp_path, capsys):
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", "other"]) == 2
    assert "no benchmark runs" in _one_line_error(capsys)
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--task", "zzz"]) == 2
    assert "task='zzz'" in _one_line_error(capsys)
    missing = tmp_path / "none.db"
    assert main(["leaderboard", "--tracking-uri", f"sqlite:///{missing}"]) == 2
    assert "none.db" in _one_line_error(capsys) and not missing.exists()


def test_cli_csv_and_md(store, capsys):
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "csv"]) == 0
    back = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["algo"] for r in back} == {"grpo", "gspo", "dapo"}
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| task |") and "RUNNING ×1" in out


def test_cli_paired_table_in_md_and_csv(store, capsys):
    # gspo - grpo per seed: final 0.70 - 0.60, 0.51 - 0.50; steps to +10: 10 - 20 (seed 1: gspo never reached)
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "md"]) == 0
    out = capsys.readouterr().out
    board, paired = out.split("**Paired differences vs grpo")
    assert "| gspo | finished |" in board and "| task | model | preset | config | algo | baseline |" in paired
    # p: t = 0.055 / (sd / sqrt 2) = 11/9 on 1 df (Cauchy): p = 1 - (2 / pi) atan(11/9) = 0.437; gspo is the
    # only algorithm with a p in its group, so Holm leaves it as it is
    assert ("| arith | tiny-dense | default | default | gspo | grpo | final pass@1 (points) | 2 | +5.5 | "
            "[-51.7, +62.7] | no | 0.437 | 0.437 | 73.5 |") in paired  # the exact MDE (the shortcut gave 63.4)
    assert "| steps to +10 pts (steps) | 1 of 2 | -3.3 | - | - | - | - | - |" in paired  # 10 - (10 + 10/3)
    assert "- arith / tiny-dense: MDE (final pass@1, 2 seeds, α 0.05, 80 % power): 73.5 points" in paired
    assert "- arith / tiny-dense / tuned: no paired differences vs grpo: only grpo in this group" in paired
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "csv", "--paired"]) == 0
    back = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["algo"], r["metric"], r["n"]) for r in back] == [
        ("gspo", "final_pass1", "2"), ("gspo", "auc_pass1", "2"), ("gspo", "steps_to_10", "1")]
    final = back[0]
    assert float(final["mean_diff"]) == pytest.approx(0.055) and final["significant"] == "false"
    assert final["seeds"] == "0,1" and float(final["group_mde_final_pass1"]) == pytest.approx(float(final["mde"]))
    assert back[2]["ci_low"] == "" and back[2]["significant"] == ""
    assert float(back[2]["mean_diff"]) == pytest.approx(-10 / 3)
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--format", "table", "--paired"]) == 0
    out = capsys.readouterr().out
    assert "Paired differences vs grpo" in out and "finished" not in out  # the paired table alone



# -- one FINISHED run per (settings, algorithm, seed) ---------------------------------------------------------
def test_a_second_finished_run_of_one_seed_is_set_aside_and_the_newest_counts(tmp_path, capsys):
    from gspo_bench.reporting.frame import SUPERSEDED, load_frame, read_frame, runs_of, set_aside, write_frame

    uri = f"sqlite:///{tmp_path}/twice.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment(EXP, artifact_location=str(tmp_path / "artifacts"))
    digest = {"gspo_bench.config": "0123456789abcdef"}
    old = _run(client, exp, "grpo", 0, eval_=(0.40, 0.45, 0.50), tags=digest)
    time.sleep(0.01)  # MLflow's start times are in ms
    new = _run(client, exp, "grpo", 0, eval_=(0.40, 0.45, 0.70), tags=digest)  # the same command again
    other = _run(client, exp, "grpo", 0, eval_=(0.40, 0.45, 0.90), tags={"gspo_bench.config": "fedcba9876543210"})
    one = _run(client, exp, "grpo", 1, eval_=(0.40, 0.50, 0.60), tags=digest)
    status = {r.run_id: r.status for r in runs_of(load_frame(uri, EXP))}
    assert status == {old: SUPERSEDED, new: "FINISHED", other: "FINISHED", one: "FINISHED"}
    rows = collect(uri, EXP)
    assert [(r["status"], r["n"], r["seeds"]) for r in rows] == [("FINISHED", 3, "0,1"), (SUPERSEDED, 1, "0")]
    # the newest of seed 0 counts (0.70, not 0.50); with the run of other settings the row does not split by, seed
    # 0 counts once, as the mean of its two runs; the row averages over the two seeds, not the three runs
    seed0, seed1 = (0.70 + 0.90) / 2, 0.60
    assert rows[0]["final_pass1"] == pytest.approx((seed0 + seed1) / 2)
    assert rows[0]["final_pass1_std"] == pytest.approx(statistics.stdev([seed0, seed1]))
    assert set_aside(runs_of(load_frame(uri, EXP))).startswith("1 FINISHED run(s) set aside as SUPERSEDED")
    # a runs table keeps the start times, and one without them keeps MLflow's order (newest first)
    path = write_frame(load_frame(uri, EXP), tmp_path / "runs.csv.gz")
    assert {r.run_id: r.status for r in runs_of(read_frame(path))} == status
    legacy = read_frame(path).drop(columns=["start_time"])
    assert {r.run_id: r.status for r in runs_of(legacy)} == status
    assert main(["leaderboard", "--tracking-uri", uri, "--experiment", EXP, "--format", "md"]) == 0
    text = capsys.readouterr().out
    assert f"{SUPERSEDED} ×1" in text and "1 FINISHED run(s) set aside" in text
    assert main(["report", "--tracking-uri", uri, "--experiment", EXP, "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.md").read_text()
    assert "3 FINISHED, 1 SUPERSEDED" in page and "1 FINISHED run(s) set aside as SUPERSEDED" in page


def test_target_mde_plans_the_seeds_each_comparison_needs(store, capsys):
    from gspo_bench.reporting.paired import sd_interval, seeds_needed

    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--target-mde", "5", "--format",
                 "csv"]) == 0
    back = {(r["algo"], r["metric"]): r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    final = back[("gspo", "final_pass1")]
    # gspo - grpo final pass@1: 0.70 - 0.60 and 0.51 - 0.50, sd by hand; one algorithm with a p: level 0.05
    sd = statistics.stdev([0.10, 0.01])
    assert int(final["n"]) == 2 and float(final["sd"]) == pytest.approx(sd) and float(final["level"]) == 0.05
    assert int(final["seeds"]) == seeds_needed(sd, 0.05, 0.05) and float(final["target"]) == pytest.approx(0.05)
    # 2 pairs know the sd only to within x0.45 to x32: the plan's low end, and no plan at the high end
    lo, hi = sd_interval(sd, 2)
    assert int(final["seeds_low"]) == seeds_needed(lo, 0.05) <= int(final["seeds"])
    assert final["seeds_high"] == "" and seeds_needed(hi, 0.05) is None
    assert ("gspo", "steps_to_10") not in back  # one pair only: no sd to plan from
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--target-mde", "5"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("**Seeds to detect 5 (points of pass@1, or steps) with 80 % power**")
    assert f"| {seeds_needed(sd, 0.05, 0.05)} | " in md
    assert main(["leaderboard", "--tracking-uri", store, "--experiment", EXP, "--target-mde", "0"]) == 2
    assert "--target-mde 0: a difference to detect must be > 0" in _one_line_error(capsys)


def test_final_pass_at_k_and_mean_at_k_are_averaged_over_seeds_and_shown_when_logged():
    from gspo_bench.reporting.frame import RunData
    from gspo_bench.reporting.leaderboard import summarise

    def run(algo, seed, p1, p4, m4):
        tags = {"algo": algo, "seed": str(seed), "task": "arith", "model": "tiny-dense", "preset": "default"}
        latest = {"eval/pass1": 0.5, "eval/pass_at_1": p1, "eval/pass_at_4": p4, "eval/mean_at_4": m4}
        return RunData(f"{algo}{seed}", "FINISHED", tags, {}, latest, {"eval/pass1": [(0, 0.4), (20, 0.5)]})

    runs = [run("grpo", 0, 0.50, 0.70, 0.45), run("grpo", 1, 0.54, 0.76, 0.47), run("gspo", 0, 0.40, 0.60, 0.35)]
    rows = summarise(runs)
    grpo = next(r for r in rows if r["algo"] == "grpo")
    assert grpo["at_k"] == pytest.approx({"pass_at_1": 0.52, "pass_at_4": 0.73, "mean_at_4": 0.46})
    md = render(rows, "md")
    assert "| final pass@1 | final pass@k | best pass@1 |" in md
    assert "| @1 0.520, @4 0.730, mean@4 0.460 |" in md
    table = list(csv.DictReader(io.StringIO(render(rows, "csv"))))
    assert float(table[0]["final_pass_at_4"]) == pytest.approx(0.73) and table[0]["algo"] == "grpo"
    # runs that logged none (made before pass@k was): no column at all
    old = [RunData(r.run_id, r.status, r.tags, {}, {"eval/pass1": 0.5}, r.history) for r in runs]
    assert "final pass@k" not in render(summarise(old), "md")


def test_runs_from_before_the_dev_split_are_named_in_one_line():
    from gspo_bench.reporting.frame import RunData
    from gspo_bench.reporting.leaderboard import predates_dev_split

    def run(i, params, status="FINISHED"):
        return RunData(f"r{i}", status, {"algo": "grpo", "seed": str(i)}, params, {}, {})

    new = {"resolved.warmstart.dev_pass1": "0.41"}
    assert predates_dev_split([run(0, new), run(1, new), run(2, {}, "FAILED")]) == ""
    line = predates_dev_split([run(0, new), run(1, {}), run(2, {})])
    assert line.startswith("2 of 3 FINISHED runs predate the dev split") and "\n" not in line


@pytest.mark.parametrize("n", [3, 4, 8])
def test_cli_paired_mde_is_the_exact_noncentral_t_value(tmp_path, capsys, n):
    from scipy.integrate import quad
    from scipy.optimize import brentq
    from scipy.stats import chi2, nct, norm
    from scipy.stats import t as student

    # grpo, gspo and dapo over n seeds: two comparisons against grpo, so Holm's first step is 0.05 / 2
    uri = f"sqlite:///{tmp_path}/m.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment(EXP, artifact_location=str(tmp_path / "artifacts"))
    rng = np.random.default_rng(n)
    for s in range(n):
        base = 0.5 + 0.01 * s
        _run(client, exp, "grpo", s, eval_=(0.40, 0.45, base))
        for algo, lead in (("gspo", 0.02), ("dapo", -0.01)):
            _run(client, exp, algo, s, eval_=(0.40, 0.45, round(base + lead + float(rng.normal(0, 0.02)), 4)))
    assert main(["leaderboard", "--tracking-uri", uri, "--experiment", EXP, "--paired", "--format", "csv"]) == 0
    back = [r for r in csv.DictReader(io.StringIO(capsys.readouterr().out)) if r["metric"] == "final_pass1"]
    alpha, df = 0.05 / 2, n - 1
    crit = student.ppf(1 - alpha / 2, df)

    def power(d: float) -> float:
        # the two-sided paired t test's power at standardised effect d: P(|T'| > crit), T' the noncentral t with
        # nc = d sqrt(n), i.e. (Z + nc) / sqrt(V / df) with V ~ chi2(df): the integral over V of
        # P(|Z + nc| > crit sqrt(V / df)) (scipy's nct gives NaN at some of these points; where it does not, the
        # two agree, checked below)
        def given(v: float) -> float:
            c = crit * math.sqrt(v / df)
            return (norm.sf(c - d * math.sqrt(n)) + norm.cdf(-c - d * math.sqrt(n))) * chi2.pdf(v, df)

        return quad(given, 0, np.inf, limit=200)[0]

    d = brentq(lambda x: power(x) - 0.8, 0.1, 50.0)
    direct = nct.sf(crit, df, d * math.sqrt(n)) + nct.cdf(-crit, df, d * math.sqrt(n))
    assert math.isnan(direct) or direct == pytest.approx(0.8, abs=1e-6)
    for row in back:
        assert int(row["n"]) == n and float(row["mde_alpha"]) == pytest.approx(alpha)
        assert float(row["mde"]) == pytest.approx(d * float(row["sd_diff"]), rel=1e-4)
