"""``suite --until-decided``: the planner on synthetic results (which cells get which new seeds), the loop with
its reading and running injected, the option checks (one line, exit 2), and the command end to end with the
training run replaced by a fake that logs a FINISHED run (no training)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import mlflow
import pytest

from gspo_bench.cli.main import main
from gspo_bench.reporting.sequential import ABOVE
from gspo_bench.suite.until_decided import next_cells, run_until_decided, scenario_seeds
from mlflow_fakes import log_run

ALGOS = ["grpo", "gspo", "dapo"]


def _value(algo: str, seed: int) -> float:
    """A final pass@1 per (algo, seed): a shared luck per seed, gspo far above grpo, dapo level with it."""
    luck = 0.5 + 0.05 * math.sin(seed)
    own = {"grpo": 0.0, "gspo": 0.2 + 0.01 * ((7 * seed) % 5 - 2), "dapo": 0.02 * ((3 * seed) % 5 - 2)}[algo]
    return luck + own


def _finals(seeds, algos=ALGOS) -> dict:
    return {a: {str(s): _value(a, s) for s in seeds} for a in algos}


# -- the planner -------------------------------------------------------------------------------------------------
def test_undecided_comparisons_and_the_baseline_get_the_next_batch_seed_major():
    finals = _finals(range(3))
    cells = next_cells(finals, [0, 1, 2], ALGOS, "grpo", max_seeds=10, batch=2)
    assert cells == [("grpo", 3), ("gspo", 3), ("dapo", 3), ("grpo", 4), ("gspo", 4), ("dapo", 4)]


def test_a_decided_algorithm_gets_no_new_seed():
    finals = _finals(range(5))  # gspo decided at 4 seeds, dapo not
    cells = next_cells(finals, list(range(5)), ALGOS, "grpo", max_seeds=10, batch=2)
    assert cells == [("grpo", 5), ("dapo", 5), ("grpo", 6), ("dapo", 6)]
    # everything decided: nothing to run
    assert next_cells(_finals(range(5), ["grpo", "gspo"]), list(range(5)), ["grpo", "gspo"], "grpo", 10, 2) == []


def test_the_last_batch_stops_at_max_seeds_and_then_nothing():
    finals = _finals(range(5))
    assert next_cells(finals, list(range(5)), ALGOS, "grpo", max_seeds=6, batch=4) == [("grpo", 5), ("dapo", 5)]
    assert next_cells(finals, list(range(5)), ALGOS, "grpo", max_seeds=5, batch=2) == []


def test_a_missing_cell_of_an_undecided_comparison_runs_once_before_new_seeds():
    finals = _finals(range(5))
    del finals["dapo"]["3"]  # an interrupted batch: dapo's seed 3 never finished
    seeds = scenario_seeds([0, 1, 2], finals)
    assert seeds == [0, 1, 2, 3, 4]
    assert next_cells(finals, seeds, ALGOS, "grpo", 10, 2) == [("dapo", 3)]
    # tried by this invocation already (it failed): not again, the next seeds instead
    assert next_cells(finals, seeds, ALGOS, "grpo", 10, 2, tried={("dapo", 3)}) == [("grpo", 5), ("dapo", 5),
                                                                                   ("grpo", 6), ("dapo", 6)]
    with pytest.raises(ValueError):
        next_cells(finals, seeds, ALGOS, "grpo", 10, 0)


def test_the_loop_runs_until_decided_or_max_seeds_and_survives_failed_cells():
    store: dict[str, dict] = {"s": _finals(range(3))}
    ran: list[tuple[str, int]] = []

    def run(cells):
        for name, todo in cells.items():
            for a, s in todo:
                ran.append((a, s))
                if (a, s) != ("dapo", 6):  # one cell fails: it leaves no result and is not retried
                    store[name].setdefault(a, {})[str(s)] = _value(a, s)

    tried = {("s", a, s) for a in ALGOS for s in range(3)}
    ext = run_until_decided(["s"], [0, 1, 2], ALGOS, "grpo", 8, 2, lambda name: store[name], run, tried,
                            log=lambda _: None)
    assert ran == [("grpo", 3), ("gspo", 3), ("dapo", 3), ("grpo", 4), ("gspo", 4), ("dapo", 4),
                   ("grpo", 5), ("dapo", 5), ("grpo", 6), ("dapo", 6), ("grpo", 7), ("dapo", 7)]
    assert ext.rounds == 3 and ext.seeds["s"] == list(range(8))
    assert ext.decisions["s"]["gspo"].decision == ABOVE and ext.decisions["s"]["dapo"].decision is None
    assert ext.cells["s"] == [c for c in ran]  # every added cell, the failed one included (it counts as a cell)


# -- the option checks -------------------------------------------------------------------------------------------
def _argv(tmp_path, *extra: str) -> list[str]:
    return ["suite", "--scenarios", "smoke", "--algos", ",".join(ALGOS), "--seeds", "3", "--no-progress",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", str(tmp_path / "out"),
            "--set", "warmstart.enabled=false", *extra]


@pytest.mark.parametrize("extra, needle", [
    (["--until-decided"], "--until-decided needs --max-seeds"),
    (["--until-decided", "--max-seeds", "2"], "--max-seeds 2 is below the 3 configured seed(s)"),
    (["--until-decided", "--max-seeds", "6", "--seed-batch", "0"], "--seed-batch 0 must be >= 1"),
    (["--max-seeds", "6"], "--max-seeds applies only with --until-decided"),
    (["--seed-batch", "2"], "--seed-batch applies only with --until-decided"),
    (["--until-decided", "--max-seeds", "6", "--dry-run", "--target-mde", "3"], "exclude each other"),
    (["--target-mde", "3"], "use it with --dry-run"),
    (["--dry-run", "--target-mde", "0"], "--target-mde 0: a difference to detect must be > 0"),
    (["--until-decided", "--max-seeds", "6", "--algos", "gspo,dapo"], "add grpo to --algos"),
    (["--until-decided", "--max-seeds", "6", "--algos", "grpo"], "one algorithm has no comparison"),
    (["--until-decided", "--max-seeds", "x"], "--max-seeds: invalid int value"),
])
def test_bad_options_are_one_line_exit_2_before_any_work(extra, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(_argv(tmp_path, *extra))
    except SystemExit as e:  # the parser's own errors exit from inside argparse
        code = e.code
    assert code == 2
    text = (capsys.readouterr().out).strip()
    assert needle in text and "error" in text and len(text.splitlines()) == 1, text
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


def test_dry_run_until_decided_states_the_worst_case(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(_argv(tmp_path, "--until-decided", "--max-seeds", "7", "--dry-run")) == 0
    text = capsys.readouterr().out
    assert "up to 7 seeds per scenario" in text and "smoke: at most 4 more seed(s), 12 cell(s)" in text
    assert not (tmp_path / "mlflow.db").exists()


# -- end to end, the training run replaced -----------------------------------------------------------------------
def test_until_decided_end_to_end_adds_seeds_only_where_undecided_and_resumes(tmp_path, monkeypatch, capsys):
    import gspo_bench.reporting.report
    import gspo_bench.train.runner

    uri, calls = f"sqlite:///{tmp_path / 'mlflow.db'}", []

    def fake_run(cfg, log=print, resume=False):  # one FINISHED run per cell, as ``runner.run`` tags it
        (algo,), (seed,) = cfg.algos, cfg.seeds
        calls.append((algo, seed))
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        final = _value(algo, seed)
        log_run(client, exp.experiment_id, algo=algo, seed=seed, evals=[(0, 0.4), (3, final)],
                tags={"preset": "smoke", "task": cfg.task})
        return [SimpleNamespace(status="FINISHED", eval_end=final)]

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gspo_bench.train.runner, "run", fake_run)
    monkeypatch.setattr(gspo_bench.reporting.report, "write_report", lambda *a, **k: None)  # figures: not tested here
    argv = _argv(tmp_path, "--until-decided", "--max-seeds", "7")
    assert main(argv) == 0
    text = capsys.readouterr().out
    configured = [(a, s) for s in range(3) for a in ALGOS]
    # gspo is decided at 5 seeds (4 are the least at which this family can decide anything), dapo never
    assert calls == configured + [("grpo", 3), ("gspo", 3), ("dapo", 3), ("grpo", 4), ("gspo", 4), ("dapo", 4),
                                  ("grpo", 5), ("dapo", 5), ("grpo", 6), ("dapo", 6)]
    assert "until decided, round 1: smoke: 2 of 2 comparison(s) vs grpo undecided at 3 seed(s)" in text
    assert "smoke: 1 comparison(s) vs grpo still undecided at 7 seed(s) (--max-seeds 7)" in text
    doc = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert (doc["cells"], doc["finished"], doc["ran"]) == (19, 19, 19)
    seq = doc["sequential"]["scenarios"]["smoke"]
    assert seq["gspo"]["decision"] == ABOVE and seq["gspo"]["n"] == 5 and seq["gspo"]["ci"][0] > 0
    assert seq["dapo"]["decision"] is None and seq["dapo"]["n"] == 7 and seq["dapo"]["p_holm"] > 0.05
    assert "anytime-valid t confidence sequence (Lai 1976" in doc["sequential"]["method"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Until decided: sequential comparisons against `grpo`" in summary
    assert "| `smoke` | `gspo` | 5/7 |" in summary and "**above 0**" in summary and "not decided" in summary
    assert "seeds per scenario, until decided: `smoke` 0, 1, 2, 3, 4, 5, 6" in summary
    # the same command again: the decisions and seeds come back from the store, nothing runs
    calls.clear()
    assert main(argv) == 0
    assert calls == [] and "9 already done, 0 to run" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "suite.json").read_text())["sequential"]["scenarios"]["smoke"] == seq
