"""A run's datamodule built with what it samples with (gspo_bench.train.assembly)."""

from __future__ import annotations

import importlib.util

import lightning as L
import pytest
import torch
from transformers import AutoTokenizer

from gspo_bench import algorithms
from gspo_bench.algorithms.base import step_lr
from gspo_bench.config import load_config
from gspo_bench.rollout.engines import resolve_engine
from gspo_bench.tasks import Task, TaskSpec, generate_arith
from gspo_bench.train import checkpoint
from gspo_bench.train.assembly import assemble, rollout_data
from tests.conftest import saved_builtin


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = saved_builtin("tiny-moe", tmp_path_factory.mktemp("moe"))
    tok = AutoTokenizer.from_pretrained(folder)
    train, evals = generate_arith(0, min_digits=1, max_digits=2, n_train=40, n_eval=12)
    task = Task(TaskSpec(name="arith-small", kind="arith"), train, evals)
    return folder, tok, task


def _module(algo, folder, task):
    cfg = load_config("smoke", overrides={"model": {"name": "tiny-moe"}})
    cls = algorithms.get(algo)
    return cls(cfg, str(folder), 0, cfg.resolve(algo, cls.recipe, task.spec.max_new_tokens))


def test_the_datamodule_gets_the_modules_policy_engine_evaluator_and_choices(built):
    folder, tok, task = built
    module = _module("grpo", folder, task)
    dm = rollout_data(module, task, tok, steps=3, seed=4, device="cpu", model_dir=str(folder), eval_prompts=5,
                      eval_samples=2, eval_batch=3)
    assert dm.policy is module.policy and dm.producer.handle.given and dm.engine.name == "fast"
    assert dm.producer.model is module.policy  # the producer samples the policy's own weights, in process
    assert dm.eval_engine.engine is dm.engine and dm.eval_engine is not dm.producer.handle  # a handle of its own
    assert dm.engine.setup.record_routes and dm.producer.record_routes  # MoE: the sampler's experts are kept
    assert dm.engine.setup.seed == 4 and dm.engine.setup.model_dir == str(folder)
    assert dm.producer.group_advantages and dm.resume is None
    assert (len(dm.evaluator.rows), dm.evaluator.samples, dm.evaluator.batch_size) == (5, 2, 3)
    assert list(dm.evaluator.rows["prompt"]) == list(task.eval["prompt"])[:5]
    batch = dm.rollout(0)  # it samples with what it was given, nothing set afterwards
    assert batch.routes is not None and batch.advantages is not None
    # PPO computes its own advantages (GAE): the datamodule is told so when it is built
    assert not rollout_data(_module("ppo", folder, task), task, tok, steps=1, seed=0,
                            device="cpu").producer.group_advantages


def test_auto_is_resolved_for_the_device_the_trainer_puts_the_policy_on(built):
    folder, tok, task = built
    module = _module("grpo", folder, task)
    assert next(module.policy.parameters()).device.type == "cpu"  # where it is while the run is built
    assert rollout_data(module, task, tok, steps=1, seed=0, device="cpu").engine.name == "fast"
    # on a GPU, auto takes vLLM where it is installed: decided before training, not at the first rollout
    want = "vllm" if importlib.util.find_spec("vllm") is not None else "fast"
    assert resolve_engine("auto", module.policy, held=True, device="cuda") == want
    assert rollout_data(module, task, tok, steps=1, seed=0, device="cuda").engine.name == want


def test_a_resumed_run_hands_the_datamodule_its_part_of_the_checkpoint(built):
    folder, tok, task = built
    module = _module("grpo", folder, task)
    state = {"weights": {"w": torch.zeros(3)}, "optimizers": [], "rl_step": 2, "sampler": {"queue": []},
             "verify_timeouts": 1, "rng": {"torch": torch.get_rng_state()}, "draws": {"cpu": torch.get_rng_state()}}
    dm = rollout_data(module, task, tok, steps=3, seed=0, device="cpu", resume_state=state)
    assert set(dm.resume) == set(checkpoint.ROLLOUT_KEYS)  # not the weights or the optimisers
    assert dm.resume["rl_step"] == 2 and dm.resume["verify_timeouts"] == 1


def test_one_assembly_builds_a_benchmark_s_run_without_patching_it(built):
    # what a benchmark measures is said through assemble's arguments: no held-out evaluation, every step's
    # metrics recorded; the trainer is the caller's, and the datamodule samples for its device
    folder, tok, task = built
    cfg = load_config("smoke", overrides={"model": {"name": "tiny-moe"}, "train": {"steps": 2}})
    made, steps_seen = [], []

    def trainer(module):
        made.append(module)
        return L.Trainer(max_epochs=1, logger=False, accelerator="cpu", devices=1, num_sanity_val_steps=0,
                         enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)

    run = assemble(cfg, "grpo", task, folder, 7, trainer, evaluate=False, on_metrics=steps_seen.append,
                   eval_samples=0)
    assert made == [run.module] and run.datamodule.policy is run.module.policy
    assert run.module.seed == 7 and run.datamodule.seed == 7 and run.datamodule.steps == 2
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert [m["train/lr"] for m in steps_seen] == pytest.approx([step_lr(cfg.train, s) for s in (0, 1)])  # as logged
    assert run.module.eval_history == [] and run.datamodule.evaluator.completions == 0  # never evaluated
    assert run.module.rl_step == 2 and run.module.last_metrics == steps_seen[-1]
    # the runner's own runs evaluate (the default): the same assembly, its default arguments
    default = assemble(cfg, "grpo", task, folder, 7, trainer)
    assert default.module.evaluate and default.module.on_metrics is None
    assert default.datamodule.evaluator.samples == cfg.train.eval_samples
