"""``rollout_data``: the rollout datamodule a policy module trains on, built with everything it samples with.

The run's objects are built here and handed over through constructors, never
written into each other afterwards: the engine (``rollout.engine`` resolved
for the model and for where it will sample, built once for the run), the
evaluator over the task's held-out rows, the policy the engine samples, the
MoE and advantage choices of the algorithm, and a resumed run's rollout
state. The runner and the benchmarks all build their datamodule here, so a
benchmark samples exactly as a run does.
"""

from __future__ import annotations

from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.rollout.engines import EngineSetup, build_engine, resolve_engine
from gspo_bench.rollout.evaluation import Evaluator
from gspo_bench.train.checkpoint import rollout_part


def rollout_data(module, task, tokenizer, *, steps: int, seed: int, device: str, model_dir: str | None = None,
                 eval_prompts: int = 256, eval_samples: int = 0, eval_batch: int = 256,
                 eval_k: tuple[int, ...] | list[int] = (), resume_state: dict | None = None) -> RolloutDataModule:
    """The datamodule for ``module`` (a ``PolicyModule``) on ``task``: ``steps`` RL steps seeded by ``seed``,
    its engine resolved for the policy sampling on ``device`` (``cpu``, ``cuda``: where the trainer puts
    it), built from ``model_dir`` where the engine needs a folder; the first ``eval_prompts`` eval rows with
    ``eval_samples`` samples each (``eval_batch`` prompts per engine call) and pass@k for each k of ``eval_k``;
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
                             model_dir=model_dir)
