"""A run whose loss has no token to train on: every token masked, step after step.

The loss's mask (``algorithms.base.loss_mask``) drops responses cut at the length cap
(``rollout.mask_truncated``) and tokens rejection by KL removes (``rollout.rejection``). Where it drops every
token of a step, the loss is 0 and the step changes nothing; the module logs that step's
``train/masked_all`` as 1. This callback says so once, in one line, and where it held at every RL step of
the run, fails the run with the reason: a run that never trained must not end FINISHED with a zero loss
and be averaged into a leaderboard as if it had.
"""

from __future__ import annotations

import lightning as L


class MaskedAllRun(RuntimeError):
    """Every RL step of a run masked every token of its loss."""


def _masks(pl_module) -> str:
    """The settings that mask the loss's tokens in this run, as the config names them."""
    r = pl_module.settings.rollout
    on = (["rollout.mask_truncated"] if r.mask_truncated else []) + (
        [f"rollout.rejection={r.rejection} (threshold {r.rejection_threshold})"] if r.rejection else [])
    return ", ".join(on) or "the loss's mask"


class MaskedAllWatch(L.Callback):
    """Warns once at the first step with ``train/masked_all`` = 1, and at the end fails a run where every step had
    it (``MaskedAllRun``, which the runner records as the run's ``failed_reason``)."""

    def __init__(self, log=print):
        self.echo = log
        self.steps = 0  # RL steps seen (a resumed run counts on from its checkpoint)
        self.masked = 0  # ... of which every token was masked

    def state_dict(self) -> dict:
        return {"steps": self.steps, "masked": self.masked}

    def load_state_dict(self, state_dict: dict) -> None:
        self.steps, self.masked = int(state_dict["steps"]), int(state_dict["masked"])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        if pl_module.last_metrics.get("train/masked_all", 0.0) < 1.0:
            return
        self.masked += 1
        if self.masked == 1:
            self.echo(f"[warning] {pl_module.name} step {pl_module.rl_step}: {_masks(pl_module)} masked every token "
                      "of the loss, so the step trained on nothing (train/masked_all counts such steps)")

    def on_train_end(self, trainer, pl_module):
        if self.steps and self.masked == self.steps:
            raise MaskedAllRun(f"{_masks(pl_module)} masked every token of the loss at all {self.steps} RL steps: "
                               "the policy was never trained (the loss was 0 throughout)")
