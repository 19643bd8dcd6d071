"""Collapse detection and the MoE expert-flip probe (gspo_bench.callbacks)."""

from __future__ import annotations


import pytest
import torch

from gspo_bench.callbacks import COLLAPSE_KINDS, CollapseDetector, RouterRecorder, expert_flip_rate, route
from gspo_bench.config import CollapseConfig
from gspo_bench.models import build_builtin

NORMAL = {
    "reward/mean": 0.5,
    "policy/entropy": 1.2,
    "response/length_mean": 4.0,
    "ratio/max": 1.3,
    "ratio/token_log_std": 0.05,
    "train/loss": 0.1,
    "train/grad_norm": 0.7,
    "train/nonfinite": 0.0,
}


def kinds(events):
    return [e.kind for e in events]


# ----------------------------------------------------------------------------- reward_drop


def test_reward_drop_fires_once_and_rearms():
    # relative: fires when the running mean < (1 - 0.4) x its best; best 0.75 -> threshold 0.45
    d = CollapseDetector(CollapseConfig(window=2, reward_drop=0.4))
    # (reward, running mean of the last 2, best running mean, fires?)
    script = [
        (0.5, None, None, False),  # window not full yet
        (0.5, 0.5, 0.5, False),
        (1.0, 0.75, 0.75, False),
        (0.25, 0.625, 0.75, False),  # 0.625 >= 0.6 x 0.75
        (0.0, 0.125, 0.75, True),  # 0.125 < 0.45: fires
        (0.0, 0.0, 0.75, False),  # still below, already active: no new event
        (1.0, 0.5, 0.75, False),  # back above 0.45: re-armed
        (0.0, 0.5, 0.75, False),
        (0.0, 0.0, 0.75, True),  # falls again: fires again
    ]
    fired = []
    for step, (r, running, best, fires) in enumerate(script):
        ev = [e for e in d.update(step, {"reward/mean": r}) if e.kind == "reward_drop"]
        assert bool(ev) == fires, step
        if best is not None:
            assert d.best_running == pytest.approx(best)
        if ev:
            (e,) = ev
            assert e.step == step
            assert e.value == pytest.approx(running)
            assert e.threshold == pytest.approx((1 - 0.4) * best)
            fired.append(step)
    assert fired == [4, 8]


def test_reward_drop_ignores_nonfinite_and_missing_rewards():
    d = CollapseDetector(CollapseConfig(window=2, reward_drop=0.3))
    d.update(0, {"reward/mean": 1.0})
    d.update(1, {"reward/mean": 1.0})
    assert d.update(2, {"reward/mean": float("nan")}) == []
    assert d.update(3, {}) == []
    assert list(d.rewards) == [1.0, 1.0]
    # window [1.0, 0.0]: running 0.5 < (1 - 0.3) x best 1.0
    assert kinds(d.update(4, {"reward/mean": 0.0})) == ["reward_drop"]
    assert "reward_drop" in d.active


def test_reward_drop_small_dip_does_not_fire():
    d = CollapseDetector(CollapseConfig(window=3, reward_drop=0.3))
    for step, r in enumerate([0.6, 0.6, 0.6, 0.4, 0.4, 0.5]):
        assert kinds(d.update(step, {"reward/mean": r})) == []  # lowest running mean 0.4667 > 0.7 x 0.6


# ----------------------------------------------------------------------------- the other kinds


def test_normal_metrics_fire_nothing():
    d = CollapseDetector(CollapseConfig(window=2))
    for step in range(5):
        assert d.update(step, dict(NORMAL)) == []
    assert d.active == set()


@pytest.mark.parametrize("bad,kind", [
    ({"policy/entropy": 0.001}, "entropy_collapse"),
    ({"response/length_mean": 12.5}, "length_blowup"),  # > 3 x 4.0 (the first step's)
    ({"ratio/max": 1500.0}, "ratio_explosion"),  # > ratio_max 1000
    ({"ratio/token_log_std": 2.5}, "ratio_explosion"),
    ({"train/loss": float("nan")}, "nonfinite"),
    ({"train/grad_norm": float("inf")}, "nonfinite"),
    ({"train/nonfinite": 1.0}, "nonfinite"),
])
def test_each_kind_fires_on_crafted_metrics(bad, kind):
    assert kind in COLLAPSE_KINDS
    d = CollapseDetector(CollapseConfig())
    assert d.update(0, dict(NORMAL)) == []
    ev = d.update(1, {**NORMAL, **bad})
    assert kinds(ev) == [kind]
    assert ev[0].step == 1 and isinstance(ev[0].time, float) and ev[0].detail
    # stuck in the same state: no second event; back to normal and bad again: a new one
    assert d.update(2, {**NORMAL, **bad}) == []
    assert d.update(3, dict(NORMAL)) == []
    assert kinds(d.update(4, {**NORMAL, **bad})) == [kind]


def test_thresholds_are_strict_and_values_reported():
    c = CollapseConfig(entropy_floor=0.01, length_factor=2.0, ratio_max=10.0, delta_std_max=1.0)
    d = CollapseDetector(c)
    assert d.update(0, {"response/length_mean": 5.0}) == []
    # exactly at each threshold: nothing fires
    assert d.update(1, {"policy/entropy": 0.01, "response/length_mean": 10.0, "ratio/max": 10.0,
                        "ratio/token_log_std": 1.0}) == []
    ev = {e.kind: e for e in d.update(2, {"policy/entropy": 0.009, "response/length_mean": 10.5,
                                          "ratio/max": 10.5, "ratio/token_log_std": 0.5})}
    assert set(ev) == {"entropy_collapse", "length_blowup", "ratio_explosion"}
    assert (ev["entropy_collapse"].value, ev["entropy_collapse"].threshold) == (0.009, 0.01)
    assert (ev["length_blowup"].value, ev["length_blowup"].threshold) == (10.5, 10.0)
    assert (ev["ratio_explosion"].value, ev["ratio_explosion"].threshold) == (10.5, 10.0)


def test_length_blowup_baseline_is_at_least_one_token():
    d = CollapseDetector(CollapseConfig(length_factor=3.0))
    d.update(0, {"response/length_mean": 0.0})  # baseline clamps to 1 token
    assert d.update(1, {"response/length_mean": 2.9}) == []
    assert kinds(d.update(2, {"response/length_mean": 3.5})) == ["length_blowup"]


def test_nonfinite_detail_names_the_culprits():
    d = CollapseDetector(CollapseConfig())
    (e,) = d.update(0, {"train/loss": float("nan"), "train/grad_norm": float("inf"), "train/nonfinite": 1.0})
    assert e.kind == "nonfinite" and e.value == 3.0
    assert "train/loss" in e.detail and "train/grad_norm" in e.detail and "skipped update" in e.detail


# ----------------------------------------------------------------------------- expert flips


def test_expert_flip_rate_by_hand():
    old = torch.tensor([[[0, 1], [2, 3], [4, 5]]])  # (L=1, N=3, K=2)
    new = torch.tensor([[[1, 0], [2, 6], [7, 7]]])
    mask = torch.tensor([1, 1, 0])
    # token 0: reordered, no flip; token 1: expert 3 gone (1 of 2); token 2: masked out
    assert expert_flip_rate(old, new, mask).item() == pytest.approx(1 / 4)
    assert expert_flip_rate(old, new, torch.tensor([1, 1, 1])).item() == pytest.approx(3 / 6)
    assert expert_flip_rate(old, old, torch.tensor([1, 1, 1])).item() == 0.0
    # nothing unmasked: 0, not NaN
    assert expert_flip_rate(old, new, torch.tensor([0, 0, 0])).item() == 0.0


def test_expert_flip_rate_two_layers_bool_mask():
    old = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # (L=2, N=2, K=2)
    new = torch.tensor([[[1, 0], [3, 4]], [[0, 1], [7, 6]]])
    # layer 0: token 0 no flip, token 1 one flip; layer 1: token 0 two flips, token 1 none -> 3 of 8
    assert expert_flip_rate(old, new, torch.tensor([True, True])).item() == pytest.approx(3 / 8)
    # only token 1: layer 0 one flip, layer 1 none -> 1 of 4
    assert expert_flip_rate(old, new, torch.tensor([False, True])).item() == pytest.approx(1 / 4)


# ----------------------------------------------------------------------------- router recording


@pytest.fixture(scope="module")
def moe():
    model, tok = build_builtin("tiny-moe", 0)
    return model.eval(), tok


def test_route_on_tiny_moe(moe):
    model, tok = moe
    enc = tok(["12+34=", "5+6="], return_tensors="pt", padding=True, add_special_tokens=False)
    B, S = enc["input_ids"].shape
    idx = route(model, enc["input_ids"], enc["attention_mask"])
    assert idx.shape == (4, B * S, 2)
    assert idx.dtype in (torch.int64, torch.int32)
    assert idx.min() >= 0 and idx.max() < 8
    assert (idx[..., 0] != idx[..., 1]).all()  # two distinct experts per token
    # the same tokens route the same way again, and hooks are removed afterwards
    assert torch.equal(route(model, enc["input_ids"], enc["attention_mask"]), idx)
    gate = model.model.layers[0].mlp.gate
    assert len(gate._forward_hooks) == 0
    # a token's route does not depend on the padding in front of it (position ids follow the mask)
    alone = tok(["5+6="], return_tensors="pt", add_special_tokens=False)
    idx1 = route(model, alone["input_ids"], alone["attention_mask"])
    n_pad = int((enc["attention_mask"][1] == 0).sum())
    row1 = idx.view(4, B, S, 2)[:, 1, n_pad:]
    assert torch.equal(row1.sort(-1).values, idx1.sort(-1).values)


def test_router_recorder_collects_one_entry_per_layer(moe):
    model, _ = moe
    rec = RouterRecorder(model)
    assert len(rec.gates) == 4
    ids = torch.tensor([[5, 6, 7]])
    with rec:
        with torch.no_grad():
            model(input_ids=ids)
    assert len(rec.indices) == 4 and all(t.shape == (3, 2) for t in rec.indices)
    with torch.no_grad():
        model(input_ids=ids)
    assert len(rec.indices) == 4  # nothing recorded outside the context


def test_router_recorder_finds_no_gates_on_dense():
    model, _ = build_builtin("tiny-dense", 0)
    assert RouterRecorder(model).gates == []


def test_flip_rate_zero_for_unchanged_policy_and_positive_after_perturbation(moe):
    model, tok = moe
    enc = tok(["12+34=", "5+6="], return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"].flatten().bool()
    old = route(model, enc["input_ids"], enc["attention_mask"])
    assert expert_flip_rate(old, route(model, enc["input_ids"], enc["attention_mask"]), mask).item() == 0.0
    gates = RouterRecorder(model).gates
    saved = [g.weight.detach().clone() for g in gates]
    try:
        with torch.no_grad():
            for g in gates:
                g.weight.mul_(-1.0)  # reverses every router's preference order
        new = route(model, enc["input_ids"], enc["attention_mask"])
        rate = expert_flip_rate(old, new, mask).item()
        assert 0.5 < rate <= 1.0
    finally:
        with torch.no_grad():
            for g, w in zip(gates, saved):
                g.weight.copy_(w)


def test_nan_ratio_statistics_fire_ratio_explosion_and_nonfinite():
    from gspo_bench.config import CollapseConfig

    det = CollapseDetector(CollapseConfig())
    fired = {e.kind for e in det.update(1, {"ratio/max": float("nan"), "ratio/token_log_std": 0.1,
                                              "train/loss": 0.3, "train/nonfinite": 0.0})}
    assert fired == {"ratio_explosion", "nonfinite"}
    det = CollapseDetector(CollapseConfig())
    fired = {e.kind for e in det.update(1, {"ratio/max": 1.1, "ratio/token_log_std": float("inf")})}
    assert "ratio_explosion" in fired


def test_one_skipped_minibatch_fires_nonfinite():
    from gspo_bench.config import CollapseConfig

    det = CollapseDetector(CollapseConfig())
    [event] = det.update(3, {"train/loss": 0.5, "train/grad_norm": 0.2, "train/nonfinite": 0.25,
                             "ratio/max": 1.1, "ratio/token_log_std": 0.1})
    assert event.kind == "nonfinite" and event.step == 3 and "25%" in event.detail


# ----------------------------------------------------------------------------- relative criteria


def test_reward_drop_is_relative_with_an_absolute_floor():
    # a task whose whole reward is 0.2: a fall to 0.05 is a collapse (0.05 < 0.5 x 0.2, drop 0.15 >= 0.05) ...
    d = CollapseDetector(CollapseConfig(window=2, reward_drop=0.5, min_drop=0.05))
    for step, r in enumerate([0.2, 0.2, 0.05]):
        ev = d.update(step, {"reward/mean": r})
    # running means 0.2, then (0.2 + 0.05) / 2 = 0.125 >= 0.1: not yet
    assert kinds(ev) == []
    (e,) = d.update(3, {"reward/mean": 0.05})  # running 0.05 < 0.1
    assert e.kind == "reward_drop" and e.value == pytest.approx(0.05) and e.threshold == pytest.approx(0.1)
    # ... but noise near zero is not: 0.04 -> 0.0 is below half its best, yet only 0.04 in absolute terms
    d = CollapseDetector(CollapseConfig(window=1, reward_drop=0.5, min_drop=0.05))
    assert d.update(0, {"reward/mean": 0.04}) == [] and d.update(1, {"reward/mean": 0.0}) == []


def test_eval_drop_against_the_best_eval_including_the_warm_start():
    d = CollapseDetector(CollapseConfig(eval_drop=0.5, min_drop=0.05))
    assert d.update_eval(0, 0.43) == []  # the warm start
    assert d.update_eval(10, 0.231) == []  # 0.231 >= 0.5 x 0.43 = 0.215
    (e,) = d.update_eval(20, 0.212)
    assert (e.kind, e.step, e.value) == ("eval_drop", 20, 0.212) and e.threshold == pytest.approx(0.215)
    assert d.update_eval(30, 0.146) == []  # still down: one event
    assert d.update_eval(40, float("nan")) == []


def test_kl_spike_is_relative_to_the_runs_median():
    d = CollapseDetector(CollapseConfig(kl_factor=10.0, kl_floor=0.5))
    for step, kl in enumerate([0.02, 0.03, 0.04]):
        assert d.update(step, {"kl/old": kl, "ratio/max": 2.0, "ratio/token_log_std": 0.2}) == []
    # median of earlier steps 0.03: limit max(0.5, 0.3) = 0.5; 0.45 is under it, 60 is far out
    assert d.update(3, {"kl/old": 0.45, "ratio/max": 2.0, "ratio/token_log_std": 0.2}) == []
    (e,) = d.update(4, {"kl/old": 60.0, "ratio/max": 2.0, "ratio/token_log_std": 0.2})
    assert e.kind == "ratio_explosion" and e.value == 60.0 and e.threshold == pytest.approx(0.5)
