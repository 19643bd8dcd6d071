"""``compiled``: the fast engine with its decode steps through ``torch.compile`` (``rollout.compiled``), and on a
GPU captured as CUDA graphs, where that serves the model (dense, no routes recorded); transformers'
``generate`` where the fast engine cannot sample the model."""

from __future__ import annotations

from gspo_bench.rollout import compiled as compiled_step
from gspo_bench.rollout.engines.base import Capabilities, register_engine
from gspo_bench.rollout.engines.fast import FastEngine


@register_engine("compiled")
class CompiledEngine(FastEngine):
    """``engine.fast_generate(compiled=True)``. ``auto`` picks it on a GPU for a dense model when vLLM is not
    there: the launch overhead of an eager decode step is what a small model's step costs most there."""

    capabilities = Capabilities(free_logp=True, records_routes=True, whole_parameters=True, fallback="hf", auto_order=1,
                                continues=True)
    compiled = True

    @classmethod
    def prefers(cls, model, device: str | None = None) -> bool:
        on = device or next(model.parameters()).device.type
        return on == "cuda" and compiled_step.supported(model, recording_routes=False)
