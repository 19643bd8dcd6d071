"""``HeldOutEval``: when the held-out evaluation runs, and what becomes of its numbers (a mixin of
``PolicyModule``).

Our own loop, not Lightning's validation loop: before the first step (the
warm-start score, at step 0), every ``eval_every`` steps and after the last,
so a run resumed from a checkpoint evaluates at the same steps as an
uninterrupted one. The evaluation itself (greedy pass@1, and with
``eval_samples`` k > 0 the mean reward and sampled pass@1 over k samples per
prompt) is the datamodule's ``rollout.evaluation.Evaluator``, on the run's
engine and verifier.

The step-0 evaluation scores the warm start, which every algorithm of a
``run`` shares for a seed. The runner hands the algorithms of one seed one
``StartEvals``: when one of them has evaluated the warm start on the same rows
and settings from the same random state, the next reuses the result and the
random state it left, so its run is exactly what it would have been, minus
the repeated evaluation. It lives as long as that seed's runs, not the
process, and knows which weights it holds by the warm start's folder.
"""

from __future__ import annotations

import hashlib
import time

import torch


class StartEvals:
    """The step-0 evaluations of runs that all start from the warm start in ``source`` (a folder): key ->
    (metrics, the draws' stream state after, verifier timeouts)."""

    def __init__(self, source: str):
        self.source = source
        self.done: dict[str, tuple[dict, torch.Tensor, int]] = {}

    def key(self, dm) -> str:
        """What a step-0 evaluation's outcome depends on beside the weights: the eval rows, the task and
        sampling settings, and the random state the sampled completions draw from (the run's stream; with a
        generator per completion, the seed)."""
        h = hashlib.blake2b(digest_size=20)
        s, ev = dm.s, dm.evaluator  # the settings ``Evaluator.evaluate`` reads (not the training-only ones)
        h.update(repr((self.source, dm.task.spec, s.engine, s.max_new_tokens, s.temperature, s.verify_timeout,
                       s.seeding, ev.samples, ev.ks, ev.batch_size, dm.rank, dm.world, list(ev.rows["prompt"]),
                       list(ev.rows["answer"]))).encode())
        h.update(repr(dm.seed).encode() if s.seeding == "request" else
                 dm.draws.generator("cpu").get_state().numpy().tobytes())
        return h.hexdigest()


class HeldOutEval:
    """Needs ``policy``, ``trainer.datamodule`` (``evaluator``, ``rank``, ``world``, ``timeouts``,
    ``count_timeouts``), ``logger``, ``rl_step``, ``world``, ``clock``, ``eval_history``, ``eval_log``,
    ``eval_listeners`` and ``start_evals`` from the module."""

    def publish_eval(self, metrics: dict[str, float]) -> None:
        """Log ``eval/*`` at the current RL step and tell the listeners."""
        if self.logger is not None:
            self.logger.log_metrics(metrics, step=self.rl_step)
        self.eval_history.append((self.rl_step, metrics["eval/pass1"]))
        self.eval_log.append((self.rl_step, metrics))
        for listener in self.eval_listeners:
            listener(self.rl_step, dict(metrics))

    @torch.no_grad()
    def evaluate_now(self) -> None:
        """Held-out evaluation of the policy as it is now: before the first step, every ``eval_every`` steps
        and after the last (our own loop, not Lightning's validation loop, so a resumed run evaluates at the
        same steps as an uninterrupted one)."""
        t0 = time.perf_counter()
        dm = self.trainer.datamodule
        # one process on CPU (where the stream's CPU state is all the sampler draws from): reuse a step-0 result
        shared, key = self.start_evals, None
        if (shared is not None and self.rl_step == 0 and self.world == 1
                and all(p.device.type == "cpu" for p in self.policy.parameters())):
            key = shared.key(dm)
        if key is not None and key in shared.done:
            metrics, rng, late = shared.done[key]
            dm.draws.generator("cpu").set_state(rng)
            # its timeouts are part of the result (the next step's verify/timeouts); its completions were
            # not generated again, so they stay out of this run's count (bench --whole's completions/hour)
            dm.count_timeouts(late)
            self.publish_eval(dict(metrics))
            self.clock["eval_s"] += time.perf_counter() - t0
            return
        before = dm.timeouts
        was_training = self.policy.training
        self.policy.eval()
        metrics = dm.evaluator.run(dm, self.policy, dm.rank, dm.world, self.rl_step)
        if metrics is not None:
            self.publish_eval(metrics)
            if key is not None:
                shared.done[key] = (dict(metrics), dm.draws.generator("cpu").get_state(), dm.timeouts - before)
        self.policy.train(was_training)
        self.clock["eval_s"] += time.perf_counter() - t0
