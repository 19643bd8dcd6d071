"""The command line: the smoke preset end to end, `list`, and one-line errors with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from gspo_bench.__main__ import main
from gspo_bench.losses import LOSSES


def _runs(db: Path) -> list:
    if not db.exists():
        return []
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--algos", "grpo,nope"], "'nope'"),
        (["--task", "no-such-task"], "no-such-task"),
        (["--eps-low", "1.5"], "eps_low"),
        (["--steps", "-3"], "steps=-3"),
        (["--model", "./no/such/model"], "./no/such/model"),
        (["--preset", "huge"], "huge"),
        (["--on-collapse", "explode"], "explode"),
        (["--config", "missing.yaml"], "missing.yaml"),
        (["--seeds", "0"], "seeds"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_no_run(argv, needle, tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    code = main(["run", "--tracking-uri", f"sqlite:///{db}", "--no-progress", *argv])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2
    assert needle in text and "error" in text
    assert len(text.splitlines()) == 1, text
    assert all(r.info.status != "RUNNING" for r in _runs(db)) and not _runs(db)


def test_unknown_algorithm_error_lists_the_allowed_ones(tmp_path, capsys):
    assert main(["run", "--algos", "trpo", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    text = capsys.readouterr().out
    assert all(name in text for name in LOSSES)


def test_unknown_subcommand_exits_2():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


def test_list_shows_every_algorithm_task_model_and_preset(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for word in [*LOSSES, "arith", "tiny-dense", "tiny-moe", "smoke", "default"]:
        assert word in text


def test_smoke_preset_end_to_end_through_the_cli(tmp_path):
    """`python -m gspo_bench run --algos all --preset smoke` leaves 6 FINISHED runs with the metric set."""
    env = {**os.environ, "GSPO_BENCH_CACHE": str(tmp_path / "cache")}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "run", "--algos", "all", "--preset", "smoke"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "warm start" in proc.stdout and "mlflow ui --backend-store-uri sqlite:///mlflow.db" in proc.stdout
    runs = _runs(tmp_path / "mlflow.db")  # the default tracking URI, in the working directory
    assert sorted(r.data.tags["algo"] for r in runs) == sorted(LOSSES)
    for r in runs:
        assert r.info.status == "FINISHED"
        assert r.data.tags["preset"] == "smoke"
        for key in ("reward/mean", "clip/frac", "eval/pass1", "ratio/max", "policy/entropy"):
            assert key in r.data.metrics
