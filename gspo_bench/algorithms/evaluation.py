"""``HeldOutEval``: the held-out evaluation every algorithm shares (a mixin of ``PolicyModule``).

Our own loop, not Lightning's validation loop: before the first step (the
warm-start score, at step 0), every ``eval_every`` steps and after the last,
so a run resumed from a checkpoint evaluates at the same steps as an
uninterrupted one. Greedy pass@1 over the eval prompts and, with
``eval_samples`` k > 0, the mean reward and sampled pass@1 over k samples per
prompt, aggregated with torchmetrics (on W > 1 processes each rank scores its
share of the prompts, and ``compute`` averages over all of them).
"""

from __future__ import annotations

import time

import torch
from torchmetrics.aggregation import MeanMetric


class HeldOutEval:
    """Needs ``policy``, ``trainer.datamodule`` (``evaluate``, ``eval_dataloader``), ``logger``, ``rl_step``,
    ``world``, ``clock``, ``eval_history``, ``eval_log`` and ``eval_listeners`` from the module."""

    def eval_reset(self) -> None:
        # torchmetrics means over every eval prompt (pass1) and every sampled completion (reward, pass1_sampled)
        self._eval = {"pass1": MeanMetric(), "reward": MeanMetric(), "pass1_sampled": MeanMetric()}
        self._eval_seen = set()

    def eval_batch(self, batch: dict) -> None:
        out = self.trainer.datamodule.evaluate(self.policy, batch)
        for k, v in out.items():
            self._eval[k].update(v.float().cpu())
            self._eval_seen.add(k)

    def record_eval(self) -> None:
        """Log ``eval/*`` at the current RL step and tell the listeners (on W > 1 processes each rank scored
        its shard of the prompts, and torchmetrics' ``compute`` averages over all of them)."""
        metrics = {"eval/pass1": float(self._eval["pass1"].compute())}
        if self.trainer.datamodule.eval_samples:
            metrics["eval/reward_mean"] = float(self._eval["reward"].compute())
            metrics["eval/pass1_sampled"] = float(self._eval["pass1_sampled"].compute())
        if self.logger is not None:
            self.logger.log_metrics(metrics, step=self.rl_step)
        self.eval_history.append((self.rl_step, metrics["eval/pass1"]))
        self.eval_log.append((self.rl_step, metrics))
        for listener in self.eval_listeners:
            listener(self.rl_step, metrics)

    @torch.no_grad()
    def evaluate_now(self) -> None:
        """Held-out evaluation of the policy as it is now: before the first step, every ``eval_every`` steps
        and after the last (our own loop, not Lightning's validation loop, so a resumed run evaluates at the
        same steps as an uninterrupted one)."""
        t0 = time.perf_counter()
        was_training = self.policy.training
        self.policy.eval()
        self.eval_reset()
        for batch in self.trainer.datamodule.eval_dataloader():
            self.eval_batch(batch)
        if "pass1" in self._eval_seen or (self.world > 1 and len(self.trainer.datamodule.eval_rows)):
            self.record_eval()
        self.policy.train(was_training)
        self.clock["eval_s"] += time.perf_counter() - t0
