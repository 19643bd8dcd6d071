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


_POOL: dict = {}  # one reducer per key, reset for each step (constructing one costs 4x a reset)


def _pooled(key: str):
    m = _POOL.get(key)
    if m is None:
        m = _POOL[key] = _reducer(key)
    m.reset()
    return m


def _reducer(key: str):
    # this process's steps only: a multi-process step reduces over ranks itself (distributed.reduce_metrics)
    if key.endswith(("/min", "_min")):
        return MinMetric(nan_strategy="disable", sync_on_compute=False)
    if key.endswith(("/max", "_max")):
        return MaxMetric(nan_strategy="disable", sync_on_compute=False)
    return MeanMetric(nan_strategy="disable", sync_on_compute=False)


class StepStats:
    """Accumulate dicts of 0-dim tensors/floats; ``reduce()`` returns plain floats.

    Values are kept as they come and handed to torchmetrics once per key in ``reduce`` (one update with
    all of a step's values, not one per minibatch: the same mean, min and max, at a fraction of the calls,
    and one device-to-host copy per key instead of one per value).
    """

    def __init__(self):
        self._v: dict[str, list] = {}

    def add(self, stats: dict) -> None:
        for k, v in stats.items():
            self._v.setdefault(k, []).append(v.detach() if isinstance(v, torch.Tensor) else v)

    def reduce(self) -> dict[str, float]:
        out = {}
        for k, values in self._v.items():
            dev = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
            col = torch.stack([v.to(dev, torch.float32).reshape(()) if isinstance(v, torch.Tensor)
                               else torch.tensor(float(v), device=dev) for v in values])
            m = _pooled(k)
            m.update(col.cpu())
            out[k] = float(m.compute())
        return out
