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

COLLAPSE_KINDS = ("reward_drop", "eval_drop", "entropy_collapse", "length_blowup", "ratio_explosion", "nonfinite")
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
    false, so a run stuck in one collapse logs it once, not every step. The
    reward and eval criteria are relative to the run's own scale (its best
    running reward, its best eval pass@1, the warm start's included), so a
    task whose whole reward is 0.3 collapses as visibly as one at 0.9.
    ``update`` takes the training step's metrics, ``update_eval`` one held-out
    evaluation.
    """

    def __init__(self, cfg: CollapseConfig):
        self.cfg = cfg
        self.rewards: deque[float] = deque(maxlen=cfg.window)
        self.best_running = -math.inf
        self.best_eval = -math.inf
        self.kl_history: list[float] = []
        self.first_length: float | None = None
        self.active: set[str] = set()

    def state_dict(self) -> dict:
        """Everything later steps compare against (a checkpoint's part)."""
        return {"rewards": list(self.rewards), "best_running": self.best_running, "best_eval": self.best_eval,
                "kl_history": list(self.kl_history), "first_length": self.first_length,
                "active": sorted(self.active)}

    def load_state_dict(self, state: dict) -> None:
        self.rewards = deque(state["rewards"], maxlen=self.cfg.window)
        self.best_running, self.best_eval = float(state["best_running"]), float(state["best_eval"])
        self.kl_history, self.first_length = list(state["kl_history"]), state["first_length"]
        self.active = set(state["active"])

    def _drop(self, value: float, best: float, frac: float) -> tuple[bool, float]:
        # fires when value < (1 - frac) * best and best - value >= min_drop
        threshold = (1.0 - frac) * best
        return value < threshold and best - value >= self.cfg.min_drop, threshold

    def conditions(self, m: dict[str, float]) -> dict[str, tuple[bool, float, float, str]]:
        c = self.cfg
        out = {}
        if "reward/mean" in m and math.isfinite(m["reward/mean"]):
            self.rewards.append(m["reward/mean"])
        if len(self.rewards) == c.window:
            running = sum(self.rewards) / c.window
            self.best_running = max(self.best_running, running)
            hit, threshold = self._drop(running, self.best_running, c.reward_drop)
            out["reward_drop"] = (hit, running, threshold,
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
        if any(k in m for k in ("ratio/max", "ratio/token_log_std", "kl/old")):
            out["ratio_explosion"] = self._ratio(m)
        bad = sorted(k for k, v in m.items() if k.startswith(NONFINITE_WATCHED) and not math.isfinite(v))
        if m.get("train/nonfinite", 0.0) > 0:
            bad.append(f"skipped updates ({m['train/nonfinite']:.0%} of minibatches)")
        out["nonfinite"] = (bool(bad), float(len(bad)), 0.0, "non-finite: " + ", ".join(bad))
        return out

    def _ratio(self, m: dict[str, float]) -> tuple[bool, float, float, str]:
        c = self.cfg
        rmax, dstd = m.get("ratio/max", 1.0), m.get("ratio/token_log_std", 0.0)
        kl = m.get("kl/old", 0.0)
        # kl spike: kl/old > max(kl_floor, kl_factor * median of the earlier steps' kl/old)
        earlier = sorted(self.kl_history)
        kl_limit = max(c.kl_floor, c.kl_factor * earlier[len(earlier) // 2]) if earlier else math.inf
        if math.isfinite(kl):
            self.kl_history.append(kl)
        # a NaN/Inf statistic is an explosion too (a comparison with NaN is always False)
        checks = [(not (rmax <= c.ratio_max), rmax, c.ratio_max), (not (dstd <= c.delta_std_max), dstd, c.delta_std_max),
                  (not (kl <= kl_limit), kl, kl_limit)]
        hit = next((chk for chk in checks if chk[0]), None)
        value, threshold = (hit[1], hit[2]) if hit else (max(rmax, dstd), c.ratio_max)
        return (hit is not None, value, threshold,
                f"ratio max {rmax:.3g}, log-ratio std {dstd:.3g}, kl/old {kl:.3g} (spike limit {kl_limit:.3g})")

    def _events(self, step: int, conds: dict) -> list[CollapseEvent]:
        events = []
        for kind, (hit, value, threshold, detail) in conds.items():
            if hit and kind not in self.active:
                events.append(CollapseEvent(kind, step, time.time(), float(value), float(threshold), detail))
            (self.active.add if hit else self.active.discard)(kind)
        return events

    def update(self, step: int, metrics: dict[str, float]) -> list[CollapseEvent]:
        return self._events(step, self.conditions(metrics))

    def update_eval(self, step: int, pass1: float) -> list[CollapseEvent]:
        """One held-out evaluation (greedy pass@1): ``eval_drop`` against the best so far."""
        if not math.isfinite(pass1):
            return []
        self.best_eval = max(self.best_eval, pass1)
        hit, threshold = self._drop(pass1, self.best_eval, self.cfg.eval_drop)
        return self._events(step, {"eval_drop": (hit, pass1, threshold,
                                                 f"eval pass@1 {pass1:.3f} vs best {self.best_eval:.3f}")})


class CollapseCallback(L.Callback):
    """Log collapse events (metric at the step, tag, JSON artifact); stop the run if asked to."""

    def __init__(self, cfg: CollapseConfig, log=print):
        self.cfg, self.echo = cfg, log
        self.detector = CollapseDetector(cfg)
        self.events: list[CollapseEvent] = []

    def state_dict(self) -> dict:
        return {"detector": self.detector.state_dict(), "events": [asdict(e) for e in self.events]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.detector.load_state_dict(state_dict["detector"])
        self.events = [CollapseEvent(**e) for e in state_dict["events"]]

    def setup(self, trainer, pl_module, stage):
        # evaluations reach the detector as they are recorded (the last one runs after every callback hook)
        listeners = getattr(pl_module, "eval_listeners", None)
        if listeners is not None:
            listeners.append(lambda step, metrics: self._emit(
                trainer, pl_module, self.detector.update_eval(step, metrics["eval/pass1"])))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._emit(trainer, pl_module, self.detector.update(pl_module.rl_step, pl_module.last_metrics))

    def _emit(self, trainer, pl_module, new: list[CollapseEvent]) -> None:
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
        # the JSON artifact and count, now: the final evaluation runs after on_train_end's dump
        self._dump(pl_module)
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
