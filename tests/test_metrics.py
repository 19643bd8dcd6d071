import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo_bench.core.metrics import (Mean, Plus, StepStats, Total, Whole, extreme_of, mean_of, merge, merged,
                                     spread_of, value, values)
from tests.conftest import examples


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


# -- a minibatch's statistics from its parts ------------------------------------------------------------------


def test_each_kind_merges_by_hand():
    # means: (1*1 + 3*1) / 2 and (5*2) / 2 -> (4 + 10) / 4
    a = mean_of(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0]))
    b = mean_of(torch.tensor([5.0]), torch.tensor([2.0]))
    assert value(a) == 2.0 and value(b) == 5.0 and value(merge(a, b)) == 3.5
    assert value(merge(Total(torch.tensor(0.25)), Total(torch.tensor(0.5)))) == 0.75
    hi = [extreme_of(torch.tensor(x), torch.tensor(k), largest=True) for x, k in (([1.0, 9.0], [True, False]),
                                                                                  ([4.0], [True]))]
    assert value(hi[0]) == 1.0 and value(merge(*hi)) == 4.0  # the 9 is not kept
    lo = merge(extreme_of(torch.tensor([2.0]), torch.tensor([False]), largest=False),
               extreme_of(torch.tensor([3.0]), torch.tensor([False]), largest=False))
    assert value(lo) == 0.0  # nothing kept in either part: 0, as masked_extreme gives
    # population std of {1, 3} and {5, 5, 5}: mean 19/5, sum of squares 7.84+0.64+3*1.44 = 12.8, std sqrt(2.56) = 1.6
    s = merge(spread_of(torch.tensor([1.0, 3.0]), torch.ones(2)), spread_of(torch.full((3,), 5.0), torch.ones(3)))
    assert value(s).item() == pytest.approx(1.6, rel=1e-6) and s.mean.item() == pytest.approx(3.8, rel=1e-6)
    both = merge(Plus((mean_of(torch.tensor([1.0]), torch.ones(1)), Total(torch.tensor(2.0)))),
                 Plus((mean_of(torch.tensor([0.0]), torch.ones(1)), Total(torch.tensor(1.0)))))
    assert value(both) == 0.5 + 3.0


def test_an_empty_part_changes_no_statistic():
    x, w = torch.tensor([0.5, 2.0, -1.0]), torch.tensor([1.0, 1.0, 1.0])
    none = torch.zeros(2)
    for whole, empty in ((mean_of(x, w), mean_of(torch.tensor([7.0, 8.0]), none)),
                         (spread_of(x, w), spread_of(torch.tensor([7.0, 8.0]), none))):
        assert value(merge(empty, whole)) == value(whole) and value(merge(whole, empty)) == value(whole)
    spread = spread_of(x, w)  # and a spread's mean too, which later merges build on
    assert merge(spread_of(x[:0], w[:0]), spread).mean == spread.mean == merge(spread, spread_of(x[:0], w[:0])).mean
    assert value(spread_of(torch.tensor([7.0]), torch.zeros(1))) == 0.0


def test_nan_in_a_part_stays_in_the_merged_value():
    nan = torch.tensor([float("nan")])
    keep = torch.ones(1, dtype=torch.bool)
    for kind in (lambda x: mean_of(x, torch.ones(1)), lambda x: extreme_of(x, keep, True),
                 lambda x: extreme_of(x, keep, False), lambda x: spread_of(x, torch.ones(1))):
        assert math.isnan(value(merge(kind(torch.tensor([1.0])), kind(nan))))
        assert math.isnan(value(merge(kind(nan), kind(torch.tensor([1.0])))))


def test_kinds_that_cannot_merge_say_so():
    with pytest.raises(ValueError, match="whole minibatch"):
        merge(Whole(torch.tensor(1.0)), Whole(torch.tensor(2.0)))
    with pytest.raises(TypeError, match="Mean with a Total"):
        merge(Mean(torch.tensor(1.0), torch.tensor(1.0)), Total(torch.tensor(1.0)))
    with pytest.raises(ValueError, match="different statistics"):
        merged([{"a": Total(torch.tensor(1.0))}, {"b": Total(torch.tensor(1.0))}])


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.floats(-50, 50, width=32), st.sampled_from([0.0, 1.0, 2.5])), min_size=1, max_size=24),
       st.lists(st.integers(0, 24), max_size=4))
def test_merging_any_split_of_the_rows_gives_the_whole_rows_statistics(rows, cuts):
    x = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    w = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    keep = w > 0
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    parts = [{"mean": mean_of(x[a:b], w[a:b]), "max": extreme_of(x[a:b], keep[a:b], True),
              "min": extreme_of(x[a:b], keep[a:b], False), "std": spread_of(x[a:b], w[a:b]),
              "sum": Total((x[a:b] * w[a:b]).sum())} for a, b in zip(bounds, bounds[1:])]
    got = values(merged(parts))
    want = values({"mean": mean_of(x, w), "max": extreme_of(x, keep, True), "min": extreme_of(x, keep, False),
                   "std": spread_of(x, w), "sum": Total((x * w).sum())})
    for k in want:
        assert got[k].item() == pytest.approx(want[k].item(), rel=1e-9, abs=1e-9), k
    # the weighted population std, straight from its definition
    n = w.sum()
    direct = (((x - (x * w).sum() / n) ** 2 * w).sum() / n).sqrt() if n > 0 else torch.tensor(0.0)
    assert got["std"].item() == pytest.approx(direct.item(), rel=1e-9, abs=1e-9)
