"""One RL step per algorithm on a fixed global rollout, on however many processes torchrun started.

Used by ``test_distributed.py``: ``torchrun --nproc-per-node N tests/ddp_step.py OUT ALGO...`` writes
rank 0's policy parameters after the step (and before it) to ``OUT/<algo>.pt``. Every rank builds the same
global rollout (the whole batch, sampled with a fixed seed from the same policy) and trains on its share of
it, so 1 and N processes see the same global batch, as the equivalence test needs. 8 minibatches of 2 of the
16 rows: a rank often has no row of a minibatch, and must still take part in its update.
``MICRO_BATCH_TOKENS`` sets ``train.micro_batch_tokens`` (default 0: off, null); ``MINIBATCHES``
``train.minibatches`` (default 8).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import lightning as L
import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

from gspo_bench import algorithms  # noqa: E402
from gspo_bench.core import collectives as ddp  # noqa: E402
from gspo_bench.config import load_config  # noqa: E402
from gspo_bench.rollout.datamodule import RolloutDataModule  # noqa: E402
from gspo_bench.train.distributed import strategy  # noqa: E402
from gspo_bench.tracking.runs import quiet  # noqa: E402
from gspo_bench.tasks import load_task, register_verifier  # noqa: E402
from gspo_bench.train.warmstart import warm_start  # noqa: E402


@register_verifier("ddp_even_length")
def _even_length(completion: str, answer: str) -> float:
    """A reward random weights earn about half the time, so every group has an advantage to follow (and the
    answer's length in it, so greedy eval scores differ between prompts)."""
    return float((len(completion) + len(answer)) % 2 == 0)


MIXED = ("name: mixed\nkind: arith\nverifier: ddp_even_length\nmax_new_tokens: 6\n"
         "params: {min_digits: 1, max_digits: 3, n_train: 200, n_eval: 8}\n")


class FixedGlobalRollout(RolloutDataModule):
    """The whole step's rollout, sampled the same way on every rank, then this rank's share of it."""

    def rollout(self, step: int):
        rank, world = self.producer.rank, self.producer.world
        self.producer.rank, self.producer.world = 0, 1  # the producer samples the whole global batch
        with torch.random.fork_rng():
            torch.manual_seed(1234 + step)
            self.draws.load_state_dict({"cpu": torch.get_rng_state()})  # the rollout's draws: the fixed seed's
            full = super().rollout(step)
        self.producer.rank, self.producer.world = rank, world
        return full.rows(ddp.shard(len(full), rank, world))


def main(out: str, *algos: str) -> None:
    quiet()
    task_ref = Path(out) / "mixed.yaml"
    if int(os.environ.get("RANK", "0")) == 0:
        task_ref.write_text(MIXED)
    while not task_ref.is_file():  # the other ranks wait for rank 0's file
        pass
    world = int(os.environ.get("WORLD_SIZE", "1"))
    seed = 0
    cfg = load_config("smoke", overrides={
        "task": str(task_ref), "warmstart": {"enabled": False}, "model": {"name": os.environ.get("MODEL", "tiny-dense")},
        "rollout": {"prompts_per_step": 4, "group_size": 4},
        "train": {"steps": 1, "minibatches": int(os.environ.get("MINIBATCHES", "8")), "eval_prompts": 8, "eval_samples": 0, "progress": False,
                  "lr": 1e-3, "devices": world, "accelerator": "cpu",
                  "micro_batch_tokens": int(os.environ.get("MICRO_BATCH_TOKENS", "0")) or None}})
    task = load_task(cfg.task, seed, cfg.model, cfg.rollout.response_cap(), lambda *a: None, cfg.task_options)
    ws = warm_start(task, cfg.model, cfg.warmstart, seed, task.spec.max_new_tokens, progress=False,
                    log=lambda *a: None)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ws.path)
    for algo in algos:
        cls = algorithms.get(algo)
        settings = cfg.resolve(algo, cls.recipe, task.spec.max_new_tokens)
        L.seed_everything(seed, verbose=False)
        module = cls(cfg, str(ws.path), seed, settings)
        before = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
        dm = FixedGlobalRollout(task, tok, settings.rollout, steps=1, seed=seed, policy=module.policy,
                                record_routes=module.is_moe, group_advantages=module.group_advantages,
                                eval_prompts=8, eval_samples=0)
        trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=world, strategy=strategy(cfg.train, module.is_moe),
                            logger=False, enable_progress_bar=False, enable_checkpointing=False,
                            enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False)
        trainer.fit(module, datamodule=dm)
        if trainer.global_rank == 0:
            after = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
            torch.save({"before": before, "after": after, "metrics": module.last_metrics,
                        "eval": module.eval_log, "world": trainer.world_size}, Path(out) / f"{algo}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
