"""The variance split (``reporting/variance.py``) by hand, and the ``variance`` command's page and errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gspo_bench.cli.main import main
from gspo_bench.reporting import variance as va
from gspo_bench.reporting.frame import FINISHED, RunData, write_frame


def test_one_way_by_hand():
    # three seeds, two draws each: means 2, 6, 11 (grand mean 19/3); within-seed variances 2, 2, 8
    got = va.one_way([[1, 3], [5, 7], [9, 13]])
    msb = 2 * np.var([2, 6, 11], ddof=1)  # = 40.667
    assert msb == pytest.approx(122 / 3)
    assert got.groups == 3 and got.k == 2 and got.within == pytest.approx(4.0)
    assert got.between == pytest.approx((122 / 3 - 4) / 2)  # 18.33
    assert got.share == pytest.approx(got.between / (got.between + 4))
    f = (122 / 3) / 4
    # F = 10.2 is under F_0.975(2, 3) = 16.0: no positive seed variance is excluded, the interval starts at 0
    assert f < stats.f.ppf(0.975, 2, 3) and got.share_ci[0] == 0.0
    theta = got.share_ci[1] / (1 - got.share_ci[1])
    assert f / (1 + 2 * theta) == pytest.approx(stats.f.ppf(0.025, 2, 3))
    # four seeds far apart: MSB = 2 var(1.5, 5.5, 9.5, 13.5) = 53.33, MSW = 0.5, F = 106.7; both ends solve
    # F / (1 + k theta) = the F(3, 4) quantiles, with share = theta / (1 + theta)
    apart = va.one_way([[1, 2], [5, 6], [9, 10], [14, 13]])
    assert apart.between == pytest.approx((160 / 3 - 0.5) / 2)
    for end, q in zip(apart.share_ci, (0.975, 0.025)):
        theta = end / (1 - end)
        assert (160 / 3) / 0.5 / (1 + 2 * theta) == pytest.approx(stats.f.ppf(q, 3, 4))
    # a group of one value is left out; under two groups there is nothing to split
    assert va.one_way([[1, 3], [5, 7], [4]]).groups == 2
    assert va.one_way([[1, 3], [4]]) is None


def test_one_way_floors_a_negative_seed_variance_at_zero():
    # the seed means agree more than the draws do: MSB < MSW, var(W) = 0 and the interval starts at 0
    got = va.one_way([[0, 10], [10, 0], [5, 5.5]])
    assert got.between == 0.0 and got.share == 0.0 and got.share_ci[0] == 0.0


def test_the_interval_covers_the_seed_share_in_simulation():
    rng = np.random.default_rng(0)
    true_share, hits = 0.6, 0
    for _ in range(400):  # var(W) = 6, var(within) = 4, 12 seeds x 2 draws
        w = rng.normal(0, math.sqrt(6), 12)
        x = w[:, None] + rng.normal(0, 2, (12, 2))
        lo, hi = va.one_way(x.tolist()).share_ci
        hits += lo <= true_share <= hi
    assert 0.91 <= hits / 400 <= 0.99


def _draw(algo, seed, rl, start, final, halves=None):
    return va.Draw(algo, str(seed), str(rl), start, final, halves)


def test_the_evaluation_variance_is_the_mean_squared_half_difference_over_four():
    ds = [_draw("grpo", 0, 0, 40, 60, (62, 58)), _draw("grpo", 0, 1, 40, 64, (65, 63)),
          _draw("grpo", 1, 1, 42, 70, (70, 70)), _draw("grpo", 1, 2, 42, 66, None)]
    dec = va.decompose_lift(ds, "grpo")
    # (62 - 58)^2 / 4 = 4, (65 - 63)^2 / 4 = 1, 0: mean 5 / 3 over the three runs with halves
    assert dec.eval_var == pytest.approx(5 / 3) and dec.eval_runs == 3
    # lifts by seed (own draw first): seed 0 [20, 24], seed 1 [28 (rl 1 first, as 2 > 1), 24]
    assert dec.anova.within == pytest.approx((8 + 8) / 2)
    assert dec.train_var == pytest.approx(8 - 5 / 3)


def test_a_paired_difference_takes_the_draws_both_algorithms_have():
    ds = [_draw("grpo", 0, 0, 40, 60, (61, 59)), _draw("sapo", 0, 0, 40, 55, (57, 53)),
          _draw("grpo", 0, 9, 40, 62, (60, 64)), _draw("sapo", 0, 9, 40, 61, (61, 61)),
          _draw("grpo", 1, 1, 40, 70, (70, 70)), _draw("sapo", 1, 1, 40, 66, (66, 66)),
          _draw("grpo", 1, 5, 40, 68, (68, 68)), _draw("sapo", 1, 5, 40, 60, (60, 60)),
          _draw("sapo", 1, 7, 40, 10, (10, 10))]  # no grpo run of this draw: left out
    dec = va.decompose_pair(ds, "sapo", "grpo")
    # d: seed 0 [-5, -1], seed 1 [-4, -8]; within variances 8 and 8
    assert dec.anova.groups == 2 and dec.anova.k == 2 and dec.anova.within == pytest.approx(8.0)
    # the difference's halves: (57-61, 53-59) = (-4, -6) -> 1; (61-60, 61-64) = (1, -3) -> 4; 0; 0
    assert dec.eval_var == pytest.approx(5 / 4) and dec.eval_runs == 4


def test_the_eval_size_that_brings_the_evaluation_to_a_quarter():
    dec = va.Decomposition("x", va.OneWay(16, 2, between=3.0, within=5.0, share=0.375, share_ci=(0, 1)),
                           eval_var=4.0, eval_runs=32)
    # rest = 3 + (5 - 4) = 4; at N' prompts var(E) = 4 x 1024 / N' = (1/3) x 4  =>  N' = 3072
    assert va.eval_size_for(dec, 1024) == 3072
    small = va.Decomposition("x", va.OneWay(16, 2, 3.0, 5.0, 0.375, (0, 1)), eval_var=1.0, eval_runs=32)
    assert va.eval_size_for(small, 1024) <= 1024  # already under a quarter: 1 of 3 + 4 + 1
    [row] = va.mde_rows([small], 1024, 16)
    assert row[-1] == "(already at most a quarter)"


def test_the_lift_table_marks_lifts_under_the_floor():
    ds = [_draw("grpo", 3, 3, 40.0, 55.0), _draw("sapo", 3, 3, 40.0, 49.5), _draw("sapo", 3, 8, 40.0, 41.0)]
    cols, rows, low = va.lift_table(ds)
    assert cols == ["seed", "warm start", "grpo", "sapo"]
    assert rows == [["3", "40.0", "+15.0", "**+9.5**"]]  # the own draw only: rl_seed 8 is not the default's
    assert low == ["sapo seed 3 (+9.5)"]


def _run(algo, seed, rl, start, final, halves):
    params = {"train.eval_prompts": "8"} | ({} if rl is None else {"train.rl_seed": str(rl)})
    metrics = {"eval/pass1": final} | ({} if halves is None else dict(zip(va.HALF_KEYS, halves)))
    return RunData(f"{algo}-{seed}-{rl}", FINISHED, {"algo": algo, "seed": str(seed)}, params, metrics,
                   {"eval/pass1": [(0, start), (10, final)]})


def _table(runs) -> pd.DataFrame:
    rows = []
    for r in runs:
        head = {"run_id": r.run_id, "status": r.status, "experiment": "v", "artifact_uri": "", "start_time": 0,
                **{f"tags.{k}": v for k, v in r.tags.items()}, **{f"params.{k}": v for k, v in r.params.items()}}
        rows += [{**head, "metric": k, "step": -1, "value": v} for k, v in r.metrics.items()]
        rows += [{**head, "metric": k, "step": s, "value": v} for k, h in r.history.items() for s, v in h]
    return pd.DataFrame(rows)


def test_draws_reads_rl_seed_and_halves_from_runs():
    logged_null = _run("grpo", 5, None, 0.4, 0.6, None)
    logged_null.params["train.rl_seed"] = "null"  # how MLflow keeps the unset value of newer runs
    assert va.draws([logged_null])[0].rl_seed == "5"
    [own, other] = va.draws([_run("grpo", 4, None, 0.4, 0.6, (0.625, 0.575)), _run("grpo", 4, 1004, 0.4, 0.5, None)])
    assert (own.seed, own.rl_seed, own.start, own.final) == ("4", "4", 40.0, 60.0)
    assert own.halves == pytest.approx((62.5, 57.5)) and own.lift == pytest.approx(20.0)
    assert other.rl_seed == "1004" and other.halves is None


def test_the_command_writes_the_page_and_refuses_bad_input(tmp_path, capsys):
    runs = []
    for seed, (g, s) in enumerate([(0.60, 0.55), (0.70, 0.58), (0.62, 0.60)]):
        for rl, jitter in ((None, 0.0), (100 + seed, 0.02)):
            runs.append(_run("grpo", seed, rl, 0.40, g + jitter, (g + jitter + 0.01, g + jitter - 0.01)))
            runs.append(_run("sapo", seed, rl, 0.40, s - jitter, (s - jitter, s - jitter)))
    table = tmp_path / "runs.csv.gz"
    write_frame(_table(runs), table)
    out = tmp_path / "page" / "variance.md"
    assert main(["variance", "--runs", str(table), "--out", str(out)]) == 0
    page = out.read_text()
    assert "| 1 | 40.0 | +30.0 | **+-2.0** |" not in page  # sapo's lifts are +15 to +20
    assert "| 1 | 40.0 | +30.0 | +18.0 |" in page
    assert "| grpo: lift | 3 x 2 |" in page and "| sapo - grpo: final pass@1 | 3 x 2 |" in page
    assert "## Evaluation size" in page
    assert "12 FINISHED runs: grpo x 6, sapo x 6, 3 seeds" in page
    # one draw per seed: the lifts, and nothing to split
    write_frame(_table([r for r in runs if "train.rl_seed" not in r.params]), tmp_path / "one.csv.gz")
    assert main(["variance", "--runs", str(tmp_path / "one.csv.gz"), "--out", str(tmp_path / "one.md")]) == 0
    assert "nothing to split" in (tmp_path / "one.md").read_text()
    assert main(["variance", "--runs", str(table), "--baseline", "ppo", "--out", str(out)]) == 2
    assert "--baseline 'ppo': no FINISHED run" in capsys.readouterr().out
    assert main(["variance", "--runs", str(tmp_path / "none.csv.gz"), "--out", str(out)]) == 2


def test_warm_start_links_rank_the_seeds_mean_lift():
    # four seeds: more warm-start steps, less lift (rho -1); dev pass@1 rises with the lift (rho +1)
    ds = []
    for i, (steps, lifts) in enumerate([(100, (30, 28)), (200, (25, 21)), (300, (20, 20)), (400, (12, 10))]):
        for algo, lift in zip(("grpo", "sapo"), lifts):
            ds.append(va.Draw(algo, str(i), str(i), 40.0, 40.0 + lift, None, steps, 41.0 + lift / 10))
    ds.append(va.Draw("grpo", "0", "99", 40.0, 0.0, None, 100, 44.0))  # another RL draw: not the seed's own
    rows = {r[0]: r for r in va.warm_start_links(ds)}
    assert rows["warm-start steps"][1:3] == ["4", "-1.00"]
    assert rows["dev pass@1 at acceptance"][2] == "+1.00"
    assert "eval pass@1 (the warm start's score)" not in rows  # every seed's start is 40.0: nothing to rank
