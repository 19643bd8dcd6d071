"""Measurements that are not part of the update: the sampler/trainer mismatch and the ratio sample.

Both read the module's ``trace`` (this step's old log-probs and each
minibatch's log-probs, detached) after the step, so the RL step stays the
same whether or not they are attached.
"""

from __future__ import annotations

import lightning as L
import torch

from gspo_bench.core.losses import LOSSES, loss_keywords
from gspo_bench.core.ratios import mismatch_stats


def _trainer_logp_before_update(pl_module, batch) -> torch.Tensor | None:
    """The trainer's log-probs of the rollout before any update, (B, T), at no extra forward pass.

    With ``old_logp_source: recompute`` that is the recompute pass. With
    ``rollout`` there is none, but the first minibatch ran before the first
    optimiser step, so its rows are measured (and only those).
    """
    trace = pl_module.trace
    if pl_module.settings.rollout.old_logp_source == "recompute":
        return trace.old_logp
    if not trace.minibatches:
        return None
    rows, logp = trace.minibatches[0]
    out = torch.full_like(trace.old_logp, float("nan"))
    out[rows] = logp
    return out


class MismatchProbe(L.Callback):
    """Logs ``mismatch/kl``, ``mismatch/abs_diff_max`` and ``mismatch/seq_log_ratio_std`` whenever the
    engine returned its log-probs (docs/algorithms.md, "Rollout precision and the mismatch")."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch.rollout_logp is None or pl_module.trace is None:
            return
        trainer_logp = _trainer_logp_before_update(pl_module, batch)
        if trainer_logp is None:
            return
        measured = ~torch.isnan(trainer_logp).all(-1)  # rows the trainer's pre-update log-probs cover
        mask = batch.loss_mask[measured]  # the sampled tokens: the engine gave log-probs for those only
        with torch.no_grad():
            stats = mismatch_stats(trainer_logp[measured], batch.rollout_logp[measured], mask)
        metrics = {k: float(v) for k, v in stats.items()}
        pl_module.last_metrics.update(metrics)
        if pl_module.logger is not None:
            pl_module.logger.log_metrics(metrics, step=pl_module.rl_step)


class RatioSample(L.Callback):
    """Artifact ``ratios/step_NNNN.json`` on eval steps and the last step: the token and sequence
    log-ratios of every minibatch of that step (the report's histogram, figure c)."""

    def __init__(self, cap: int = 20000):
        self.cap = cap

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step, train = pl_module.rl_step, pl_module.cfg.train
        if pl_module.trace is None or not (step % train.eval_every == 0 or step == train.steps):
            return
        logger = pl_module.logger
        if logger is None or not hasattr(logger, "run_id"):
            return
        token, seq = [], []
        for rows, logp in pl_module.trace.minibatches:
            mask = batch.loss_mask[rows]
            # delta = logp - old_logp per token; the sequence log-ratio is its mean over |y_i|
            delta = (logp - pl_module.trace.old_logp[rows]) * mask
            n = mask.sum(-1)
            token.append(delta[mask.bool()].float().cpu())
            seq.append((delta.sum(-1) / n.clamp(min=1))[n > 0].float().cpu())
        token_t = torch.cat(token) if token else torch.zeros(0)
        seq_t = torch.cat(seq) if seq else torch.zeros(0)
        if len(token_t) > self.cap:  # real models: keep the file small, a uniform subsample tells the same story
            token_t = token_t[torch.randperm(len(token_t), generator=torch.Generator().manual_seed(0))[:self.cap]]
        # the band as offsets of the ratio r (none for a loss that bounds no ratio: SAPO's gate, DPPO's gap)
        spec = LOSSES[pl_module.name]
        hp = loss_keywords(spec, pl_module.settings.loss.hparams(), pl_module.settings.rollout.max_new_tokens)
        eps_low, eps_high = spec.ratio_band(hp.get("eps_low"), hp.get("eps_high"))
        payload = {"algo": pl_module.name, "step": step, "eps_low": eps_low, "eps_high": eps_high,
                   "token_log_ratio": [round(x, 6) for x in token_t.tolist()],
                   "seq_log_ratio": [round(x, 6) for x in seq_t.tolist()]}
        logger.experiment.log_dict(logger.run_id, payload, f"ratios/step_{step:04d}.json")
