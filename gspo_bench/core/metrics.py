"""Per-step aggregation of minibatch statistics.

A rollout step runs several minibatches; each returns the same keys. Keys
ending in ``/min`` or ``_min`` reduce by min, ``/max`` or ``_max`` by max,
everything else by mean, so ``ratio/max`` is the max over the whole step.

A NaN or Inf in any minibatch stays in the step's value (torch's mean, min
and max propagate it): a NaN loss in one of four minibatches must read as
NaN, not as the mean of the other three, or the collapse detector never sees
it. A step has a handful of values per key (one per minibatch), so they are
reduced with plain tensor ops in float32; the reduction across processes is
``core.collectives.reduce_metrics``'s, and the held-out evaluation's (many
values, averaged over ranks) is torchmetrics' (``algorithms/evaluation.py``).
"""

from __future__ import annotations

import torch


def reduce_key(key: str, values: torch.Tensor) -> torch.Tensor:
    """One value from a key's per-minibatch ``values`` (float32, 1-D), by the rule of the module docstring."""
    if key.endswith(("/min", "_min")):
        return values.min()
    if key.endswith(("/max", "_max")):
        return values.max()
    # mean = sum / n
    return values.sum() / values.numel()


class StepStats:
    """Accumulate dicts of 0-dim tensors/floats; ``reduce()`` returns plain floats.

    Values are kept as they come and reduced once per key in ``reduce`` (one device-to-host copy per key
    instead of one per value).
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
            out[k] = float(reduce_key(k, col.cpu()))
        return out
