"""The entropy bonus's coefficient, fixed and adaptive (``core/entropy_control.py``), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_bench.config import Recipe, load_config
from gspo_bench.core.entropy_control import EntropyControl
from gspo_bench.core.losses import LOSSES

F64 = torch.float64
H = [[1.0, 2.0, 0.5], [0.3, 0.7, 9.0]]  # entropies; the padding entry is garbage
MASK = [[1, 1, 1], [1, 1, 0]]


def t(x):
    return torch.tensor(x, dtype=F64)


def _control(**loss) -> EntropyControl:
    """The control a run with these ``loss.*`` settings starts with."""
    cfg = load_config("smoke", overrides={"loss": loss})
    return EntropyControl.of(cfg.resolve("grpo", Recipe(loss_defaults=LOSSES["grpo"].param_defaults()), 8).loss)


def test_adaptive_entropy_coefficient_by_hand():
    m = _control(entropy_coef=0.02, entropy_target=1.0, entropy_coef_delta=0.01, entropy_coef_max=0.035)
    mask = t(MASK)
    # before any step nothing was measured: no bonus
    assert m.applied() == 0.0
    # step 1: Hbar = .9 <= 1: c .02 -> .03, and the bonus applies from the next step on
    m.adapt(t(H), mask)
    assert (m.coef, m.last_entropy) == (pytest.approx(0.03), pytest.approx(0.9))
    assert m.applied() == pytest.approx(0.03)
    # step 2: Hbar .9 again: .03 -> min(.04, .035)
    m.adapt(t(H), mask)
    assert m.coef == pytest.approx(0.035)
    # step 3: Hbar = (2 + 2 + 2 + 2 + 2) / 5 = 2 > 1: c -> .025 and no bonus next step
    m.adapt(torch.full((2, 3), 2.0, dtype=F64), mask)
    assert m.coef == pytest.approx(0.025) and m.applied() == 0.0
    # down to the floor and no further
    for _ in range(5):
        m.adapt(torch.full((2, 3), 2.0, dtype=F64), mask)
    assert m.coef == 0.0
    # with the top-entropy mask, Hbar is over the kept tokens: (1 + 2) / 2 = 1.5
    m = _control(entropy_target=1.0, top_entropy_quantile=0.4)
    m.adapt(t(H), mask)
    assert m.last_entropy == pytest.approx(1.5)
    # a fixed coefficient is applied from the first step
    assert _control(entropy_coef=0.01).applied() == 0.01


def test_only_a_coefficient_or_a_target_puts_the_entropy_in_the_loss():
    assert not _control().in_loss
    assert _control(entropy_coef=0.01).in_loss
    assert _control(entropy_target=1.0).in_loss  # c starts at 0 and may grow
    fixed = _control(entropy_coef=0.01)
    fixed.adapt(t(H), t(MASK))  # no target: nothing moves, nothing is measured
    assert (fixed.coef, fixed.last_entropy) == (0.01, math.inf)


def test_the_mean_is_over_every_process_s_tokens():
    # this rank's sums (0.9 * 5, 5) plus another rank's (3 * 5, 5): Hbar = (4.5 + 15) / 10 = 1.95 > 1.5
    m = _control(entropy_coef=0.02, entropy_target=1.5, entropy_coef_delta=0.01)
    m.adapt(t(H), t(MASK), all_sum=lambda sums: sums + t([15.0, 5.0]))
    assert (m.coef, m.last_entropy) == (pytest.approx(0.01), pytest.approx(1.95))
    alone = _control(entropy_coef=0.02, entropy_target=1.5, entropy_coef_delta=0.01)
    alone.adapt(t(H), t(MASK))
    assert (alone.coef, alone.last_entropy) == (pytest.approx(0.03), pytest.approx(0.9))


def test_its_state_round_trips_so_a_resumed_run_continues_it():
    m = _control(entropy_coef=0.02, entropy_target=1.0, entropy_coef_delta=0.01)
    m.adapt(t(H), t(MASK))
    fresh = _control(entropy_coef=0.02, entropy_target=1.0, entropy_coef_delta=0.01)
    assert fresh.state_dict() == {"coef": 0.02, "last_entropy": math.inf}
    fresh.load_state_dict(m.state_dict())
    assert (fresh.coef, fresh.last_entropy, fresh.applied()) == (m.coef, m.last_entropy, m.applied())
