"""``Evaluator``: the held-out evaluation of a policy, with the run's engine and the task's scorer.

Greedy pass@1 over the eval prompts and, with ``eval_samples`` n > 0, the
mean reward, the sampled pass@1, the unbiased pass@k over n samples per
prompt (``pass_at_k``) and mean@k (the mean reward of a prompt's first k samples), aggregated with
torchmetrics (on W > 1 processes each rank scores its share of the prompts,
and ``compute`` averages over all of them). The completions come from the
datamodule's evaluation engine handle and are scored by its verifier call
(``Sampling``), so an evaluation samples and scores exactly as a rollout does; when to evaluate,
and what becomes of the numbers, is the policy module's
(``algorithms.evaluation.HeldOutEval``).
"""

from __future__ import annotations

import math
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

    def play(self, model, prompts: list[str], answers: list[str], **kwargs) -> torch.Tensor | None:
        """A multi-turn environment's returns, one episode per prompt (None: the task is single-turn)."""
        ...

    def loader_generator(self) -> torch.Generator | None:
        """The generator a data loader's iterator draws its base seed from (None: torch's global one)."""
        ...


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code"): the chance that k of the n, drawn without replacement,
    hold at least one correct one. Unlike "any of the first k" it uses every sample, and unlike best-of-n it is
    not biased upwards."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    # pass@k = 1 - C(n - c, k) / C(n, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# The eval rows split in two by the parity of their index (random prompts, so two independent halves): their
# greedy pass@1 differ only by the evaluation's sampling of prompts, var(half_a - half_b) = 4 var(eval/pass1)
HALVES = ("even", "odd")


class Evaluator:
    """The eval rows of a task (``rows``: a data set slice with ``prompt`` and ``answer``), ``samples`` sampled
    completions per prompt beside the greedy one, ``batch_size`` prompts per engine call, and the k of the
    pass@k it reports (``ks``; those above ``samples`` are left out)."""

    def __init__(self, rows, settings: RolloutConfig, *, samples: int = 0, batch_size: int = 256,
                 ks: tuple[int, ...] = ()):
        self.rows, self.s = rows, settings
        self.samples, self.batch_size = samples, batch_size
        self.ks = tuple(sorted({k for k in ks if 1 <= k <= samples}))  # a k above n has no estimate from n
        self.completions = 0  # completions generated (``bench --whole``)

    @classmethod
    def for_task(cls, task, settings: RolloutConfig, *, prompts: int = 256, samples: int = 0, batch_size: int = 256,
                 ks: tuple[int, ...] = ()) -> "Evaluator":
        """The evaluator over the first ``prompts`` rows of ``task``'s eval split (all of them when fewer)."""
        return cls(task.eval.select(range(min(prompts, len(task.eval)))), settings, samples=samples,
                   batch_size=batch_size, ks=ks)

    def batches(self, rank: int = 0, world: int = 1, generator: torch.Generator | None = None) -> DataLoader:
        """This process's share of the eval rows, in batches of ``batch_size`` (``generator``: what the
        loader's iterator draws its base seed from; None: torch's global generator)."""
        rows = [{"prompt": p, "answer": a, "index": i}
                for i, (p, a) in enumerate(zip(list(self.rows["prompt"]), list(self.rows["answer"])))]
        rows = rows[rank::world]  # each rank scores its share; the eval metrics average over all
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False, generator=generator,
                          collate_fn=lambda b: {key: [r[key] for r in b] for key in ("prompt", "answer", "index")})

    @torch.no_grad()
    def evaluate(self, data: Sampling, policy, rows: dict, step: int = 0) -> dict[str, torch.Tensor]:
        """Greedy pass@1 hits, and over ``samples`` samples per prompt the mean reward and the sampled pass@1
        (fully correct), for a batch of eval rows, of the policy after ``step`` RL steps."""
        prompts, answers = rows["prompt"], rows["answer"]
        out = {"pass1": self.rewards(data, policy, prompts, answers, greedy=True, version=step, step=step)}
        k = self.samples
        self.completions += len(prompts) * (1 + k)
        if k:
            # completion j of eval row i is the step's completion i * k + j (a per-request seed's key)
            reward = self.rewards(data, policy, [p for p in prompts for _ in range(k)],
                                  [a for a in answers for _ in range(k)], temperature=self.s.temperature,
                                  return_logp=False, version=step, step=step,
                                  rows=[i * k + j for i in rows.get("index", range(len(prompts))) for j in range(k)])
            out["reward"] = reward
            # pass@1 estimated from k samples: the fraction of sampled completions that fully verify
            out["pass1_sampled"] = (reward >= 1.0).float()
            # c_p: a prompt's fully verified samples among its k (the samples of a prompt are side by side)
            correct = (reward >= 1.0).reshape(len(prompts), k).sum(-1).tolist()
            per_prompt = reward.reshape(len(prompts), k)
            for j in self.ks:
                out[f"pass_at_{j}"] = torch.tensor([pass_at_k(k, int(c), j) for c in correct])
                # mean@j: a prompt's mean reward over its first j samples (what a j-sample evaluation reports)
                out[f"mean_at_{j}"] = per_prompt[:, :j].float().mean(-1)
        return out

    def rewards(self, data: Sampling, policy, prompts: list[str], answers: list[str], **kwargs) -> torch.Tensor:
        """Each prompt's reward: its episode's return in a multi-turn environment (``data.play``), else its
        completion's verifier score; ``kwargs``: the engine call's (greedy, temperature, version, rows)."""
        played = data.play(policy, prompts, answers, max_new_tokens=self.s.max_new_tokens, **kwargs)
        if played is not None:
            return played
        gen = data.generate(policy, prompts, max_new_tokens=self.s.max_new_tokens, **kwargs)
        return data.score(gen.texts, answers)

    def run(self, data: Sampling, policy, rank: int = 0, world: int = 1, step: int = 0) -> dict[str, float] | None:
        """``eval/*`` of ``policy`` (after ``step`` RL steps) over this process's share of the rows (torchmetrics'
        ``compute`` averages over every process's); None when there was nothing to evaluate."""
        # torchmetrics means over every eval prompt (pass1) and every sampled completion (reward, pass1_sampled)
        means = {"pass1": MeanMetric(), "reward": MeanMetric(), "pass1_sampled": MeanMetric(),
                 **{f"{kind}_at_{j}": MeanMetric() for j in self.ks for kind in ("pass", "mean")},
                 **{f"pass1_{half}": MeanMetric() for half in HALVES}}
        seen = set()
        for batch in self.batches(rank, world, data.loader_generator()):
            for k, v in self.evaluate(data, policy, batch, step).items():
                means[k].update(v.float().cpu())
                seen.add(k)
                if k == "pass1":  # the two halves of the eval rows, by the parity of their index
                    odd = torch.tensor(batch["index"]) % 2 == 1
                    for half, pick in zip(HALVES, (~odd, odd)):
                        means[f"pass1_{half}"].update(v.float().cpu()[pick])
        if not ("pass1" in seen or (world > 1 and len(self.rows))):
            return None
        metrics = {"eval/pass1": float(means["pass1"].compute())}
        if len(self.rows["prompt"]) > 1:  # split-half greedy pass@1 (reporting/variance.py: the evaluation's own noise)
            metrics.update({f"eval/pass1_{half}": float(means[f"pass1_{half}"].compute()) for half in HALVES})
        if self.samples:
            metrics["eval/reward_mean"] = float(means["reward"].compute())
            metrics["eval/pass1_sampled"] = float(means["pass1_sampled"].compute())
            for j in self.ks:  # the means over prompts of each prompt's unbiased pass@k and mean@k
                metrics[f"eval/pass_at_{j}"] = float(means[f"pass_at_{j}"].compute())
                metrics[f"eval/mean_at_{j}"] = float(means[f"mean_at_{j}"].compute())
        return metrics
