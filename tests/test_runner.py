"""The runner's seeds: ``train.rl_seed`` moves RL's own draws and nothing else."""

from __future__ import annotations

import mlflow
import pytest

from gspo_bench.algorithms.base import optimizers_of
from gspo_bench.config import ConfigError, load_config
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow.MlflowClient(uri).get_metric_history(run_id, key))


def _one(mixed_task, uri, experiment, rl_seed):
    train = {} if rl_seed == "unset" else {"rl_seed": rl_seed}
    o = tiny_overrides(mixed_task, uri, train=train, tracking={"tracking_uri": uri, "experiment": experiment})
    [r] = run(load_config("smoke", overrides={**o, "algos": ["grpo"], "seeds": [0]}), log=lambda *a, **k: None)
    assert r.status == "FINISHED"
    return r.run_id


def test_rl_seed_moves_the_rl_draws_and_keeps_the_start(mixed_task, tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    default, same, other = (_one(mixed_task, uri, name, s)
                            for name, s in (("default", "unset"), ("same", 0), ("other", 1)))
    # rl_seed equal to the run's seed is the default run, draw for draw
    for key in ("reward/mean", "loss/policy", "eval/pass1"):
        assert _history(uri, same, key) == _history(uri, default, key), key
    # another rl_seed: the same starting weights and eval prompts (step 0's greedy score), other samples
    assert _history(uri, other, "eval/pass1")[0] == _history(uri, default, "eval/pass1")[0]
    assert _history(uri, other, "reward/mean") != _history(uri, default, "reward/mean")
    params = mlflow.MlflowClient(uri).get_run(other).data.params
    assert params["train.rl_seed"] == "1" and params["seeds"] == "[0]"


@pytest.mark.parametrize("bad", [-1, 1.5, "x", True])
def test_a_bad_rl_seed_is_one_line(bad):
    with pytest.raises(ConfigError, match="train.rl_seed"):
        load_config("smoke", overrides={"train": {"rl_seed": bad}})


def test_step_lr_by_hand():
    from gspo_bench.algorithms.base import step_lr
    from gspo_bench.config.sections import TrainConfig

    const = TrainConfig(steps=4, lr=4e-4)
    assert [step_lr(const, t) for t in range(4)] == [4e-4] * 4
    lin = TrainConfig(steps=4, lr=4e-4, lr_schedule="linear")
    # lr (1 - t / 4): 4e-4, 3e-4, 2e-4, 1e-4; never 0, and held at the last value past the last step
    assert [step_lr(lin, t) for t in range(5)] == pytest.approx([4e-4, 3e-4, 2e-4, 1e-4, 1e-4])
    with pytest.raises(ConfigError, match="train.lr_schedule"):
        TrainConfig(lr_schedule="cosine")


def test_a_linear_schedule_is_what_the_optimiser_used(mixed_task, tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    o = tiny_overrides(mixed_task, uri, train={"steps": 3, "lr_schedule": "linear", "lr": 3e-3},
                       tracking={"tracking_uri": uri, "experiment": "lin"})
    [r] = run(load_config("smoke", overrides={**o, "algos": ["ppo"], "seeds": [0]}), log=lambda *a, **k: None,
              keep_modules=True)
    assert r.status == "FINISHED"
    # the policy's optimiser took the last step at 3e-3 / 3; the critic's keeps its own rate
    policy_opt, critic_opt = optimizers_of(r.module)
    assert [g["lr"] for g in policy_opt.param_groups] == pytest.approx([1e-3])
    assert [g["lr"] for g in critic_opt.param_groups] == pytest.approx([r.module.cfg.train.critic_lr])
    # steps 1..3 (a step's metrics are logged after it): 3e-3 x (1, 2/3, 1/3)
    assert [v for _, v in _history(uri, r.run_id, "train/lr")] == pytest.approx([3e-3, 2e-3, 1e-3])
