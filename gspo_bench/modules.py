"""One thin LightningModule per algorithm over a shared base.

``PolicyModule`` does everything the algorithms share: old log-probs,
minibatching (one optimiser step per minibatch, so later minibatches are off
policy), the loss call through the registry, gradient clipping, a non-finite
guard, and logging with the RL step as the MLflow step. A subclass names its
loss and its defaults; only PPO (critic, GAE) has real code, in ``ppo.py``.

Manual optimisation: Lightning's ``global_step`` counts optimiser steps, so the
module keeps its own ``rl_step`` (one per rollout) for logging.

Each class also carries its Optuna search space (``search_space``, used by
``tune``): the loss parameters it may search, with ranges around the
published values, next to the defaults they come from.
"""

from __future__ import annotations

import time
from typing import ClassVar

import lightning as L
import torch
from transformers import AutoModelForCausalLM

from gspo_bench.config import AUTO, RunConfig
from gspo_bench.data import RolloutBatch
from gspo_bench.engine import response_logp
from gspo_bench.losses import LOSSES, kl_penalty, policy_loss
from gspo_bench.metrics import StepStats
from torchmetrics.aggregation import MeanMetric

MODULES: dict[str, type["PolicyModule"]] = {}


def adamw(params, **kw) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one kernel for all parameters: ~4x faster steps on CPU)."""
    return torch.optim.AdamW(params, fused=True, **kw)


def register_module(cls):
    MODULES[cls.loss_name] = cls
    return cls


class PolicyModule(L.LightningModule):
    loss_name: ClassVar[str] = ""
    # per-algorithm defaults for config fields left at "auto"
    dynamic_sampling: ClassVar[bool] = False
    overlong_shaping: ClassVar[bool] = False
    default_kl_coef: ClassVar[float] = 0.0
    kl_in_loss: ClassVar[bool] = True
    # ``tune``: the loss parameters searched when ``--params`` does not say (see ``search_ranges``)
    searched_by_default: ClassVar[tuple[str, ...]] = ("eps_low", "eps_high")

    def __init__(self, cfg: RunConfig, model_path: str, seed: int = 0):
        super().__init__()
        self.automatic_optimization = False
        self.cfg, self.seed = cfg, seed
        self.policy = AutoModelForCausalLM.from_pretrained(
            model_path, trust_remote_code=cfg.model.trust_remote_code, dtype=torch.float32)
        self.hp = self.resolve_loss_hparams(cfg)
        self.kl_coef = self.hp.pop("kl_coef")
        self.ref = None
        if self.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(
                model_path, trust_remote_code=cfg.model.trust_remote_code, dtype=torch.float32)
            self.ref.requires_grad_(False).eval()
        self.rl_step = 0
        self.first_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.eval_history: list[tuple[int, float]] = []  # (rl_step, eval pass@1)
        self.eval_log: list[tuple[int, dict[str, float]]] = []  # (rl_step, every eval/* metric)
        self._eval: dict[str, list[torch.Tensor]] = {}
        self._manual_eval = False
        self._ratio_sample: dict | None = None
        self._check_mismatch = False

    # -- configuration ------------------------------------------------------------------------
    @classmethod
    def resolve_loss_hparams(cls, cfg: RunConfig) -> dict:
        spec, lc = LOSSES[cls.loss_name], cfg.loss
        return {
            "eps_low": spec.eps_low if lc.eps_low == AUTO else lc.eps_low,
            "eps_high": spec.eps_high if lc.eps_high == AUTO else lc.eps_high,
            "dual_clip_c": lc.dual_clip_c,
            "kl_coef": cls.default_kl_coef if lc.kl_coef == AUTO else float(lc.kl_coef),
            "kl_estimator": lc.kl_estimator,
        }

    @classmethod
    def resolve_rollout(cls, cfg: RunConfig, task_max_new_tokens: int) -> dict:
        r = cfg.rollout
        max_new = task_max_new_tokens if r.max_new_tokens == AUTO else r.max_new_tokens
        buffer = r.overlong_buffer
        if buffer == AUTO:
            buffer = max(1, max_new // 4) if cls.overlong_shaping else None
        return {
            "prompts_per_step": r.prompts_per_step, "group_size": r.group_size, "max_new_tokens": max_new,
            "temperature": r.temperature, "engine": r.engine,
            "dynamic_sampling": cls.dynamic_sampling if r.dynamic_sampling == AUTO else r.dynamic_sampling,
            "max_gen_batches": r.max_gen_batches, "overlong_buffer": buffer, "overlong_penalty": r.overlong_penalty,
            "advantage_scale": r.advantage_scale, "want_rollout_logp": r.old_logp_source == "rollout",
        }

    # -- search space (``tune``) ----------------------------------------------------------------
    @classmethod
    def search_ranges(cls) -> dict[str, tuple[float, float, bool]]:
        """(low, high, log scale) of each loss parameter ``tune`` can search, by its ``loss.`` name.

        Token-level clip (PPO, GRPO, DAPO): uniform around the published
        offsets (p_lo, p_hi), split at their midpoint m = (p_lo + p_hi) / 2:
        eps_low in [p_lo / 2, m], eps_high in [m, 1.5 p_hi]. So eps_high >=
        eps_low always (DAPO's clip-higher; PPO's symmetric 0.2 / 0.2 is the
        corner) while both ranges stay fixed: Optuna's parameter importance
        refuses ranges that move from trial to trial.
        """
        spec = LOSSES[cls.loss_name]
        m = (spec.eps_low + spec.eps_high) / 2
        return {"eps_low": (0.5 * spec.eps_low, m, False), "eps_high": (m, 1.5 * spec.eps_high, False)}

    @classmethod
    def search_space(cls, trial, params=None) -> dict:
        """Config overrides for one Optuna trial, e.g. ``{"loss": {"eps_low": 0.13, "eps_high": 0.27}}``.

        ``params`` picks which of ``search_ranges`` to sample (default
        ``searched_by_default``); the others keep the algorithm's default.
        """
        chosen = cls.searched_by_default if params is None else tuple(params)
        return {"loss": {name: trial.suggest_float(name, low, high, log=log)
                         for name, (low, high, log) in cls.search_ranges().items() if name in chosen}}

    def configure_optimizers(self):
        return adamw(self.policy.parameters(), lr=self.cfg.train.lr, weight_decay=self.cfg.train.weight_decay)

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        if dm is not None:
            dm.policy = self.policy

    @property
    def temperature(self) -> float:
        return self.cfg.rollout.temperature

    # -- the RL step ---------------------------------------------------------------------------
    def response_logp(self, model, input_ids, attention_mask, prompt_len: int, with_entropy: bool = False):
        """Response log-probs (and entropy) through the configured training forward (``train.forward``)."""
        return response_logp(model, input_ids, attention_mask, prompt_len, self.temperature, with_entropy,
                             self.cfg.train.forward)

    def prepare(self, batch: RolloutBatch, stats: StepStats) -> dict[str, torch.Tensor]:
        """Tensors every minibatch needs: old (and reference) log-probs and advantages.

        With ``old_logp_source: rollout`` the engine's log-probs are used as is and
        no recompute pass runs; the first minibatch, taken before any update,
        then measures the engine/trainer mismatch at no extra cost.
        """
        mask = batch.response_mask
        use_rollout = self.cfg.rollout.old_logp_source == "rollout" and batch.rollout_logp is not None
        self._check_mismatch = use_rollout
        with torch.no_grad():
            if use_rollout:
                old = batch.rollout_logp
            else:
                old, _ = self.response_logp(self.policy, batch.input_ids, batch.attention_mask, batch.prompt_len)
                if batch.rollout_logp is not None:
                    stats.add(self.mismatch(old, batch.rollout_logp, mask))
            out = {"old_logp": old * mask, "advantages": batch.advantages}
            if self.ref is not None:
                out["ref_logp"], _ = self.response_logp(self.ref, batch.input_ids, batch.attention_mask,
                                                        batch.prompt_len)
        return out

    @staticmethod
    def mismatch(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict:
        """How far the engine's log-probs are from the training forward's on the same tokens."""
        diff = (train_logp - rollout_logp) * mask
        # mismatch KL(rollout || train) ~ k3 per token, averaged over response tokens
        k3 = kl_penalty(train_logp, rollout_logp, "k3") * mask
        return {"mismatch/kl": k3.sum() / mask.sum().clamp(min=1), "mismatch/abs_diff_max": diff.abs().max()}

    def minibatch_loss(self, batch: RolloutBatch, prep: dict, idx: torch.Tensor, stats: StepStats):
        """Policy loss on the rows ``idx``; returns the scalar to backpropagate."""
        logp, ent = self.response_logp(self.policy, batch.input_ids[idx], batch.attention_mask[idx],
                                       batch.prompt_len, with_entropy=True)
        mask = batch.response_mask[idx]
        if self._check_mismatch:  # first minibatch, policy not yet updated: logp is a fresh recompute
            self._check_mismatch = False
            with torch.no_grad():
                stats.add(self.mismatch(logp.detach(), prep["old_logp"][idx], mask))
        extra = {}
        if self.ref is not None and self.kl_in_loss:
            extra = {"kl_coef": self.kl_coef, "ref_logp": prep["ref_logp"][idx]}
        loss, st = policy_loss(self.loss_name, logp=logp, old_logp=prep["old_logp"][idx],
                               advantages=prep["advantages"][idx], mask=mask, **self.hp, **extra)
        st["policy/entropy"] = (ent * mask).sum() / mask.sum().clamp(min=1)
        stats.add(st)
        if self._ratio_sample is not None:
            with torch.no_grad():
                # delta = logp - old_logp per token; the sequence log-ratio is its mean over |y_i|
                delta = (logp.detach() - prep["old_logp"][idx]) * mask
                n = mask.sum(-1)
                self._ratio_sample["token"].append(delta[mask.bool()].float().cpu())
                self._ratio_sample["seq"].append((delta.sum(-1) / n.clamp(min=1))[n > 0].float().cpu())
        return loss

    def optimizer_list(self) -> list:
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def step_optimizers(self, stats: StepStats) -> None:
        """Clip, check for NaN/Inf, and step; a non-finite gradient skips the update entirely."""
        max_norm = self.cfg.train.max_grad_norm or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_norm)
        finite = bool(torch.isfinite(norm))
        for opt in self.optimizer_list():
            if finite:
                opt.step()
            opt.zero_grad(set_to_none=True)
        stats.add({"train/grad_norm": norm, "train/nonfinite": torch.tensor(float(not finite))})

    def training_step(self, batch: RolloutBatch, batch_idx: int):
        t0 = time.perf_counter()
        stats = StepStats()
        prep = self.prepare(batch, stats)
        B = len(batch)
        n_mb = min(self.cfg.train.minibatches, B)
        g = torch.Generator().manual_seed(self.seed * 7919 + self.rl_step)
        perm = torch.randperm(B, generator=g).to(batch.input_ids.device)
        for opt in self.optimizer_list():
            opt.zero_grad(set_to_none=True)
        dump = (self.rl_step + 1) % self.cfg.train.eval_every == 0 or self.rl_step + 1 == self.cfg.train.steps
        self._ratio_sample = {"token": [], "seq": []} if dump else None
        for idx in perm.chunk(n_mb):
            loss = self.minibatch_loss(batch, prep, idx, stats)
            finite = bool(torch.isfinite(loss))
            stats.add({"train/loss": loss.detach()})
            if finite:
                self.manual_backward(loss)
            self.step_optimizers(stats)
        self.rl_step += 1
        metrics = {**batch.stats, **stats.reduce()}
        metrics["time/train_s"] = time.perf_counter() - t0
        metrics["time/step_s"] = metrics["time/train_s"] + batch.stats.get("time/gen_s", 0.0)
        self.record(metrics)
        if self._ratio_sample is not None:
            self.log_ratio_sample()
        return None

    def log_ratio_sample(self, cap: int = 20000) -> None:
        """Artifact ``ratios/step_NNNN.json``: this step's token and sequence log-ratios (report figure c)."""
        token = torch.cat(self._ratio_sample["token"]) if self._ratio_sample["token"] else torch.zeros(0)
        seq = torch.cat(self._ratio_sample["seq"]) if self._ratio_sample["seq"] else torch.zeros(0)
        self._ratio_sample = None
        if len(token) > cap:  # real models: keep the file small, a uniform subsample tells the same story
            token = token[torch.randperm(len(token), generator=torch.Generator().manual_seed(0))[:cap]]
        if self.logger is None or not hasattr(self.logger, "run_id"):
            return
        payload = {"algo": self.loss_name, "step": self.rl_step, "eps_low": self.hp["eps_low"],
                   "eps_high": self.hp["eps_high"], "token_log_ratio": [round(x, 6) for x in token.tolist()],
                   "seq_log_ratio": [round(x, 6) for x in seq.tolist()]}
        self.logger.experiment.log_dict(self.logger.run_id, payload, f"ratios/step_{self.rl_step:04d}.json")

    def record(self, metrics: dict[str, float]) -> None:
        """Log with the RL step as the step; also feed callback_metrics and the progress bar."""
        self.last_metrics = metrics
        if self.rl_step == 1:
            self.first_metrics = dict(metrics)
        if self.logger is not None:
            self.logger.log_metrics(metrics, step=self.rl_step)
        bar = {"reward": metrics.get("reward/mean", 0.0), "clip": metrics.get("clip/frac", 0.0)}
        self.log_dict(bar, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1)
        self.log("rl_step", float(self.rl_step), logger=False, batch_size=1)

    # -- evaluation ------------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        # torchmetrics means over every eval prompt (pass1) and every sampled completion (reward)
        self._eval = {"pass1": MeanMetric(), "reward": MeanMetric()}
        self._eval_seen = set()

    def validation_step(self, batch: dict, batch_idx: int):
        out = self.trainer.datamodule.evaluate(self.policy, batch)
        for k, v in out.items():
            self._eval[k].update(v.float().cpu())
            self._eval_seen.add(k)

    def on_validation_epoch_end(self) -> None:
        if "pass1" not in getattr(self, "_eval_seen", ()) or self.trainer.sanity_checking:
            return
        metrics = {"eval/pass1": float(self._eval["pass1"].compute())}
        if "reward" in self._eval_seen:
            metrics["eval/reward_mean"] = float(self._eval["reward"].compute())
        if self._in_val_loop():
            self.log_dict(metrics, logger=False, batch_size=1)
        if self.logger is not None:
            self.logger.log_metrics(metrics, step=self.rl_step)
        self.eval_history.append((self.rl_step, metrics["eval/pass1"]))
        self.eval_log.append((self.rl_step, metrics))

    def _in_val_loop(self) -> bool:
        # Lightning only allows self.log inside its own loops; evaluate_now runs outside them
        return not self._manual_eval

    @torch.no_grad()
    def evaluate_now(self) -> None:
        """The same evaluation outside Lightning's loop: before the first step and after the last."""
        was_training = self.policy.training
        self.policy.eval()
        self._manual_eval = True
        self.on_validation_epoch_start()
        for i, batch in enumerate(self.trainer.datamodule.val_dataloader()):
            self.validation_step(batch, i)
        self.on_validation_epoch_end()
        self._manual_eval = False
        self.policy.train(was_training)

    def on_train_start(self) -> None:
        # the warm-start score, logged at step 0
        self.evaluate_now()

    def on_train_end(self) -> None:
        if not self.eval_history or self.eval_history[-1][0] != self.rl_step:
            self.evaluate_now()


def _algo(name: str, doc: str, **attrs):
    cls = type(name.upper(), (PolicyModule,), {"loss_name": name, "__doc__": doc, **attrs})
    return register_module(cls)


GRPO = _algo("grpo", "GRPO (Shao et al. 2024): token ratio, group z-score advantage, seq-mean-token-mean.")
DAPO = _algo("dapo", "DAPO (Yu et al. 2025): clip-higher, token-mean, dynamic sampling and overlong shaping on.",
             dynamic_sampling=True, overlong_shaping=True)


def _sequence_clip_ranges(cls) -> dict[str, tuple[float, float, bool]]:
    """GSPO, GSPO-token: sequence ratios sit within ~1e-3 of 1, so both offsets are log-uniform over
    1e-5 .. 1e-2 (the published 3e-4 / 4e-4 in the middle), independently."""
    return {"eps_low": (1e-5, 1e-2, True), "eps_high": (1e-5, 1e-2, True)}


def _cispo_ranges(cls) -> dict[str, tuple[float, float, bool]]:
    """CISPO: the weight cap 1 + eps_high, eps_high log-uniform over 0.5 .. 10 (published 4.0). The lower
    bound is off as published (``searched_by_default`` leaves it out); ``--params eps_low,eps_high``
    searches it uniformly over 0.1 .. 0.9."""
    return {"eps_high": (0.5, 10.0, True), "eps_low": (0.1, 0.9, False)}


GSPO = _algo("gspo", "GSPO (Zheng et al. 2025): one length-normalised ratio and clip per sequence.",
             search_ranges=classmethod(_sequence_clip_ranges))
GSPO_TOKEN = _algo("gspo_token", "GSPO-token: GSPO's ratio value with per-token gradient paths (TRL PR 3820).",
                   search_ranges=classmethod(_sequence_clip_ranges))
CISPO = _algo("cispo", "CISPO (MiniMax-M1 2025): clip the importance weight, keep every token's gradient.",
              search_ranges=classmethod(_cispo_ranges), searched_by_default=("eps_high",))
