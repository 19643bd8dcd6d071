"""``bench --vs trl`` (gspo_bench.bench.trl): the matched settings, the pure helpers, the errors, one real run."""

from __future__ import annotations

import json
import sys

import pytest

from gspo_bench.bench import trl as bt
from gspo_bench.cli.main import main
from gspo_bench.bench.throughput import path_overrides
from gspo_bench.config import ConfigError, deep_merge, load_config

NO_TRL = "trl is not installed (the compare extra: pip install 'gspo-bench[compare]')"


def cpu_bench(**over):
    """The config ``bench --vs trl`` runs our side with: cpu-bench on the fast path, plus ``over``."""
    return load_config("cpu-bench", (), deep_merge(over, path_overrides("fast")))


# -- the settings both sides share --------------------------------------------------------------------------
def test_matched_reads_our_grpo_settings():
    m = bt.matched(cpu_bench(), "grpo", 8)
    assert (m.prompts, m.group_size, m.completions, m.max_new_tokens, m.temperature, m.minibatches) == (
        16, 8, 128, 64, 1.0, 4)
    # our grpo defaults (config/sections.py, docs/algorithms.md): lr 2e-4, no decay, clip-norm 1, eps 0.2 / 0.2, z-score
    assert (m.lr, m.weight_decay, m.max_grad_norm, m.eps_low, m.eps_high, m.scale_rewards, m.seed) == (
        2e-4, 0.0, 1.0, 0.2, 0.2, "group", 0)
    m = bt.matched(cpu_bench(train={"lr": 1e-3}, rollout={"advantage_scale": "none", "max_new_tokens": "auto"},
                             loss={"eps_high": 0.28}), "grpo", 8)
    assert (m.lr, m.scale_rewards, m.max_new_tokens, m.eps_high) == (1e-3, "none", 8, 0.28)  # auto: the task's 8


@pytest.mark.parametrize("algo, over, needle", [
    ("gspo", {}, "grpo only"),
    ("grpo", {"loss": {"kl_coef": 0.1}}, "KL"),
    ("grpo", {"loss": {"eps_low": None}}, "eps_low"),
    ("grpo", {"rollout": {"dynamic_sampling": True}}, "dynamic sampling"),
    ("grpo", {"rollout": {"prompts_per_step": 3, "group_size": 2}}, "4 equal minibatches"),
    ("grpo", {"train": {"lr_schedule": "linear"}}, "lr_schedule=linear: not matched"),
])
def test_matched_refuses_what_trl_does_not_match(algo, over, needle):
    with pytest.raises(ConfigError, match=needle):
        bt.matched(cpu_bench(**over), algo, 8)


def test_grpo_config_kwargs_one_generation_is_one_rollout():
    k = bt.grpo_config_kwargs(bt.matched(cpu_bench(), "grpo", 8), "/nowhere", total_cycles=3)
    # 4 optimiser steps of 32 completions per generation of 16 prompts x 8, used once, 3 generations in all
    assert (k["per_device_train_batch_size"], k["steps_per_generation"], k["gradient_accumulation_steps"],
            k["num_iterations"], k["num_generations"], k["max_steps"]) == (32, 4, 1, 1, 8, 12)
    assert (k["max_completion_length"], k["temperature"], k["top_p"], k["top_k"]) == (64, 1.0, 1.0, 0)
    assert (k["learning_rate"], k["lr_scheduler_type"], k["weight_decay"], k["max_grad_norm"]) == (
        2e-4, "constant", 0.0, 1.0)
    assert (k["loss_type"], k["epsilon"], k["epsilon_high"], k["beta"], k["scale_rewards"]) == (
        "grpo", 0.2, 0.2, 0.0, "group")
    assert (k["use_vllm"], k["bf16"], k["fp16"], k["use_cpu"], k["report_to"], k["save_strategy"],
            k["dataloader_num_workers"], k["output_dir"]) == (False, False, False, True, "none", "no", 0, "/nowhere")


def test_trl_derives_the_same_batch_from_those_fields(tmp_path):
    trl = pytest.importorskip("trl", reason=NO_TRL)
    c = trl.GRPOConfig(**bt.grpo_config_kwargs(bt.matched(cpu_bench(), "grpo", 8), str(tmp_path), 2))
    assert c.generation_batch_size == 128 and c.generation_batch_size // c.num_generations == 16
    assert (c.steps_per_generation, c.max_steps, c.max_completion_length, c.learning_rate) == (4, 8, 64, 2e-4)
    assert c.bf16 is False and c.gradient_checkpointing is False and c.beta == 0.0 and c.use_vllm is False
    assert str(getattr(c.lr_scheduler_type, "value", c.lr_scheduler_type)) == "constant"


# -- pure helpers ---------------------------------------------------------------------------------------------
def test_cycle_walls_every_nth_step_end():
    ends = [10.0, 11, 12, 13, 14, 16, 17, 18, 20.5]  # train start, then 8 optimiser-step ends
    assert bt.cycle_walls(ends, 4) == [4.0, 6.5]
    assert bt.cycle_walls(ends, 2) == [2.0, 2.0, 3.0, 3.5]
    assert bt.cycle_walls(ends[:4], 4) == []  # an unfinished cycle is no cycle


def test_summarise_medians_and_rates():
    s = bt.summarise("trl_1", [3.0, 1.0, 2.0], [(8, 60), (8, 64), (8, 40)], 4.0, {"x": 1})
    d = s.to_dict()
    assert (d["seconds"], d["completions"], d["gen_tokens"], d["cycles"], d["optimizer_steps_per_cycle"]) == (
        2.0, 8, 60, 3, 4.0)
    assert (d["completions_per_s"], d["gen_tokens_per_s"], d["mean_length"]) == (4.0, 30.0, 7.5)
    assert d["extra"] == {"walls": [3.0, 1.0, 2.0], "x": 1}
    with pytest.raises(RuntimeError, match="2 timed cycles but 1 rollouts"):
        bt.summarise("trl_1", [1.0, 2.0], [(8, 60)], 4.0, {})


def test_ratios_are_ours_over_each_trl_run():
    ours = {"completions_per_s": 100.0, "gen_tokens_per_s": 5000.0}
    trl = {"trl_1": {"completions_per_s": 50.0, "gen_tokens_per_s": 1000.0},
           "trl_2": {"completions_per_s": 25.0, "gen_tokens_per_s": 2500.0}}
    assert bt.ratios(ours, trl) == {"trl_1": {"completions_per_s": 2.0, "gen_tokens_per_s": 5.0},
                                    "trl_2": {"completions_per_s": 4.0, "gen_tokens_per_s": 2.0}}


def run(completions, steps, length):
    return {"completions": completions, "optimizer_steps_per_cycle": steps, "mean_length": length}


def test_checks_flag_a_mismatch():
    m = bt.matched(cpu_bench(), "grpo", 8)
    ok = bt.checks(m, {"trl_1": run(128, 4, 47.6), "ours": run(128, 4, 46.1)})
    assert ok[0].endswith("yes") and ok[1].endswith("yes") and "trl_1 47.6, ours 46.1" in ok[2]
    bad = bt.checks(m, {"trl_1": run(64, 4, 47.6), "ours": run(128, 2, 46.1)})
    assert bad[0].endswith("NO: trl_1 64, ours 128") and bad[1].endswith("NO: trl_1 4, ours 2")


def fake_result(low: float) -> dict:
    side = {"seconds": 2.0, "completions": 128, "gen_tokens": 6000, "mean_length": 46.9, "completions_per_s": 64.0,
            "gen_tokens_per_s": 3000.0}
    return {"order": ["trl_1", "ours", "trl_2"], "runs": {"trl_1": side, "ours": side, "trl_2": side},
            "ratios": {"trl_1": {"completions_per_s": 1.5, "gen_tokens_per_s": low},
                       "trl_2": {"completions_per_s": 4.5, "gen_tokens_per_s": 4.25}},
            "target": {"min_ratio": low, "met": low >= bt.TARGET}, "config": {"prompts": 16, "group_size": 8,
                                                                           "max_new_tokens": 64, "minibatches": 4},
            "machine": "m", "versions": {"trl": "1.16.0", "transformers": "5.23.0"}, "cycles": 3, "warmup": 1,
            "checks": ["check one"]}


def test_table_and_markdown():
    res = fake_result(1.75)
    rows = bt.table_rows(res)
    assert [r[0] for r in rows] == ["trl_1", "ours", "trl_2"]
    assert rows[0][-2:] == ["1.50x", "1.75x"] and rows[1][-2:] == ["-", "-"] and rows[2][-2:] == ["4.50x", "4.25x"]
    assert rows[0][:7] == ["trl_1", "2.00", "128", "6000", "46.9", "64.0", "3000"]
    md = bt.markdown(res, "python -m gspo_bench bench --vs trl", "abc")
    assert "| trl_1 | 2.00 | 128 | 6000 | 46.9 | 64.0 | 3000 | 1.50x | 1.75x |" in md
    assert "lowest 1.75x -> NOT met" in md and "- check one" in md and "`python -m gspo_bench bench --vs trl`" in md
    assert "lowest 4.10x -> met" in bt.verdict(fake_result(4.1))
    assert "without huge pages, as TRL runs by default" in md  # what torch's allocator was told, either way
    assert "with huge pages asked for" in bt.markdown({**res, "huge_pages": True}, "c", "abc")


# -- the command's errors -----------------------------------------------------------------------------------
def one_error(capsys) -> str:
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).strip().splitlines() if "error" in line]
    assert len(errors) == 1, errors
    return errors[0]


def test_without_trl_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="compare"):
        bt.import_trl()
    assert main(["bench", "--vs", "trl", "--json", str(tmp_path / "v.json")]) == 2
    assert "pip install 'gspo-bench[compare]'" in one_error(capsys)
    assert not (tmp_path / "v.json").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("argv, needle", [(["--vs", "foo"], "'foo': allowed trl"),
                                          (["--vs", "trl", "--whole"], "--whole"),
                                          (["--vs", "trl", "--model", "tiny-dense,tiny-moe"], "one --model")])
def test_bad_vs_input_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    assert main(["bench", *argv, "--json", str(tmp_path / "v.json")]) == 2
    assert needle in one_error(capsys)
    assert not (tmp_path / "v.json").exists() and not (tmp_path / "cache").exists()


# -- one real comparison at smoke size ----------------------------------------------------------------------
@pytest.mark.slow
def test_vs_trl_end_to_end(tmp_path, monkeypatch, mixed_task):
    pytest.importorskip("trl", reason=NO_TRL)
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    # the mixed task's verifier rewards about half of any group untrained, so the advantages are not all zero
    argv = ["bench", "--vs", "trl", "--task", mixed_task, "--set", "rollout.prompts_per_step=4", "--set",
            "rollout.group_size=4", "--max-new-tokens", "8", "--rl-steps", "1", "--json", "v.json",
            "--markdown", "v.md"]
    assert main(argv) == 0
    d = json.loads((tmp_path / "v.json").read_text())["vs_trl"]
    assert d["order"] == list(d["runs"]) == ["trl_1", "ours", "trl_2"]
    assert (d["config"]["prompts"], d["config"]["group_size"], d["config"]["max_new_tokens"]) == (4, 4, 8)
    for name in ("trl_1", "trl_2"):
        r = d["runs"][name]
        assert r["extra"]["optimizer_steps"] == 8 and r["optimizer_steps_per_cycle"] == 4  # (1 warm-up + 1) x 4
        assert r["extra"]["params_changed"] is True  # TRL's optimiser steps really moved the weights
        assert r["cycles"] == 1 and r["completions"] == 16 and 16 <= r["gen_tokens"] <= 16 * 8
        assert r["extra"]["logged_mean_length"] == pytest.approx(r["mean_length"])  # TRL's own metric agrees
        assert r["seconds"] > 0 and r["gen_tokens_per_s"] == pytest.approx(r["gen_tokens"] / r["seconds"])
    ours = d["runs"]["ours"]
    assert ours["completions"] == 16 and ours["cycles"] == 1 and ours["extra"]["engine"] == "fast"
    assert ours["extra"]["old_logp_source"] == "rollout" and ours["seconds"] > 0
    for name in ("trl_1", "trl_2"):
        for k in ("completions_per_s", "gen_tokens_per_s"):
            assert d["ratios"][name][k] == pytest.approx(ours[k] / d["runs"][name][k]) and d["ratios"][name][k] > 0
    assert d["target"]["min_ratio"] == min(q["gen_tokens_per_s"] for q in d["ratios"].values())
    assert all(c.endswith("yes") for c in d["checks"][:2])
    md = (tmp_path / "v.md").read_text()
    assert "| trl_1 |" in md and "| ours |" in md and "| trl_2 |" in md and "`python -m gspo_bench bench --vs trl" in md
