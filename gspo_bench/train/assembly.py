"""One assembly: ``assemble`` builds a run's module, trainer and datamodule; ``rollout_data`` the datamodule.

The run's objects are built here and handed over through constructors, never
written into each other afterwards: the module (seeded, with what it continues
from and whether it evaluates), the trainer (the caller's: it puts the policy
on its device), then the datamodule with the engine (``rollout.engine``
resolved for the model and for where it will sample, built once for the run),
the evaluator over the task's held-out rows, the policy the engine samples,
the MoE and advantage choices of the algorithm, and a resumed run's rollout
state. The runner and every benchmark build their runs here and say what they
measure through its arguments (no held-out evaluation, a record of each
step's metrics, their own callbacks on their own trainer), so a benchmark
trains and samples exactly as a run does, and nothing is patched afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import lightning as L
from transformers import AutoTokenizer

from gspo_bench import algorithms
from gspo_bench.core.losses import LOSSES
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.rollout.engines import EngineSetup, build_engine, resolve_engine
from gspo_bench.rollout.episodes import episodes_for
from gspo_bench.rollout.evaluation import Evaluator
from gspo_bench.train.checkpoint import rollout_part


def rollout_data(module, task, tokenizer, *, steps: int, seed: int, device: str, model_dir: str | None = None,
                 eval_prompts: int = 256, eval_samples: int = 0, eval_batch: int = 256,
                 eval_k: tuple[int, ...] | list[int] = (), resume_state: dict | None = None) -> RolloutDataModule:
    """The datamodule for ``module`` (a ``PolicyModule``) on ``task``: ``steps`` RL steps seeded by ``seed``,
    its engine resolved for the policy sampling on ``device`` (``cpu``, ``cuda``: where the trainer puts
    it), built from ``model_dir`` where the engine needs a folder; the first ``eval_prompts`` eval rows with
    ``eval_samples`` samples each (``eval_batch`` prompts per engine call) and pass@k for each k of ``eval_k``;
    the task's episodes played as ``env`` says where its environment is multi-turn;
    ``resume_state``: the checkpoint
    the run continues from (the datamodule gets its part)."""
    s = module.settings.rollout
    name = resolve_engine(s.engine, module.policy, held=True, device=device)
    engine = build_engine(name, EngineSetup(
        s, seed=seed, model_dir=model_dir, record_routes=module.is_moe,
        prompts=lambda: [*task.train["prompt"], *task.eval["prompt"]],
        max_prompt_tokens=task.spec.max_prompt_tokens))
    evaluator = Evaluator.for_task(task, s, prompts=eval_prompts, samples=eval_samples, batch_size=eval_batch,
                                   ks=tuple(eval_k))
    return RolloutDataModule(task, tokenizer, s, steps=steps, seed=seed, policy=module.policy, engine=engine,
                             evaluator=evaluator, record_routes=module.is_moe,
                             group_advantages=module.group_advantages, resume=rollout_part(resume_state),
                             # a loss weighted against the sampler itself (rollout_is) needs its log-probs
                             sampler_logp="rollout_logp" in LOSSES[module.name].inputs,
                             model_dir=model_dir, episodes=episodes_for(task, module.cfg.env, tokenizer))


@dataclass
class Assembled:
    """A run's objects, ready for ``trainer.fit(module, datamodule=datamodule)``."""

    module: "algorithms.PolicyModule"
    trainer: L.Trainer
    datamodule: RolloutDataModule


def assemble(cfg, algo: str, task, ws_path: str, seed: int, trainer: Callable[[object], L.Trainer], *,
             steps: int | None = None, settings=None, resume_state: dict | None = None, start_evals=None,
             checkpointer=None, evaluate: bool = True, on_metrics=None, eval_prompts: int | None = None,
             eval_samples: int | None = None) -> Assembled:
    """Algorithm ``algo`` of ``cfg`` on ``task`` from the warm start at ``ws_path``, its RL draws seeded by
    ``seed`` (the global generators too, before the module is built): the module, then ``trainer(module)`` (the
    caller's trainer: logger, callbacks, devices), then the datamodule for the device it puts the policy on.

    ``steps`` (default ``train.steps``), ``eval_prompts`` and ``eval_samples`` (default ``train.*``): the
    datamodule's; ``settings``: ``cfg.resolve`` for ``algo`` when the caller has it already; ``resume_state``,
    ``start_evals``, ``checkpointer``, ``evaluate`` and ``on_metrics``: the module's (``PolicyModule``)."""
    cls = algorithms.get(algo)
    settings = settings or cfg.resolve(algo, cls.recipe, task.spec.max_new_tokens)
    L.seed_everything(seed, verbose=False)
    module = cls(cfg, str(ws_path), seed, settings, resume_state=resume_state, start_evals=start_evals,
                 checkpointer=checkpointer, evaluate=evaluate, on_metrics=on_metrics)
    built = trainer(module)
    t = cfg.train
    dm = rollout_data(module, task, AutoTokenizer.from_pretrained(ws_path), steps=t.steps if steps is None else steps,
                      seed=seed, device=built.strategy.root_device.type, model_dir=str(ws_path),
                      eval_prompts=t.eval_prompts if eval_prompts is None else eval_prompts,
                      eval_samples=t.eval_samples if eval_samples is None else eval_samples,
                      eval_k=t.eval_k if eval_samples is None else (),  # pass@k: of the config's own samples
                      resume_state=resume_state)
    return Assembled(module, built, dm)
