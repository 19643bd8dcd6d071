"""``staleness --run`` (gspo_bench.suite.staleness): the grid's cells trained in one command, seed by seed, into one
store, resumed by the same command, every cell's config checked before the first trains; then the page."""

from __future__ import annotations

import mlflow
import pytest

from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError
from gspo_bench.suite.staleness import grid_cells
from tests.mlflow_fakes import one_line


def test_each_cell_is_its_correction_over_the_preset_and_the_commands_sets():
    cells = grid_cells([0, 1], "sqlite:////tmp/never.db", "smoke", {"train": {"lr": 5e-4}}, (0, 4), ("tis", "is"))
    assert [(c.eta, c.correction) for c in cells] == [(0, "tis"), (4, "tis"), (0, "is"), (4, "is")]
    tis4 = cells[1].cfg
    assert tis4.tracking.experiment == "staleness-e4-tis" and tis4.algos == ["grpo", "gspo", "cispo"]
    assert (tis4.rollout.staleness, tis4.rollout.old_logp_source, tis4.rollout.correction,
            tis4.rollout.correction_level) == (4, "recompute", "tis", "token")
    assert tis4.train.lr == 5e-4 and tis4.seeds == [0, 1] and cells[3].cfg.algos == ["rollout_is"]
    for key in ("staleness", "old_logp_source", "m2_threshold"):  # what the grid sets per cell is its own
        with pytest.raises(ConfigError, match=f"--set rollout.{key}: the staleness grid sets it in each cell"):
            grid_cells([0], "x", "smoke", {"rollout": {key: 1}}, (0,), ("naive",))
    with pytest.raises(ConfigError, match="train.lr"):  # everything else is checked as run checks it
        grid_cells([0], "x", "smoke", {"train": {"lr": -1.0}}, (0,), ("naive",))


@pytest.mark.slow
def test_run_trains_the_cells_once_and_writes_the_page(mixed_task, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/s.db"
    out = tmp_path / "page" / "README.md"
    argv = ["staleness", "--run", "--seeds", "0", "--eta", "0,2", "--corrections", "naive,is", "--preset", "smoke",
            "--set", f"task={mixed_task}", "--set", "warmstart.enabled=false", "--set", "train.steps=2",
            "--set", "train.eval_every=2", "--set", "rollout.prompts_per_step=4", "--set", "rollout.group_size=4",
            "--tracking-uri", uri, "--out", str(out)]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "staleness --run: 8 FINISHED" in first
    client = mlflow.MlflowClient(uri)
    runs = {}
    for name in ("staleness-e0-naive", "staleness-e2-naive", "staleness-e0-is", "staleness-e2-is"):
        got = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        runs[name] = sorted((r.data.tags["algo"], r.info.status) for r in got if "algo" in r.data.tags)
    assert runs["staleness-e2-naive"] == [("cispo", "FINISHED"), ("grpo", "FINISHED"), ("gspo", "FINISHED")]
    assert runs["staleness-e0-is"] == [("rollout_is", "FINISHED")]
    page = out.read_text()
    assert "| naive | grpo | " in page and (out.parent / "runs.csv.gz").is_file()
    # the same command again: nothing trains, every run read back, the store holds the same runs
    assert main(argv) == 0
    assert "staleness --run: 8 FINISHED" in capsys.readouterr().out
    again = client.search_runs([client.get_experiment_by_name("staleness-e2-naive").experiment_id])
    assert len([r for r in again if "algo" in r.data.tags]) == 3


@pytest.mark.parametrize("argv, says", [
    (["--run", "--seeds", "0,x"], "--seeds 0,x: expected distinct whole numbers >= 0"),
    (["--run", "--corrections", "naive,naive"], "--corrections naive,naive: expected distinct values among"),
    (["--run", "--set", "rollout.staleness=2"], "--set rollout.staleness: the staleness grid sets it in each cell"),
    (["--run", "--set", "train.steps=-1"], "train.steps"),
    (["--run", "--runs", "x.csv.gz"], "--run trains into --tracking-uri; --runs reads a table: give one"),
    (["--seeds", "0,1"], "choose what --run trains: add --run"),
])
def test_bad_run_flags_are_one_line_exit_2_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    from gspo_bench.suite import staleness

    monkeypatch.setattr(staleness, "run_grid", lambda *a, **k: pytest.fail("work started"))
    assert main(["staleness", *argv, "--tracking-uri", f"sqlite:///{tmp_path}/s.db",
                 "--out", str(tmp_path / "p" / "README.md")]) == 2
    assert says in one_line(capsys)
