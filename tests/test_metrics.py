from gspo_bench.metrics import StepStats


def test_step_stats_reduce_by_key_suffix():
    s = StepStats()
    s.add({"ratio/max": 1.5, "ratio/min": 0.9, "clip/frac": 0.1, "ratio/seq_max": 2.0})
    s.add({"ratio/max": 1.2, "ratio/min": 0.7, "clip/frac": 0.3, "ratio/seq_max": 3.0})
    out = s.reduce()
    assert out["ratio/max"] == 1.5 and out["ratio/seq_max"] == 3.0
    assert abs(out["ratio/min"] - 0.7) < 1e-7
    assert abs(out["clip/frac"] - 0.2) < 1e-7
