"""``suite --dry-run --target-mde X`` (``suite/target.py``): the extra seeds, cells and hours per scenario from
the observed sd of its paired differences, on hand-made plan rows and on a store of synthetic FINISHED runs."""

from __future__ import annotations

import statistics

import mlflow
import pytest

from gspo_bench.cli.main import main
from gspo_bench.reporting.paired import holm_first_level, sd_interval, seeds_needed
from gspo_bench.suite.target import need_lines, scenario_need
from mlflow_fakes import log_run


def _row(algo: str, n: int, seeds: int | None, low: int | None, high: int | None) -> dict:
    return {"algo": algo, "baseline": "grpo", "n": n, "sd": 0.02, "sd_ci": (0.01, 0.06), "level": 0.025,
            "seeds": seeds, "seeds_range": (low, high)}


def test_cells_and_seconds_count_each_algorithms_extra_seeds_and_the_baselines_shared_ones():
    rows = [_row("gspo", 3, 9, 4, 40), _row("dapo", 5, 7, 5, None)]
    need = scenario_need(rows, "grpo", {"grpo": 100.0, "gspo": 110.0, "dapo": 125.0}, warmstart_s=50.0)
    # observed sd: gspo +6, dapo +2 seeds; the baseline runs the 6 new seeds
    assert need.new_seeds[0] == 6 and need.cells[0] == 6 + 2 + 6
    assert need.seconds[0] == pytest.approx(6 * 110 + 2 * 125 + 6 * (100 + 50))
    # low end: gspo +1, dapo 0 (already has 5 pairs)
    assert (need.new_seeds[1], need.cells[1]) == (1, 2)
    # high end: dapo would need over 10000 seeds: no number
    assert need.new_seeds[2] is None and need.seconds[2] is None
    text = "\n".join(need_lines("hot", "suite-hot", need, 3))
    assert "hot: gspo vs grpo: 3 pairs, sd 2.00 pts" in text and "-> 9 seeds (4 to 40)" in text
    assert "hot: 6 more seed(s), 14 cell(s), ~0.5 h" in text and "over 10000 seeds" in text
    assert "no prior data" in need_lines("long", "suite-long", None, 3)[0]


def test_dry_run_target_mde_sizes_scenarios_with_runs_and_names_those_without(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("suite-smoke", artifact_location=str(tmp_path / "artifacts"))
    finals = {"grpo": [0.50, 0.55, 0.45, 0.52], "gspo": [0.53, 0.60, 0.46, 0.57]}
    for algo, values in finals.items():
        for seed, v in enumerate(values):
            log_run(client, exp, algo=algo, seed=seed, evals=[(0, 0.4), (3, v)], tags={"preset": "smoke"})
    argv = ["suite", "--scenarios", "smoke,hot", "--algos", "grpo,gspo", "--seeds", "4", "--tracking-uri", uri,
            "--out", str(tmp_path / "out"), "--set", "warmstart.enabled=false", "--dry-run", "--target-mde", "3"]
    before = len(client.search_runs([exp]))
    assert main(argv) == 0
    text = capsys.readouterr().out
    sd = statistics.stdev([b - a for a, b in zip(finals["grpo"], finals["gspo"])])
    want = seeds_needed(sd, 0.03, holm_first_level(0.05, 1))
    lo, hi = sd_interval(sd, 4)
    assert (f"smoke: gspo vs grpo: 4 pairs, sd {100 * sd:.2f} pts" in text
            and f"-> {want} seeds ({seeds_needed(lo, 0.03)} to {seeds_needed(hi, 0.03) or 'over 10000'})" in text)
    assert f"smoke: {want - 4} more seed(s), {2 * (want - 4)} cell(s), ~" in text
    assert "hot: no prior data" in text and "not sized: hot" in text
    assert len(client.search_runs([exp])) == before and not (tmp_path / "out").exists()
