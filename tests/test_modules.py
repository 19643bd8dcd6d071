"""Each algorithm trains for real: parameters move, metrics land in MLflow and read back."""

from __future__ import annotations

import math

import mlflow
import pytest
import torch
from transformers import AutoModelForCausalLM

from gspo_bench.config import load_config
from gspo_bench.core.losses import LOSSES
from gspo_bench import algorithms
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides

# the metric set docs/algorithms.md names, logged by every algorithm
COMMON = [
    "reward/mean", "reward/std", "clip/frac", "clip/frac_high", "clip/frac_low", "clip/seq_frac",
    "ratio/mean", "ratio/min", "ratio/max", "ratio/token_log_std", "ratio/seq_log_std", "kl/old",
    "policy/entropy", "response/length_mean", "train/grad_norm", "time/step_s", "throughput/gen_tokens_per_s",
    "eval/pass1", "eval/reward_mean", "eval/pass1_sampled",
]
PPO_ONLY = ["critic/value_loss", "critic/explained_var"]


def test_the_shared_module_keeps_to_fifteen_methods():
    # the RL step reads in one class: what is not the module's own state (the entropy control, the minibatches'
    # split, the loss's mask, the search space, the checkpoint's records) lives in functions and objects beside it
    own = [name for name, v in vars(algorithms.PolicyModule).items()
           if callable(v) or isinstance(v, (property, classmethod, staticmethod))]
    assert len(own) <= 15, own
    assert "training_step" in own and "minibatch_loss" in own


def test_every_registered_loss_has_an_algorithm_class():
    # importing the package registers all six, no side-effect import needed
    assert algorithms.names() == list(LOSSES)
    assert {n: algorithms.get(n).__name__ for n in LOSSES} == {
        "ppo": "PPO", "grpo": "GRPO", "dapo": "DAPO", "gspo": "GSPO", "gspo_token": "GSPOToken", "cispo": "CISPO",
        "sapo": "SAPO", "gmpo": "GMPO", "dr_grpo": "DrGRPO", "luspo": "LUSPO", "vespo": "VESPO", "dppo_tv": "DPPOTV",
        "dppo_kl": "DPPOKL", "clip_cov": "ClipCov", "kl_cov": "KLCov", "rollout_is": "RolloutIS", "dro": "DRO"}
    assert all(algorithms.get(n).name == n for n in LOSSES)
    with pytest.raises(ValueError, match="unknown algorithm 'trpo'"):
        algorithms.get("trpo")


@pytest.mark.parametrize("algo", list(LOSSES))
def test_two_steps_change_parameters_and_log_metrics(algo, mixed_task, tracking_uri):
    exp = f"modules-{algo}"
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": [algo],
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": exp}})
    [res] = run(cfg, log=lambda *a: None, keep_modules=True)
    assert res.status == "FINISHED", res.error

    # parameters moved away from the checkpoint every algorithm starts from
    start = AutoModelForCausalLM.from_pretrained(res.module.trainer.datamodule.tokenizer.name_or_path)
    moved = [n for (n, p), (_, q) in zip(res.module.policy.named_parameters(), start.named_parameters())
             if not torch.equal(p.detach().cpu(), q.detach())]
    assert len(moved) > 0.5 * len(list(start.parameters())), f"only {len(moved)} tensors changed"

    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[exp])
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["status"] == "FINISHED"
    assert row["tags.algo"] == algo and row["tags.task"] == "mixed" and row["tags.seed"] == "0"
    assert row["tags.preset"] == "smoke" and row["tags.model"] == "tiny-dense"
    for key in COMMON + (PPO_ONLY if algo == "ppo" else []):
        assert f"metrics.{key}" in runs.columns and not math.isnan(row[f"metrics.{key}"]), key
    client = mlflow.MlflowClient(tracking_uri)
    # RL steps 1..2 are the MLflow steps (not Lightning's optimiser-step counter)
    steps = [m.step for m in client.get_metric_history(row.run_id, "reward/mean")]
    assert steps == [1, 2]
    # eval before the first step (step 0) and after each of the two steps
    assert [m.step for m in client.get_metric_history(row.run_id, "eval/pass1")] == [0, 1, 2]
    # the resolved clip range is a param, with the registry's default
    eps_high = row["params.resolved.loss.eps_high"]
    assert (None if eps_high in ("null", "None") else float(eps_high)) == LOSSES[algo].eps_high
    assert "config.yaml" in [a.path for a in client.list_artifacts(row.run_id)]
    assert row["tags.git.commit"] and "CPU" in row["tags.machine"] or "GPU" in row["tags.machine"]
    # token and sequence log-ratios of each eval step's batch, for the report's histogram
    assert [a.path for a in client.list_artifacts(row.run_id, "ratios")] == ["ratios/step_0001.json",
                                                                              "ratios/step_0002.json"]
    import json

    dump = json.load(open(client.download_artifacts(row.run_id, "ratios/step_0002.json")))
    # the band drawn is on the ratio: the registry's offsets, exp of a log-ratio band, none for a loss without one
    assert dump["algo"] == algo
    assert dump["eps_high"] == LOSSES[algo].ratio_band(LOSSES[algo].eps_low, LOSSES[algo].eps_high)[1]
    if algo in ("ppo", "grpo", "dapo", "gspo", "gspo_token", "cispo"):
        assert dump["eps_high"] == LOSSES[algo].eps_high
    assert len(dump["seq_log_ratio"]) == 16 and len(dump["token_log_ratio"]) >= 16


def test_off_policy_minibatches_move_the_ratio(mixed_task, tracking_uri):
    """With 4 minibatches the later ones are off-policy: the token ratio leaves 1."""
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": ["grpo"],
                                          "train": {"steps": 1, "minibatches": 4, "eval_every": 5,
                                                    "eval_prompts": 4, "eval_samples": 0, "progress": False,
                                                    "lr": 1e-3},
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": "offpolicy"}})
    [res] = run(cfg, log=lambda *a: None, keep_modules=True)
    m = res.last
    assert m["ratio/max"] > 1.0 + 1e-4 and m["ratio/min"] < 1.0 - 1e-4


def test_one_minibatch_is_on_policy(mixed_task, tracking_uri):
    """With one minibatch the ratio is exactly 1 on the update (docs/algorithms.md, 'Off-policy on purpose')."""
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": ["gspo"],
                                          "train": {"steps": 1, "minibatches": 1, "eval_every": 5,
                                                    "eval_prompts": 4, "eval_samples": 0, "progress": False},
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": "onpolicy"}})
    [res] = run(cfg, log=lambda *a: None)
    assert res.last["ratio/max"] == pytest.approx(1.0, abs=1e-5)
    assert res.last["clip/frac"] == 0.0


def test_moe_model_logs_expert_flip_rate(mixed_task, tracking_uri):
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": ["gspo"],
                                          "model": {"name": "tiny-moe"},
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": "moe"}})
    [res] = run(cfg, log=lambda *a: None)
    assert res.status == "FINISHED", res.error
    client = mlflow.MlflowClient(tracking_uri)
    [row] = client.search_runs([client.get_experiment_by_name("moe").experiment_id])
    assert row.data.tags["moe"] == "true"
    hist = client.get_metric_history(row.info.run_id, "moe/expert_flip_rate")
    assert [m.step for m in hist] == [1, 2]
    # the policy moved, so some routing changed, but far from all of it: re-drawing the top-2 of 8
    # experts at random would flip ~96 % (random routers are near-uniform, so lr 1e-3 flips up to ~half)
    assert all(0.0 <= m.value < 0.9 for m in hist) and any(m.value > 0 for m in hist)


def test_local_checkpoint_path_runs_through_from_pretrained(mixed_task, tracking_uri, tmp_path):
    """--model DIR: any saved causal LM goes through the standard loading code."""
    from gspo_bench.models import build_builtin

    model, tok = build_builtin("tiny-dense", 7)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": ["cispo"],
                                          "model": {"name": str(tmp_path / "ckpt")},
                                          "train": {"steps": 1, "minibatches": 2, "eval_every": 5,
                                                    "eval_prompts": 4, "eval_samples": 0, "progress": False},
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": "localpath"}})
    [res] = run(cfg, log=lambda *a: None, keep_modules=True)
    assert res.status == "FINISHED", res.error
    # the run started from exactly those weights (warm start off), not from a fresh built-in
    start = AutoModelForCausalLM.from_pretrained(res.module.trainer.datamodule.tokenizer.name_or_path)
    for p, q in zip(start.parameters(), model.parameters()):
        assert torch.equal(p, q)
