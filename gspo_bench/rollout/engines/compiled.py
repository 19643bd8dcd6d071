"""``compiled``: the fast engine with its decode steps through ``torch.compile`` (``rollout.compiled``), where
that serves the model (dense, no routes recorded); transformers' ``generate`` where the fast engine cannot
sample the model."""

from __future__ import annotations

from gspo_bench.rollout.engines.base import Capabilities, register_engine
from gspo_bench.rollout.engines.fast import FastEngine


@register_engine("compiled")
class CompiledEngine(FastEngine):
    """``engine.fast_generate(compiled=True)``; never picked by ``auto``."""

    capabilities = Capabilities(free_logp=True, records_routes=True, fallback="hf")
    compiled = True
