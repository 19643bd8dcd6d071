"""Collapse detection: a pure ``CollapseDetector`` behind a thin Lightning callback.

It reads what the module exposes (``last_metrics``, ``rl_step``) and never
changes the training step itself.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass

import lightning as L

from gspo_bench.config import CollapseConfig

COLLAPSE_KINDS = ("reward_drop", "entropy_collapse", "length_blowup", "ratio_explosion", "nonfinite")
# step metrics whose NaN/Inf is a ``nonfinite`` event: losses, gradient norms, ratio and KL statistics
NONFINITE_WATCHED = ("train/", "loss/", "ratio/", "clip/", "kl/", "critic/grad_norm", "critic/value_loss")


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
        # a NaN/Inf ratio statistic is an explosion too (a comparison with NaN is always False)
        ratio_hit = not (rmax <= c.ratio_max)
        out["ratio_explosion"] = (ratio_hit or not (dstd <= c.delta_std_max), max(rmax, dstd),
                                  c.ratio_max if ratio_hit else c.delta_std_max,
                                  f"ratio max {rmax:.3g}, log-ratio std {dstd:.3g}")
        bad = sorted(k for k, v in m.items() if k.startswith(NONFINITE_WATCHED) and not math.isfinite(v))
        if m.get("train/nonfinite", 0.0) > 0:
            bad.append(f"skipped updates ({m['train/nonfinite']:.0%} of minibatches)")
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
            self.echo(f"[collapse] {pl_module.name} step {e.step}: {e.kind} ({e.detail})")
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
