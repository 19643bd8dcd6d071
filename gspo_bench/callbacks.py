"""Lightning callbacks: collapse detection and the MoE expert-flip probe.

Both read what the module exposes (``last_metrics``, ``rl_step``, the rollout
batch) and never change the training step itself, so an algorithm module
stays the same whether or not they are attached.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import asdict, dataclass

import lightning as L
import torch

from gspo_bench.config import CollapseConfig
from gspo_bench.engine import position_ids

COLLAPSE_KINDS = ("reward_drop", "entropy_collapse", "length_blowup", "ratio_explosion", "nonfinite")


@dataclass
class CollapseEvent:
    kind: str
    step: int
    time: float  # unix seconds
    value: float  # the metric that tripped
    threshold: float
    detail: str


class CollapseDetector:
    """Pure detection logic: feed it one step's metrics, get the events that step opens.

    An event fires when its condition turns true and re-arms once it turns
    false, so a run stuck in one collapse logs it once, not every step.
    """

    def __init__(self, cfg: CollapseConfig):
        self.cfg = cfg
        self.rewards: deque[float] = deque(maxlen=cfg.window)
        self.best_running = -math.inf
        self.first_length: float | None = None
        self.active: set[str] = set()

    def conditions(self, m: dict[str, float]) -> dict[str, tuple[bool, float, float, str]]:
        c = self.cfg
        out = {}
        if "reward/mean" in m and math.isfinite(m["reward/mean"]):
            self.rewards.append(m["reward/mean"])
        if len(self.rewards) == c.window:
            running = sum(self.rewards) / c.window
            self.best_running = max(self.best_running, running)
            out["reward_drop"] = (running < self.best_running - c.reward_drop, running,
                                  self.best_running - c.reward_drop,
                                  f"running mean {running:.3f} vs best {self.best_running:.3f}")
        if "policy/entropy" in m:
            out["entropy_collapse"] = (m["policy/entropy"] < c.entropy_floor, m["policy/entropy"], c.entropy_floor,
                                       "mean token entropy under the floor")
        if "response/length_mean" in m:
            if self.first_length is None:
                self.first_length = max(m["response/length_mean"], 1.0)
            limit = c.length_factor * self.first_length
            out["length_blowup"] = (m["response/length_mean"] > limit, m["response/length_mean"], limit,
                                    f"mean length vs {c.length_factor}x the first step's")
        rmax, dstd = m.get("ratio/max", 1.0), m.get("ratio/token_log_std", 0.0)
        out["ratio_explosion"] = (rmax > c.ratio_max or dstd > c.delta_std_max, max(rmax, dstd),
                                  c.ratio_max if rmax > c.ratio_max else c.delta_std_max,
                                  f"ratio max {rmax:.3g}, log-ratio std {dstd:.3g}")
        bad = [k for k in ("train/loss", "train/grad_norm") if k in m and not math.isfinite(m[k])]
        if m.get("train/nonfinite", 0.0) > 0:
            bad.append("skipped update")
        out["nonfinite"] = (bool(bad), float(len(bad)), 0.0, "non-finite: " + ", ".join(bad))
        return out

    def update(self, step: int, metrics: dict[str, float]) -> list[CollapseEvent]:
        events = []
        for kind, (hit, value, threshold, detail) in self.conditions(metrics).items():
            if hit and kind not in self.active:
                events.append(CollapseEvent(kind, step, time.time(), float(value), float(threshold), detail))
            (self.active.add if hit else self.active.discard)(kind)
        return events


class CollapseCallback(L.Callback):
    """Log collapse events (metric at the step, tag, JSON artifact); stop the run if asked to."""

    def __init__(self, cfg: CollapseConfig, log=print):
        self.cfg, self.echo = cfg, log
        self.detector = CollapseDetector(cfg)
        self.events: list[CollapseEvent] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        new = self.detector.update(pl_module.rl_step, pl_module.last_metrics)
        if not new:
            return
        self.events += new
        logger = pl_module.logger
        for e in new:
            self.echo(f"[collapse] {pl_module.loss_name} step {e.step}: {e.kind} ({e.detail})")
            if logger is not None:
                logger.log_metrics({f"collapse/{e.kind}": 1.0, "collapse/events": float(len(self.events))},
                                   step=e.step)
                logger.experiment.set_tag(logger.run_id, f"collapse.{e.kind}", str(e.step))
        if logger is not None:
            logger.experiment.set_tag(logger.run_id, "collapse.count", str(len(self.events)))
        if self.cfg.on_collapse == "stop":
            trainer.should_stop = True

    def _dump(self, pl_module):
        logger = pl_module.logger
        if logger is not None and getattr(logger, "run_id", None):
            logger.experiment.log_dict(logger.run_id, [asdict(e) for e in self.events], "collapse_events.json")
            logger.experiment.set_tag(logger.run_id, "collapse.count", str(len(self.events)))

    def on_train_end(self, trainer, pl_module):
        self._dump(pl_module)

    def on_exception(self, trainer, pl_module, exception):
        self._dump(pl_module)


class RouterRecorder:
    """Forward hooks on every ``mlp.gate`` router that keep its top-k expert indices."""

    def __init__(self, model: torch.nn.Module):
        self.gates = [m for name, m in model.named_modules() if name.endswith("mlp.gate") and hasattr(m, "top_k")]
        self.indices: list[torch.Tensor] = []
        self._handles = []

    def __enter__(self):
        self.indices = []

        def hook(module, args, output):
            # transformers 5 routers return (logits, scores, top-k indices)
            self.indices.append(output[-1].detach())

        self._handles = [g.register_forward_hook(hook) for g in self.gates]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()


@torch.no_grad()
def route(model, input_ids, attention_mask) -> torch.Tensor:
    """Top-k expert indices, (layers, B*S, k), for one forward pass."""
    with RouterRecorder(model) as rec:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
              use_cache=False)
    return torch.stack(rec.indices)


def expert_flip_rate(old_LNK: torch.Tensor, new_LNK: torch.Tensor, token_mask_N: torch.Tensor) -> torch.Tensor:
    """Of the old policy's (token, layer, slot) choices, the fraction the new policy no longer makes.

    A slot counts as flipped when its old expert is absent from the new top-k
    set of the same token and layer (a reordering inside the top-k is not a
    flip: the same experts still process the token).
    """
    # still_chosen[l, n, j] = old[l, n, j] in new[l, n, :]
    still = (old_LNK.unsqueeze(-1) == new_LNK.unsqueeze(-2)).any(-1)
    w = token_mask_N.to(still.dtype)[None, :, None].expand_as(still).float()
    return ((~still).float() * w).sum() / w.sum().clamp(min=1)


class MoEFlipProbe(L.Callback):
    """Logs ``moe/expert_flip_rate`` (ALGORITHMS.md, MoE) on the rollout's response tokens each step."""

    def __init__(self):
        self._old = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._old = route(pl_module.policy, batch.input_ids, batch.attention_mask)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._old is None or self._old.numel() == 0:
            return
        new = route(pl_module.policy, batch.input_ids, batch.attention_mask)
        P = batch.prompt_len
        tok = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
        tok[:, P:] = batch.response_mask.bool()
        rate = float(expert_flip_rate(self._old, new, tok.flatten()))
        pl_module.last_metrics["moe/expert_flip_rate"] = rate
        if pl_module.logger is not None:
            pl_module.logger.log_metrics({"moe/expert_flip_rate": rate}, step=pl_module.rl_step)
        self._old = None
