"""``Evaluator``: the held-out evaluation of a policy, with the run's engine and the task's scorer.

Greedy pass@1 over the eval prompts and, with ``eval_samples`` k > 0, the
mean reward and sampled pass@1 over k samples per prompt, aggregated with
torchmetrics (on W > 1 processes each rank scores its share of the prompts,
and ``compute`` averages over all of them). The completions come from the
datamodule's engine and are scored by its verifier call (``Sampling``), so an
evaluation samples and scores exactly as a rollout does; when to evaluate,
and what becomes of the numbers, is the policy module's
(``algorithms.evaluation.HeldOutEval``).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch.utils.data import DataLoader
from torchmetrics.aggregation import MeanMetric

from gspo_bench.config import RolloutConfig
from gspo_bench.rollout.engine import Generation


class Sampling(Protocol):
    """What an evaluation samples and scores with (the rollout datamodule)."""

    def generate(self, model, prompts: list[str], **kwargs) -> Generation: ...

    def score(self, texts: list[str], answers: list[str]) -> torch.Tensor: ...


class Evaluator:
    """The eval rows of a task (``rows``: a data set slice with ``prompt`` and ``answer``), ``samples`` sampled
    completions per prompt beside the greedy one, ``batch_size`` prompts per engine call."""

    def __init__(self, rows, settings: RolloutConfig, *, samples: int = 0, batch_size: int = 256):
        self.rows, self.s = rows, settings
        self.samples, self.batch_size = samples, batch_size
        self.completions = 0  # completions generated (``bench --whole``)

    def batches(self, rank: int = 0, world: int = 1) -> DataLoader:
        """This process's share of the eval rows, in batches of ``batch_size``."""
        rows = [{"prompt": p, "answer": a} for p, a in zip(list(self.rows["prompt"]), list(self.rows["answer"]))]
        rows = rows[rank::world]  # each rank scores its share; the eval metrics average over all
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False,
                          collate_fn=lambda b: {"prompt": [r["prompt"] for r in b], "answer": [r["answer"] for r in b]})

    @torch.no_grad()
    def evaluate(self, data: Sampling, policy, rows: dict) -> dict[str, torch.Tensor]:
        """Greedy pass@1 hits, and over ``samples`` samples per prompt the mean reward and the sampled pass@1
        (fully correct), for a batch of eval rows."""
        prompts, answers = rows["prompt"], rows["answer"]
        greedy = data.generate(policy, prompts, max_new_tokens=self.s.max_new_tokens, greedy=True)
        out = {"pass1": data.score(greedy.texts, answers)}
        k = self.samples
        self.completions += len(prompts) * (1 + k)
        if k:
            sampled = data.generate(policy, [p for p in prompts for _ in range(k)],
                                    max_new_tokens=self.s.max_new_tokens, temperature=self.s.temperature,
                                    return_logp=False)
            reward = data.score(sampled.texts, [a for a in answers for _ in range(k)])
            out["reward"] = reward
            # pass@1 estimated from k samples: the fraction of sampled completions that fully verify
            out["pass1_sampled"] = (reward >= 1.0).float()
        return out

    def run(self, data: Sampling, policy, rank: int = 0, world: int = 1) -> dict[str, float] | None:
        """``eval/*`` of ``policy`` over this process's share of the rows (torchmetrics' ``compute`` averages
        over every process's); None when there was nothing to evaluate."""
        # torchmetrics means over every eval prompt (pass1) and every sampled completion (reward, pass1_sampled)
        means = {"pass1": MeanMetric(), "reward": MeanMetric(), "pass1_sampled": MeanMetric()}
        seen = set()
        for batch in self.batches(rank, world):
            for k, v in self.evaluate(data, policy, batch).items():
                means[k].update(v.float().cpu())
                seen.add(k)
        if not ("pass1" in seen or (world > 1 and len(self.rows))):
            return None
        metrics = {"eval/pass1": float(means["pass1"].compute())}
        if self.samples:
            metrics["eval/reward_mean"] = float(means["reward"].compute())
            metrics["eval/pass1_sampled"] = float(means["pass1_sampled"].compute())
        return metrics
