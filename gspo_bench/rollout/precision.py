"""The weights the rollout engine samples with (``rollout.dtype``).

Production trainers sample with an inference engine that holds a
low-precision copy of the policy (bf16 in most), refreshed after each update,
while the optimiser keeps float32 weights. ``SamplerWeights`` reproduces that:
in the policy's own dtype it is the policy itself (no copy); in another dtype
it is one persistent copy whose parameters are overwritten with a cast of the
policy's at the start of every rollout, i.e. after the last optimiser step, so
the sampler is never stale (``refreshes`` counts the refreshes; a test checks
the copy equals the cast policy after an update). Evaluation scores the
policy itself, so eval pass@1 measures the trained weights, not the sampler's
rounding.
"""

from __future__ import annotations

import copy
from collections import deque

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SamplerWeights:
    """``sampler(policy)`` -> the model the engine should sample from, in ``dtype``, ``staleness`` rollouts old.

    ``staleness = k > 0`` (``rollout.staleness``) samples from the policy as it
    was ``k`` rollouts ago, as an asynchronous trainer's inference engine
    does: a queue keeps the last ``k + 1`` casts of the policy (so ``k + 1``
    extra copies of the weights), and the sampler loads the oldest. The first
    ``k`` rollouts use the oldest policy there is (the warm start).
    """

    def __init__(self, dtype: str = "float32", staleness: int = 0):
        if dtype not in DTYPES:
            raise ValueError(f"rollout dtype {dtype!r} is not allowed (allowed: {', '.join(DTYPES)})")
        if not (isinstance(staleness, int) and staleness >= 0):
            raise ValueError(f"rollout staleness must be an int >= 0, got {staleness!r}")
        self.dtype = DTYPES[dtype]
        self.staleness = staleness
        self.copy: torch.nn.Module | None = None
        self._source: torch.nn.Module | None = None
        self._queue: deque[list[torch.Tensor]] = deque()
        self._pending: list[list[torch.Tensor]] = []
        self.refreshes = 0

    def state_dict(self) -> dict:
        """The queue of past policies (``staleness > 0``), on CPU: what a resumed run samples from next."""
        return {"queue": [[t.cpu() for t in q] for q in self._queue], "refreshes": self.refreshes}

    def load_state_dict(self, state: dict) -> None:
        self._pending, self.refreshes = [list(q) for q in state["queue"]], int(state["refreshes"])
        self.copy = None  # the next call makes the copy and takes the queue

    @torch.no_grad()
    def __call__(self, policy: torch.nn.Module) -> torch.nn.Module:
        if next(policy.parameters()).dtype == self.dtype and self.staleness == 0:
            return policy
        if self.copy is None or self._source is not policy:
            # one copy for the run: same modules and config, parameters and buffers cast to the sampler dtype
            self.copy = copy.deepcopy(policy).to(self.dtype).eval().requires_grad_(False)
            # a resumed run's queue comes from its checkpoint (load_state_dict), on the policy's device
            self._source, self._queue = policy, deque([[t.to(p.device) for t, p in zip(q, policy.parameters())]
                                                       for q in self._pending])
            self._pending = []
        if self.staleness == 0:
            source = list(policy.parameters())
        else:
            # queue of the last k + 1 casts; the sampler is the oldest, theta_sampler(t) = cast(theta(t - k))
            self._queue.append([p.detach().to(self.dtype, copy=True) for p in policy.parameters()])
            while len(self._queue) > self.staleness + 1:
                self._queue.popleft()
            source = self._queue[0]
        # refresh: theta_sampler = cast(source), in place, for every parameter
        for dst, src in zip(self.copy.parameters(), source):
            dst.copy_(src)
        self.refreshes += 1
        return self.copy
