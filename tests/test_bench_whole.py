"""``bench --whole``: ``run --algos all`` timed by phase, with every completion counted by hand."""

from __future__ import annotations

import json

import pytest

from gspo_bench.cli.main import main


@pytest.mark.slow
def test_whole_benchmark_splits_the_wall_time_and_counts_every_completion(tmp_path, monkeypatch, capsys, mixed_task):
    monkeypatch.chdir(tmp_path)
    sets = ["warmstart.enabled=false", "rollout.prompts_per_step=4", "rollout.group_size=4", "train.steps=2",
            "train.minibatches=2", "train.eval_every=1", "train.eval_prompts=8", "train.eval_samples=2",
            f"task={mixed_task}"]
    out = tmp_path / "whole.json"
    assert main(["bench", "--whole", "--preset", "smoke", *[x for s in sets for x in ("--set", s)],
                 "--json", str(out), "--markdown", str(tmp_path / "whole.md")]) == 0
    d = json.loads(out.read_text())
    from gspo_bench import algorithms

    assert d["algos"] == algorithms.names() and d["preset"] == "smoke"  # --algos all: every registered one
    assert set(d["statuses"]) == {"FINISHED"}
    phases = d["phases"]
    assert all(phases[p] > 0 for p in ("warm start", "rollout", "train", "eval", "overhead"))
    assert sum(phases.values()) == pytest.approx(d["wall_s"])
    for a in d["per_algo"]:
        # the phases of one run fit inside its wall time
        assert a["rollout_s"] + a["train_s"] + a["eval_s"] <= a["seconds"] + 1e-6
        # eval at steps 0, 1 and 2: 8 prompts x (1 greedy + 2 sampled) each time, generated at step 0 only by
        # ppo (whose critic drew random numbers first) and grpo; the others reuse grpo's step-0 evaluation
        assert a["eval_completions"] == (3 if a["algo"] in ("ppo", "grpo") else 2) * 8 * 3
        if a["algo"] == "dapo":  # dynamic sampling may draw more rounds: at least the kept 2 x 16
            assert a["train_completions"] >= 2 * 16 and a["train_completions"] % 16 == 0
        else:  # 2 steps x 4 prompts x 4 samples
            assert a["train_completions"] == 2 * 16
    total = d["completions"]["train"] + d["completions"]["eval"]
    assert total == sum(a["train_completions"] + a["eval_completions"] for a in d["per_algo"])
    assert d["completions_per_hour"] == pytest.approx(total / d["wall_s"] * 3600)
    assert d["compile"]["graphs"] == 0 and d["compile"]["compile_s"] == 0  # the eager engine compiles nothing
    text = (tmp_path / "whole.md").read_text()
    assert "| overhead |" in text and "completions/hour" in text and "python -m gspo_bench bench --whole" in text
    assert not (tmp_path / "mlflow.db").exists()  # a throwaway store, not the user's
