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

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SamplerWeights:
    """``sampler(policy)`` -> the model the engine should sample from, in ``dtype``."""

    def __init__(self, dtype: str = "float32"):
        if dtype not in DTYPES:
            raise ValueError(f"rollout dtype {dtype!r} is not allowed (allowed: {', '.join(DTYPES)})")
        self.dtype = DTYPES[dtype]
        self.copy: torch.nn.Module | None = None
        self._source: torch.nn.Module | None = None
        self.refreshes = 0

    @torch.no_grad()
    def __call__(self, policy: torch.nn.Module) -> torch.nn.Module:
        if next(policy.parameters()).dtype == self.dtype:
            return policy
        if self.copy is None or self._source is not policy:
            # one copy for the run: same modules and config, parameters and buffers cast to the sampler dtype
            self.copy = copy.deepcopy(policy).to(self.dtype).eval().requires_grad_(False)
            self._source = policy
        else:
            # refresh: theta_sampler = cast(theta_policy), in place, for every parameter
            for dst, src in zip(self.copy.parameters(), policy.parameters()):
                dst.copy_(src)
        self.refreshes += 1
        return self.copy
