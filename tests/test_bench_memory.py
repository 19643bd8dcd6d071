"""``bench --memory``'s pieces that run without measuring (gspo_bench.bench.memory): the settings each child gets,
the sentences of the two bounds, a killed child, and the optimiser states allocated without moving a weight."""

from __future__ import annotations

import subprocess

import pytest
import torch

from gspo_bench.bench import memory as bm


def test_each_measurement_gets_the_defaults_then_the_commands_sets_then_its_controls_and_size():
    sets = bm.child_overrides(("rollout.max_new_tokens=16",), "all", 7)
    assert sets[: len(bm.DEFAULT_SETTINGS)] == bm.DEFAULT_SETTINGS
    assert "rollout.engine=fast" in bm.DEFAULT_SETTINGS  # one copy of the weights in the process
    rest = sets[len(bm.DEFAULT_SETTINGS):]
    assert rest == ("rollout.max_new_tokens=16", "train.micro_batch_tokens=256", "train.logit_chunk_tokens=256",
                    "train.activation_checkpointing=true", "rollout.prompts_per_step=7")
    assert bm.child_overrides((), "all-select", 4)[len(bm.DEFAULT_SETTINGS) + 2] == \
        "train.activation_checkpointing=selective"
    assert bm.parse_controls(["none", "all", "none"]) == ["none", "all"]
    from gspo_bench.config import ConfigError

    with pytest.raises(ConfigError, match="unknown controls huge"):
        bm.parse_controls(["huge"])


def test_the_bounds_as_sentences_with_their_ratios():
    gib = 2**30
    results = [{"controls": "none", "prompts": 4, "added": 4 * gib}, {"controls": "all", "prompts": 4, "added": 3 * gib},
               {"controls": "none", "prompts": 16, "added": 12 * gib},
               {"controls": "all", "prompts": 16, "added": 3.36 * gib},
               {"controls": "all-select", "prompts": 16, "added": 4.2 * gib}]
    lines = bm.ratios(results)
    assert "`none`: the 16-prompt rollout's step adds 3.00x what the 4-prompt one's adds" in lines
    assert "`all`: the 16-prompt rollout's step adds 1.12x what the 4-prompt one's adds" in lines
    assert "16 prompts: every control on, the step adds 0.28x what it adds with none" in lines
    assert "4 prompts: every control on, the step adds 0.75x what it adds with none" in lines
    assert "16 prompts: every control on (selective checkpointing), the step adds 0.35x what it adds with none" in lines
    assert not any("4 prompts: every control on (selective" in line for line in lines)  # not measured at 4


def test_a_killed_measurement_says_so(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, -9, "", ""))
    r = bm.measure("default", (), "none", 24, "grpo")
    assert "killed by signal 9" in r["error"] and "out of memory" in r["error"] and "added" not in r
    assert bm.rows([r], 4)[0][3] == "failed"
    assert bm.failure_line(r["error"]).startswith("the measurement was killed by signal 9 (SIGKILL")


def test_a_failed_measurement_is_told_by_its_last_line_whole():
    long = "ValueError: model 'x' not found: " + "not a built-in model, " * 20 + "or give its local directory"
    out = f"Traceback (most recent call last):\n  File \"a.py\", line 1\n{long}\n\n"
    assert bm.failure_line(out) == long  # not its last few hundred characters, cut mid-word at the front
    assert bm.failure_line("") == "no output"


def test_optimiser_states_are_allocated_and_no_weight_moves():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=0.1, weight_decay=0.1, fused=True)  # decay too: unmoved
    before = [p.detach().clone() for p in net.parameters()]

    class Trainer:
        optimizers = [opt]

    bm.AllocateOptimiserStates().on_train_start(Trainer(), None)
    for p, b in zip(net.parameters(), before):
        assert torch.equal(p, b) and p.grad is None  # an update of exactly 0, the gradients freed
        state = opt.state[p]
        assert state["exp_avg"].shape == p.shape and torch.count_nonzero(state["exp_avg_sq"]) == 0
    assert [g["lr"] for g in opt.param_groups] == [0.1]  # the rate is back


def test_a_profiled_measurement_writes_the_step_s_phases_then_its_operators(tmp_path):
    """``--profile``: a second step under torch.profiler, in micro-batches here: one forward, loss and backward
    per micro-batch, one merge of their metrics for the minibatch, one prepare and one optimiser step."""
    from gspo_bench.config import parse_sets

    path = tmp_path / "micro-2p.txt"
    sets = [*bm.DEFAULT_SETTINGS, "model.name=tiny-dense", "rollout.prompts_per_step=2", "train.micro_batch_tokens=64"]
    result = bm.measure_step("default", parse_sets(sets), "grpo", profile=str(path))
    assert result["seconds"] > 0 and result["rows"] == 8
    text = path.read_text()
    calls = {line.split()[0]: int(line.split()[1]) for line in text.splitlines() if line.startswith("step/")}
    assert set(calls) == set(bm.PHASES)
    parts = calls["step/forward"]
    assert parts >= 2 and calls["step/loss"] == calls["step/backward"] == parts
    assert calls["step/prepare"] == calls["step/metrics"] == calls["step/optimizer"] == 1
    assert "aten::mm" in text and "Self CPU" in text  # then torch.profiler's own table of operators
    # and the operators by their inputs' shapes: products with tiny-dense's (512, 128) MLP weights among them
    shapes = text.split("by input shapes:")[1]
    assert "Input Shapes" in shapes and any("aten::mm" in ln and "[128, 512]]" in ln for ln in shapes.splitlines())


def _round(controls, prompts, seconds, gib=2**30):
    return {"controls": controls, "prompts": prompts, "seconds": seconds, "added": 3 * gib, "peak": 10 * gib,
            "rows": 16, "response_tokens": 512, "device": "cpu"}


def test_rounds_give_medians_and_the_time_bounds_are_taken_round_by_round():
    # round 2 is a slow spell of the machine: both sides of its ratios are slow alike
    raw = [_round("none", 4, 40.0), _round("micro", 4, 46.0), _round("all", 4, 70.0),
           _round("none", 4, 80.0), _round("micro", 4, 88.0), _round("all", 4, 120.0),
           _round("none", 4, 50.0), _round("micro", 4, 65.0), _round("all", 4, 75.0)]
    med = bm.medians(raw)
    assert [(r["controls"], r["seconds"], r["rounds_s"]) for r in med] == [
        ("none", 50.0, [40.0, 80.0, 50.0]), ("micro", 65.0, [46.0, 88.0, 65.0]), ("all", 75.0, [70.0, 120.0, 75.0])]
    lines = bm.time_ratios(raw)
    # micro: 46/40 = 1.15, 88/80 = 1.10, 65/50 = 1.30 -> median 1.15; all: 1.75, 1.50, 1.50 -> median 1.50
    assert lines == [
        "4 prompts: `micro` takes 1.15x the uncontrolled step's seconds (median of 3 rounds; rounds 1.10x to 1.30x), "
        "inside its bound of 1.2x",
        "4 prompts: `all` takes 1.50x the uncontrolled step's seconds (median of 3 rounds; rounds 1.50x to 1.75x), "
        "inside its bound of 1.6x"]
    # the ratio of the medians (65/50 = 1.30) would have put micro over its bound
    page = bm.markdown(med, 4, "python -m gspo_bench bench --memory none,micro,all --rounds 3", "abc", "cpu", raw=raw)
    assert "median of 3 rounds" in page and "| micro | 4 | 46.0 | 88.0 | 65.0 |" in page
    assert "| micro | 4 x 4 | 512 | 3.00 | 10.00 | 65.0 |" in page


def test_a_round_that_failed_leaves_the_others_and_a_control_over_its_bound_says_so():
    failed = {"controls": "micro", "prompts": 16, "error": "killed"}
    raw = [_round("none", 16, 80.0), _round("micro", 16, 104.0), _round("none", 16, 90.0), failed]
    med = bm.medians(raw)
    assert med[1]["rounds_s"] == [104.0] and med[1]["failed_rounds"] == 1
    assert bm.time_ratios(raw) == ["16 prompts: `micro` takes 1.30x the uncontrolled step's seconds (median of 1 "
                                   "round), over its bound of 1.2x"]
    assert bm.medians([failed]) == [failed]
