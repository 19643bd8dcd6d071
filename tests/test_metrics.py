import math

from gspo_bench.core.metrics import StepStats


def test_step_stats_reduce_by_key_suffix():
    s = StepStats()
    s.add({"ratio/max": 1.5, "ratio/min": 0.9, "clip/frac": 0.1, "ratio/seq_max": 2.0})
    s.add({"ratio/max": 1.2, "ratio/min": 0.7, "clip/frac": 0.3, "ratio/seq_max": 3.0})
    out = s.reduce()
    assert out["ratio/max"] == 1.5 and out["ratio/seq_max"] == 3.0
    assert abs(out["ratio/min"] - 0.7) < 1e-7
    assert abs(out["clip/frac"] - 0.2) < 1e-7


def test_a_nan_in_one_minibatch_stays_in_the_step_value():
    # losses [nan, .5, .7, .4] must not average to 0.533: the step's loss is NaN, and so is a NaN max/min
    s = StepStats()
    for loss, rmax in ((float("nan"), float("nan")), (0.5, 1.2), (0.7, 1.1), (0.4, 1.3)):
        s.add({"train/loss": loss, "ratio/max": rmax, "ratio/min": rmax})
    out = s.reduce()
    assert math.isnan(out["train/loss"]) and math.isnan(out["ratio/max"]) and math.isnan(out["ratio/min"])
    inf = StepStats()
    inf.add({"train/grad_norm": float("inf")})
    inf.add({"train/grad_norm": 1.0})
    assert inf.reduce()["train/grad_norm"] == float("inf")
