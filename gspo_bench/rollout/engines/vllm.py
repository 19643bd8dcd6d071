"""``vllm``: vLLM's own engine in this process (``rollout.vllm_engine``), fed the policy's weights in place.

The engine is built at the first ``sample``, from the run's model folder (or
a copy of the model saved for it), in ``rollout.dtype``, with room for the
task's longest prompt plus ``max_new_tokens``; every ``sample`` pushes the
policy's weights first when they changed (``time/weight_sync``).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile

from dataclasses import dataclass

from gspo_bench.config import ConfigError
from gspo_bench.models import is_moe
from gspo_bench.rollout import vllm_engine
from gspo_bench.rollout.engines.base import Capabilities, EngineSetup, engine_options, register_engine

VLLM_AUTO_MIN_PARAMS = 10_000_000
"""``engine: auto`` picks vLLM (when installed) for models of at least this many parameters, or any model on a
GPU: below it the fast engine samples faster on a CPU. Measured on 2 cores (``bench --engines``,
results/bench-engines.md): the fast engine 2.4x ahead on tiny-dense (1 M), vLLM 2.1x ahead on small-dense (44 M)
at the same batch, crossing at about 8 M."""


def prefers_vllm(model, device: str | None = None) -> bool:
    """Whether ``auto`` should sample ``model`` with vLLM: it is installed, and the model samples on a GPU
    (``device``; None: where its weights are now) or is at least ``VLLM_AUTO_MIN_PARAMS`` large."""
    if importlib.util.find_spec("vllm") is None:
        return False
    on = device or next(model.parameters()).device.type
    return on == "cuda" or sum(t.numel() for t in model.parameters()) >= VLLM_AUTO_MIN_PARAMS


@dataclass(frozen=True)
class VllmOptions:
    """``rollout.engine_options.vllm``: the vLLM engine's own settings."""

    gpu_memory_utilization: float = 0.3
    """On a GPU: the fraction of its memory vLLM may take (weights, KV cache), beside training."""
    kv_cache_mb: int = 256
    """On a CPU: the KV cache's size in MiB."""
    enforce_eager: bool | None = None
    """true: no CUDA graphs or compilation; null: eager on a CPU (compiling gains nothing there), graphs on a
    GPU."""
    keep: bool = False
    """true: the engine outlives its run, for the command's next run on the same model folder and settings
    (``vllm_engine.lease``), which then skips vLLM's start-up. Off by default: on a CPU the kept engine holds
    memory the next run cannot reuse (gpu-dense at its cut size, grpo then gspo, peaked at 16.7 GB resident with
    it, 12.8-13.2 GB without)."""

    def __post_init__(self):
        where = "rollout.engine_options.vllm"
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ConfigError(f"{where}.gpu_memory_utilization={u!r} must be a number in (0, 1]")
        if isinstance(self.kv_cache_mb, bool) or not isinstance(self.kv_cache_mb, int) or self.kv_cache_mb < 1:
            raise ConfigError(f"{where}.kv_cache_mb={self.kv_cache_mb!r} must be a positive int (MiB)")
        if self.enforce_eager not in (True, False, None):
            raise ConfigError(f"{where}.enforce_eager={self.enforce_eager!r} must be true, false or null")
        if not isinstance(self.keep, bool):
            raise ConfigError(f"{where}.keep={self.keep!r} must be true or false")


@register_engine("vllm")
class VllmRollout:
    """One ``vllm_engine.VllmEngine`` for the run, built at the first ``sample`` (see the module docstring)."""

    name = "vllm"
    Options = VllmOptions
    capabilities = Capabilities(free_logp=True, records_routes=True, needs_model_dir=True, one_process=True,
                                auto_order=0)

    def __init__(self, setup: EngineSetup):
        self.setup = setup
        self.engine = None  # the vllm_engine.VllmEngine, built at the first sample
        self.version = 0  # the version of the weights it was last handed
        self.saved: str | None = None  # the copy of the model saved for it, when the run had no folder

    @classmethod
    def supports(cls, model) -> str | None:
        return None

    @classmethod
    def missing_reason(cls) -> str | None:
        return vllm_engine.missing_reason()

    @classmethod
    def routes_reason(cls) -> str | None:
        return None if vllm_engine.routes_supported() else (
            "vLLM returns the experts it routed each token to on a GPU only")

    @classmethod
    def prefers(cls, model, device: str | None = None) -> bool:
        return prefers_vllm(model, device)

    def build(self, model, tokenizer):
        """The run's vLLM engine, from ``setup.model_dir`` (or a copy of ``model`` saved for it), in
        ``rollout.dtype``, with room for the task's longest prompt plus ``max_new_tokens``."""
        setup, s = self.setup, self.setup.settings
        o = engine_options(self.name, s)
        folder = setup.model_dir
        if folder is None:
            folder = self.saved = tempfile.mkdtemp(prefix="gspo-bench-vllm-")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        cfg, T = model.config, s.max_new_tokens
        context = int(getattr(cfg, "max_position_embeddings", 0) or 4096)
        # the task's own longest prompt, not the model's whole context: vLLM on a CPU refuses a max_model_len
        # whose KV cache outgrows its budget (Qwen3-0.6B's 40,960 positions need 8.75 GiB of it)
        longest = max(map(len, tokenizer(setup.prompts(), add_special_tokens=False)["input_ids"]), default=1)
        prompt_cap = min(setup.max_prompt_tokens or context - T, context - T, longest)
        # the process's kept engine when it was built on this folder with these settings (``keep``), else a new one
        return vllm_engine.lease(
            folder, dtype=s.dtype, max_model_len=prompt_cap + T, seed=setup.seed,
            gpu_memory_utilization=o.gpu_memory_utilization, kv_cache_mb=o.kv_cache_mb,
            # routes where this vLLM returns them (a GPU); on a CPU, moe/routing_mismatch is not logged
            enforce_eager=o.enforce_eager, record_routes=setup.record_routes and vllm_engine.routes_supported(),
            moe_expert_width=getattr(cfg, "moe_intermediate_size", None) if is_moe(model) else None)

    def sample(self, model, tokenizer, prompts, *, max_new_tokens, temperature=1.0, greedy=False,
               return_logp=True, record_routes=False, draws=None):
        """``vllm_engine.vllm_generate``: ``model``'s weights pushed first when they changed; its requests
        seeded from ``draws``."""
        if self.engine is None:
            self.engine = self.build(model, tokenizer)
        return vllm_engine.vllm_generate(self.engine, model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                         temperature=temperature, greedy=greedy, return_logp=return_logp,
                                         record_routes=record_routes, draws=draws)

    def sync_weights(self, state: dict, version: int) -> float:
        """Push ``state`` into vLLM's engine unless it holds those weights already (not built yet: ``sample``
        pushes the model it is handed, which holds them)."""
        self.version = version
        return 0.0 if self.engine is None else self.engine.push(state)

    def take_sync_time(self) -> float | None:
        return None if self.engine is None else self.engine.take_sync_time()

    def close(self) -> None:
        """Release vLLM's engine: kept for the process's next run on the same folder and settings with ``keep``
        (never one built on a copy saved for this run alone), else shut down; and remove that copy."""
        if self.engine is not None:
            keep = engine_options(self.name, self.setup.settings).keep and self.saved is None
            vllm_engine.release(self.engine, keep=keep)
            self.engine = None
        if self.saved:
            shutil.rmtree(self.saved, ignore_errors=True)
            self.saved = None
