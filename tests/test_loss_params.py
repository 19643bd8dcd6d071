"""One declaration per loss parameter (``core/loss_params.py``): its range and its error line, and a toy loss with a
toy parameter that reaches the config, ``--set``, the resolved hyper-parameters, the loss and ``tune``'s search
space with no other edit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import optuna
import pytest
import torch

from gspo_bench.algorithms.base import ALGORITHMS, PolicyModule, register_algorithm, search_space
from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError, load_config, parse_sets, to_dict
from gspo_bench.core.loss_params import EPS_LOW, K_POS, PARAMS, TAU_POS, LossParam, declare
from gspo_bench.core.losses import LOSSES, loss_keywords, policy_loss, register_loss
from gspo_bench.tuning.study import chosen_params


def test_ranges_and_their_error_text():
    assert EPS_LOW.valid(0.0) and EPS_LOW.valid(None) and not EPS_LOW.valid(1.0) and not EPS_LOW.valid(-0.1)
    assert EPS_LOW.range_text() == "a finite number in [0, 1) (or null: no lower bound)"
    assert TAU_POS.valid(0.5) and not TAU_POS.valid(0.0) and not TAU_POS.valid(None)
    assert TAU_POS.range_text() == "a finite number > 0"
    assert K_POS.valid(-3.0) and K_POS.range_text() == "a finite number"
    for bad in (math.nan, math.inf, True, "big"):
        assert not K_POS.valid(bad), bad
    assert EPS_LOW.at(0.3, search=(0.1, 0.5, False)) == EPS_LOW.at(0.3, search=(0.1, 0.5, False))
    assert EPS_LOW.at(0.3).name == "eps_low" and EPS_LOW.default == 0.2  # a loss's copy leaves the declaration
    with pytest.raises(ValueError, match="already declared"):
        declare(LossParam("eps_low", 0.1, "Twice."))


@pytest.fixture
def toy():
    """A toy loss ``toy`` with one parameter of its own, ``toy_temp`` in (0, 2], default 0.5, searched over
    0.1 .. 1.5; unregistered afterwards. The loss records the value it was called with."""
    seen = []
    temp = declare(LossParam("toy_temp", 0.5, "Toy temperature.", low=0.0, low_open=True, high=2.0,
                             search=(0.1, 1.5, True)))
    try:
        @register_loss("toy", ratio="token", loss="-A r / t", aggregation="token-mean", params=(temp,), band=None,
                       paper="Toy, https://arxiv.org/abs/0000.00000")
        def toy_loss(logp, old_logp, advantages, mask, *, toy_temp):
            seen.append(toy_temp)
            # L = -A * r / t
            loss_BT = -advantages[:, None] * torch.exp(logp - old_logp) / toy_temp
            none_BT = torch.zeros_like(mask, dtype=torch.bool)
            return loss_BT, none_BT, none_BT

        @register_algorithm
        class Toy(PolicyModule):
            name = "toy"

        yield SimpleNamespace(cls=Toy, seen=seen)
    finally:
        ALGORITHMS.pop("toy", None)
        LOSSES.pop("toy", None)
        PARAMS.pop("toy_temp", None)


def test_a_toy_parameter_reaches_config_loss_and_search_space(toy, tmp_path, capsys):
    # config: --set and YAML take loss.toy_temp; auto is the loss's default
    over = parse_sets(["loss.toy_temp=1.25"])
    assert over == {"loss": {"toy_temp": 1.25}}
    cfg = load_config("smoke", overrides={**over, "algos": ["toy"]})
    assert cfg.loss.toy_temp == 1.25 and to_dict(cfg)["loss"]["toy_temp"] == 1.25
    assert load_config("smoke").loss.toy_temp == "auto"
    with pytest.raises(ConfigError, match="loss.toy_temp takes float or str, got list"):
        parse_sets(["loss.toy_temp=[1]"])

    # an out-of-range value: one line, naming the key, the value and the range
    with pytest.raises(ConfigError) as err:
        load_config("smoke", overrides={"loss": {"toy_temp": 3.0}})
    assert str(err.value) == "loss.toy_temp=3.0 must be a finite number in (0, 2] (or auto)"
    assert main(["run", "--preset", "smoke", "--algos", "toy", "--no-progress", "--tracking-uri",
                 f"sqlite:///{tmp_path / 'mlflow.db'}", "--set", "loss.toy_temp=3"]) == 2
    text = capsys.readouterr().out.strip()
    assert "loss.toy_temp=3 must be a finite number in (0, 2]" in text and len(text.splitlines()) == 1, text

    # resolved: the value given, or the default for auto (None for an algorithm whose loss does not take it,
    # and a value given never reaches such a loss)
    mine = cfg.resolve("toy", toy.cls.recipe, 8)
    assert mine.loss.toy_temp == 1.25
    assert load_config("smoke").resolve("toy", toy.cls.recipe, 8).loss.toy_temp == 0.5
    assert load_config("smoke").resolve("grpo", ALGORITHMS["grpo"].recipe, 8).loss.toy_temp is None
    grpo = cfg.resolve("grpo", ALGORITHMS["grpo"].recipe, 8)
    assert "toy_temp" not in loss_keywords(LOSSES["grpo"], grpo.loss.hparams(), 8)

    # the module's loss keywords hand it to the loss
    hp = loss_keywords(LOSSES["toy"], mine.loss.hparams(), 8)
    assert hp == {"toy_temp": 1.25, "kl_estimator": "k3"}  # the controls, off, are left out
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = policy_loss("toy", logp=logp, old_logp=torch.zeros(2, 3), advantages=torch.tensor([1.0, -1.0]),
                          mask=torch.ones(2, 3), **hp)
    assert toy.seen == [1.25]
    with pytest.raises(ValueError, match=r"toy_temp=3\.0 must be a finite number in \(0, 2\]"):
        policy_loss("toy", logp=logp, old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3),
                    toy_temp=3.0)
    with pytest.raises(ValueError, match="grpo does not take toy_temp"):
        policy_loss("grpo", logp=logp, old_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3),
                    toy_temp=1.0)

    # tune: the search space offers it, searched by default, inside its declared range
    assert list(LOSSES["toy"].search_ranges().items())[0] == ("toy_temp", (0.1, 1.5, True))  # then the controls
    assert chosen_params(LOSSES["toy"], None, False) == ("toy_temp",)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sampled = search_space("toy", study.ask())["loss"]["toy_temp"]
    assert 0.1 <= sampled <= 1.5

    # the README table's defaults column
    assert LOSSES["toy"].defaults_text() == "toy_temp 0.5"
