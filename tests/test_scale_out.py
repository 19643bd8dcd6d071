"""``scale_out report``: the split into shrinking and fixed work, and the communication arithmetic, by hand."""

from __future__ import annotations

import json

from gspo_bench.bench.scale_out import report


def test_report_splits_fixed_and_per_rank_work_and_adds_the_collectives(tmp_path):
    base = {"threads_per_process": 1, "steps": 6, "prompts_per_step": 64, "group_size": 8, "minibatches": 4,
            "params": 1_000_000, "gen_s": 0.2, "train_s": 0.8}
    one = {**base, "processes": 1, "rows_per_rank": 512, "step_s": 1.0}
    # comm per step = 4 x 10 + 1 + 4 x 0.5 + 2 x 3.5 = 50 ms, so T(2) - comm = 0.6 = F + W / 2 with F + W = 1.0
    two = {**base, "processes": 2, "rows_per_rank": 256, "step_s": 0.65, "grad_allreduce_ms": 10.0,
           "lengths_allgather_ms": 1.0, "flag_allreduce_ms": 0.5, "metrics_allgather_ms": 3.5}
    (tmp_path / "one.json").write_text(json.dumps(one))
    (tmp_path / "two.json").write_text(json.dumps(two))
    text = report(str(tmp_path / "one.json"), str(tmp_path / "two.json"), str(tmp_path / "out.md"), "cmd", "abc")
    assert (tmp_path / "out.md").read_text() == text and "at commit `abc`" in text
    assert "**50.0 ms**" in text and "W = 0.800 s, F = 0.200 s" in text
    # N = 8 over 200 GB/s: 4 x 1.75 x 4 MB / 200 GB/s = 0.14 ms, plus 1 + 4 x 0.5 + 2 x 3.5 = 10 ms of small
    # collectives; T = 0.2 + 0.8 / 8 + 0.01014 = 0.310 s, 3.2x
    assert "| 8 | NVLink, 200 GB/s | 10.14 ms | 0.310 s | 3.2x |" in text
    assert "caps the speed-up at T(1) / F = 5.0x" in text
