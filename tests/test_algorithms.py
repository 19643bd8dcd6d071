"""The shared RL step (``algorithms/base.py``): minibatching, the non-finite guards, the registry, the config
layer's resolution of ``auto``, and the mismatch probe under the default ``recompute``."""

from __future__ import annotations

import math

import mlflow
import pytest
import torch

from gspo_bench import algorithms
from gspo_bench.algorithms.base import minibatch_indices
from gspo_bench.config import AUTO, load_config, read_yaml
from gspo_bench.core.losses import LOSSES
from gspo_bench.train.runner import run
from tests.conftest import nan_loss_on_call, tiny_overrides


@pytest.mark.parametrize("B, n, sizes", [(6, 4, [2, 2, 1, 1]), (10, 4, [3, 3, 2, 2]), (128, 4, [32] * 4),
                                         (3, 4, [1, 1, 1]), (5, 1, [5])])
def test_minibatches_are_near_equal_and_as_many_as_asked(B, n, sizes):
    parts = minibatch_indices(B, n, torch.Generator().manual_seed(0))
    assert [len(p) for p in parts] == sizes
    # a permutation: every row exactly once
    assert sorted(torch.cat(parts).tolist()) == list(range(B))


def test_resolve_takes_clip_from_the_loss_and_the_rest_from_the_recipe():
    cfg = load_config("default")
    for name in algorithms.names():
        r = cfg.resolve(name, algorithms.get(name).recipe, task_max_new_tokens=8)
        assert (r.loss.eps_low, r.loss.eps_high) == (LOSSES[name].eps_low, LOSSES[name].eps_high)
        # every per-algorithm auto is gone (the engine's auto is per model, resolved when it samples)
        assert r.rollout.max_new_tokens == 8
        assert AUTO not in (r.rollout.dynamic_sampling, r.rollout.overlong_buffer)
        assert r.loss.kl_coef == (0.05 if name == "ppo" else 0.0)
        assert r.rollout.dynamic_sampling is (name == "dapo")
        assert r.rollout.overlong_buffer == (2 if name == "dapo" else None)
    # an explicit value beats auto
    cfg = load_config("default", overrides={"loss": {"eps_high": 0.5}, "rollout": {"dynamic_sampling": True}})
    r = cfg.resolve("grpo", algorithms.get("grpo").recipe, 8)
    assert r.loss.eps_high == 0.5 and r.rollout.dynamic_sampling is True


@pytest.mark.parametrize("algo", list(LOSSES))
def test_shipped_baselines_agree_with_the_algorithm_recipes(algo):
    """baselines/*.yaml state published values with their source. Their clip may differ from the loss default
    (GRPO as the GSPO paper ran it: 0.2 / 0.27); their rollout recipe and KL weight are the algorithm's."""
    data = read_yaml(f"baselines/{algo}.yaml")
    assert data["algo"] == algo and "http" in data["source"]
    cfg = load_config("default", (f"baselines/{algo}.yaml",))
    auto = load_config("default").resolve(algo, algorithms.get(algo).recipe, 8)
    explicit = cfg.resolve(algo, algorithms.get(algo).recipe, 8)
    assert explicit.rollout == auto.rollout and explicit.loss.kl_coef == auto.loss.kl_coef


def _grpo(task, uri, exp, **extra):
    o = tiny_overrides(task, uri, **extra)
    o["tracking"] = {"tracking_uri": uri, "experiment": exp}
    o["algos"] = ["grpo"]
    return load_config("smoke", overrides=o)


def test_nan_loss_in_one_minibatch_is_counted_and_fires_an_event(mixed_task, tracking_uri, monkeypatch):
    """Losses [nan, x, y, z] in one step: the step's loss is NaN, 1/4 of the updates were skipped, an event fires."""
    nan_loss_on_call(monkeypatch, 1)
    cfg = _grpo(mixed_task, tracking_uri, "nan-minibatch",
                train={"steps": 1, "minibatches": 4, "eval_every": 10, "eval_samples": 0})
    [res] = run(cfg, log=lambda *a: None, keep_modules=True)
    assert res.status == "FINISHED", res.error
    assert math.isnan(res.last["train/loss"])
    assert res.last["train/nonfinite"] == 0.25
    assert res.collapse_events == 1
    client = mlflow.MlflowClient(tracking_uri)
    [row] = client.search_runs([client.get_experiment_by_name("nan-minibatch").experiment_id])
    assert row.data.tags["collapse.nonfinite"] == "1"
    assert math.isnan(row.data.metrics["train/loss"]) and row.data.metrics["train/nonfinite"] == 0.25


def test_ppo_critic_does_not_step_on_a_nonfinite_gradient(mixed_task, tracking_uri, monkeypatch):
    """A finite loss whose critic gradient is NaN: the critic is left untouched, the policy still updates."""
    from gspo_bench.algorithms.ppo import PPO

    snap = {}
    real_prepare = PPO.prepare

    def prepare_and_poison_critic_grad(self, batch, stats):
        if not snap:
            snap["critic"] = [p.detach().clone() for p in self.critic.parameters()]
            snap["policy"] = [p.detach().clone() for p in self.policy.parameters()]
            # the backward pass turns the critic head's gradient into NaN; the loss itself stays finite
            self.critic.head.weight.register_hook(lambda g: g * float("nan"))
        return real_prepare(self, batch, stats)

    monkeypatch.setattr(PPO, "prepare", prepare_and_poison_critic_grad)
    o = tiny_overrides(mixed_task, tracking_uri, train={"steps": 1, "minibatches": 2, "eval_every": 10,
                                                         "eval_samples": 0})
    o.update(algos=["ppo"], tracking={"tracking_uri": tracking_uri, "experiment": "ppo-nan-critic"})
    [res] = run(load_config("smoke", overrides=o), log=lambda *a: None, keep_modules=True)
    assert res.status == "FINISHED", res.error
    m = res.module
    assert all(torch.equal(p.detach(), q) for p, q in zip(m.critic.parameters(), snap["critic"]))
    assert all(torch.isfinite(p).all() for p in m.critic.parameters())
    assert math.isfinite(res.last["train/loss"]) and math.isnan(res.last["critic/grad_norm"])
    assert res.last["train/nonfinite"] == 1.0 and res.collapse_events >= 1
    moved = [not torch.equal(p.detach(), q) for p, q in zip(m.policy.parameters(), snap["policy"])]
    assert sum(moved) > 0.5 * len(moved)


def test_mismatch_is_logged_under_recompute_when_the_engine_returns_logprobs(mixed_task, tracking_uri):
    cfg = _grpo(mixed_task, tracking_uri, "mismatch-recompute",
                train={"steps": 1, "eval_every": 10, "eval_samples": 0}, rollout={"engine": "fast"})
    assert cfg.rollout.old_logp_source == "recompute"
    [res] = run(cfg, log=lambda *a: None)
    assert res.status == "FINISHED", res.error
    # fp32 sampler and trainer run the same math: the mismatch is float noise, and k3 >= 0
    assert 0.0 <= res.last["mismatch/kl"] < 1e-6 and res.last["mismatch/abs_diff_max"] < 1e-3
    assert "mismatch/seq_log_ratio_std" in res.last


def test_every_rl_step_makes_exactly_minibatches_optimiser_steps(mixed_task, tracking_uri, monkeypatch):
    """B = 3 prompts x 2 samples = 6 rows in 4 minibatches: 4 losses and 4 updates (``chunk`` made 3)."""
    import gspo_bench.algorithms.base as base

    real, sizes = base.policy_loss, []

    def counting(*a, **k):
        sizes.append(k["mask"].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(base, "policy_loss", counting)
    cfg = _grpo(mixed_task, tracking_uri, "six-rows", rollout={"prompts_per_step": 3, "group_size": 2},
                train={"steps": 1, "minibatches": 4, "eval_every": 10, "eval_samples": 0})
    [res] = run(cfg, log=lambda *a: None, keep_modules=True)
    assert res.status == "FINISHED", res.error
    assert sorted(sizes, reverse=True) == [2, 2, 1, 1]
    # Lightning counts optimiser steps: one per minibatch
    assert res.module.trainer.global_step == 4


NEW_ALGORITHM = '''
"""A made-up algorithm in a file of its own: a loss and a class, registered nowhere else."""
from gspo_bench.algorithms.base import PolicyModule, register_algorithm
from gspo_bench.config import Recipe
from gspo_bench.core.loss_params import clip_band
from gspo_bench.core.losses import clipped_token_loss, register_loss


@register_loss("halfclip", ratio="token", loss="max(-A r, -A clip(r))", aggregation="token-mean",
               params=clip_band(0.1, 0.1), paper="none, https://arxiv.org/abs/0000.00000")
def halfclip_loss(logp, old_logp, advantages, mask, **clip):
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_algorithm
class HalfClip(PolicyModule):
    name = "halfclip"
    recipe = Recipe(dynamic_sampling=True)
'''


@pytest.mark.slow
def test_a_new_algorithm_file_shows_up_in_list_and_run_by_itself(tmp_path):
    """Copy the package, drop one file into algorithms/, and the CLI lists and runs it with no other edit."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    src = Path(algorithms.__file__).resolve().parent.parent
    shutil.copytree(src, tmp_path / "gspo_bench", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("tasks", "baselines"):  # beside the package in a checkout; inside it (_builtin/) when installed
        if (src.parent / folder).is_dir():
            shutil.copytree(src.parent / folder, tmp_path / folder)
    (tmp_path / "gspo_bench" / "algorithms" / "halfclip.py").write_text(NEW_ALGORITHM)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GSPO_BENCH_CACHE": str(tmp_path / "cache")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gspo_bench", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    assert "halfclip" in listed.stdout and "HalfClip" in listed.stdout and "dynamic_sampling=True" in listed.stdout
    ran = cli("run", "--algos", "halfclip", "--preset", "smoke", "--no-warmstart", "--steps", "1", "--no-progress",
              "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--set", "train.eval_prompts=8")
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "halfclip" in ran.stdout and "FINISHED" in ran.stdout
