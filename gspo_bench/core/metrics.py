"""Statistics of a minibatch from its parts, and their per-step aggregation.

A minibatch trained in micro-batches has its metrics from the parts' own sufficient statistics, merged: a
weighted mean's sum and weight (``Mean``), a share of a sum (``Total``), an extreme (``Extreme``), a population
spread (``Spread``, by Chan, Golub and LeVeque's pairwise update), a sum of those (``Plus``), or a value
only the whole minibatch has (``Whole``). ``merge`` joins two parts' statistics, ``value`` gives the metric;
one part's ``value`` is computed by the same operations as a direct reduction of its tensors
(``ratios.masked_mean`` is ``value(mean_of(x, w))``), so a minibatch in one part logs that reduction bit for bit.
No loss is evaluated a second time for the metrics.

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

import math
from typing import NamedTuple, Union

import torch

Tensor = torch.Tensor


class Mean(NamedTuple):
    """A weighted mean's numerator ``sum(x * w)`` and weight ``sum(w)``: parts add both."""
    num: Tensor
    den: Tensor


class Total(NamedTuple):
    """A part's share of a sum (its loss over the whole minibatch's counts): the parts' shares add."""
    value: Tensor


class Extreme(NamedTuple):
    """The max (``largest``) or min over the kept units, +-inf where none, and whether any was kept."""
    value: Tensor
    seen: Tensor
    largest: bool


class Spread(NamedTuple):
    """A population standard deviation's weight ``n``, weighted mean and ``m2 = sum(w (x - mean)^2)``."""
    n: Tensor
    mean: Tensor
    m2: Tensor


class Plus(NamedTuple):
    """The sum of its terms' values (``clip/frac`` = the high and the low clip fractions)."""
    terms: tuple


class Whole(NamedTuple):
    """A statistic picked over all of a minibatch's tokens at once (M2PO's second moment): no parts to merge."""
    value: Tensor


Partial = Union[Mean, Total, Extreme, Spread, Plus, Whole]


def mean_of(x: Tensor, w: Tensor) -> Mean:
    # sum(x * w) over w > 0 (a NaN or Inf where w = 0 is left out) and sum(w)
    return Mean(torch.where(w > 0, x * w, 0.0).sum(), w.sum())


def extreme_of(x: Tensor, keep: Tensor, largest: bool) -> Extreme:
    filled = torch.where(keep, x, -math.inf if largest else math.inf)
    return Extreme(filled.amax() if largest else filled.amin(), keep.any(), largest)


def spread_of(x: Tensor, w: Tensor) -> Spread:
    m = mean_of(x, w)
    mean = value(m)
    # m2 = sum over w > 0 of w (x - mean)^2
    return Spread(m.den, mean, torch.where(w > 0, (x - mean).square() * w, 0.0).sum())


def _merge_spread(a: Spread, b: Spread) -> Spread:
    n = a.n + b.n
    safe = torch.where(n > 0, n, 1.0)
    d = b.mean - a.mean
    # mean = mean_a + d n_b / n;  m2 = m2_a + m2_b + d^2 n_a n_b / n  (Chan, Golub & LeVeque 1979), d = mean_b - mean_a
    # (an empty first part hands over the second's mean as it is, not rounded through d n_b / n)
    mean = torch.where(a.n > 0, a.mean + d * b.n / safe, b.mean)
    return Spread(n, mean, a.m2 + b.m2 + d.square() * a.n * b.n / safe)


def _merge_whole(a: Whole, b: Whole) -> Whole:
    raise ValueError("a statistic of the whole minibatch cannot be merged from parts of it")


MERGES = {
    Mean: lambda a, b: Mean(a.num + b.num, a.den + b.den),
    Total: lambda a, b: Total(a.value + b.value),
    # max / min propagate a NaN of either part
    Extreme: lambda a, b: Extreme((torch.maximum if a.largest else torch.minimum)(a.value, b.value),
                                  a.seen | b.seen, a.largest),
    Spread: _merge_spread,
    Plus: lambda a, b: Plus(tuple(merge(x, y) for x, y in zip(a.terms, b.terms))),
    Whole: _merge_whole,
}
"""How two parts' statistics of one kind join into the statistic of both parts' rows."""

VALUES = {
    # mean = sum(x w) / sum(w); 0 (not NaN) when nothing is weighted
    Mean: lambda p: p.num / torch.where(p.den > 0, p.den, 1.0),
    Total: lambda p: p.value,
    Extreme: lambda p: torch.where(p.seen, p.value, 0.0),
    # std = sqrt(m2 / n); 0 when nothing is weighted
    Spread: lambda p: (p.m2 / torch.where(p.n > 0, p.n, 1.0)).sqrt(),
    Plus: lambda p: sum((value(t) for t in p.terms[1:]), value(p.terms[0])),
    Whole: lambda p: p.value,
}
"""Each kind's metric from its statistics."""


def merge(a: Partial, b: Partial) -> Partial:
    """The statistic of two parts' rows together, from each part's (the same kind on both sides)."""
    if type(a) is not type(b):
        raise TypeError(f"cannot merge a {type(a).__name__} with a {type(b).__name__}")
    return MERGES[type(a)](a, b)


def value(p: Partial) -> Tensor:
    """The metric a part's (or merged parts') statistic stands for."""
    return VALUES[type(p)](p)


def merged(parts: list[dict[str, Partial]]) -> dict[str, Partial]:
    """Every key's statistics merged over ``parts`` (dicts with the same keys), in the parts' order."""
    keys = list(parts[0])
    if any(list(p) != keys for p in parts[1:]):
        raise ValueError("the parts of a minibatch gave different statistics")
    out = dict(parts[0])
    for p in parts[1:]:
        out = {k: merge(out[k], p[k]) for k in keys}
    return out


def values(partials: dict[str, Partial]) -> dict[str, Tensor]:
    """Every key's metric (detached)."""
    return {k: value(p).detach() for k, p in partials.items()}


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
