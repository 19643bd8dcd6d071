"""Per-step aggregation of minibatch statistics with torchmetrics.

A rollout step runs several minibatches; each returns the same keys. Keys
ending in ``/min`` or ``_min`` reduce by min, ``/max`` or ``_max`` by max,
everything else by mean, so ``ratio/max`` is the max over the whole step.

A NaN or Inf in any minibatch stays in the step's value (``nan_strategy=
"disable"``): a NaN loss in one of four minibatches must read as NaN, not as
the mean of the other three, or the collapse detector never sees it.
"""

from __future__ import annotations

import torch
from torchmetrics.aggregation import MaxMetric, MeanMetric, MinMetric


def _reducer(key: str):
    # this process's steps only: a multi-process step reduces over ranks itself (distributed.reduce_metrics)
    if key.endswith(("/min", "_min")):
        return MinMetric(nan_strategy="disable", sync_on_compute=False)
    if key.endswith(("/max", "_max")):
        return MaxMetric(nan_strategy="disable", sync_on_compute=False)
    return MeanMetric(nan_strategy="disable", sync_on_compute=False)


class StepStats:
    """Accumulate dicts of 0-dim tensors/floats; ``reduce()`` returns plain floats."""

    def __init__(self):
        self._m: dict = {}

    def add(self, stats: dict) -> None:
        for k, v in stats.items():
            if k not in self._m:
                self._m[k] = _reducer(k)
            self._m[k].update(torch.as_tensor(v, dtype=torch.float32).detach().cpu())

    def reduce(self) -> dict[str, float]:
        return {k: float(m.compute()) for k, m in self._m.items()}
