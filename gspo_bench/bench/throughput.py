"""``bench``: how fast the harness runs an RL step, against transformers and against the hardware.

In one process, on one model (the ``cpu-bench`` preset: random-weight
tiny-dense, arith, 16 prompts x 8 samples, temperature 1, up to 64 new tokens,
4 minibatches):

(a) rollout generation, the fast engine and plain ``model.generate`` on the
    same model, prompts and batch (median of ``repeats`` after ``warmup``),
    sampling in ``rollout.dtype`` as a run does;
(b) training tokens/s: forward + backward over a rollout, minibatch by
    minibatch, packed and with the transformers module (autocast as
    ``train.precision`` asks);
(c) the full RL step as ``run`` executes it (Lightning loop, rollout, rewards,
    advantages, 4 optimiser steps), fast path and transformers path;
(d) the device's measured matmul FLOP/s and the model FLOP utilisation (MFU)
    of (b) and (c), from an analytic FLOP count (``model_flops``);

plus rollout time against ``max_new_tokens`` (the scaling curve). Medians are
over several repeats after warm-up; nothing here is asserted by a test.

The device is ``train.accelerator``'s (``bench_device``: auto = a CUDA GPU when
one is visible). On CUDA every timed region starts and ends with
``torch.cuda.synchronize()`` (kernels run asynchronously: without it a timer
reads the launches), and MFU is against the GPU's measured bfloat16 matmul
rate (8192^3 products), the tensor-core rate GPU MFU is quoted in; on a CPU
against its measured float32 rate (1024^3), the dtype the CPU presets train
in. Both are measured here rather than taken from a data sheet, so MFU says how
much of what this device really delivers the harness uses.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import lightning as L
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gspo_bench import algorithms
from gspo_bench.algorithms.base import adamw
from gspo_bench.config import ConfigError, RunConfig, deep_merge, load_config
from gspo_bench.models import classify_model_ref
from gspo_bench.rollout import compiled
from gspo_bench.rollout.engine import response_logp
from gspo_bench.rollout.engines import check_engine, generate, resolve_engine
from gspo_bench.rollout.precision import SamplerWeights
from gspo_bench.tasks import load_task
from gspo_bench.train.assembly import assemble
from gspo_bench.train.warmstart import warm_start


@dataclass
class BenchOptions:
    algo: str = "grpo"
    warmup: int = 1
    repeats: int = 3
    rl_steps: int = 5
    """Measured RL steps per path in (c) (after ``warmup`` unmeasured ones)."""
    scaling: tuple[int, ...] = (64, 128, 192, 256)
    paths: tuple[str, ...] = ("fast", "hf")
    profile: bool = False
    """Profile the last measured step of each path with torch.profiler (``BenchResult.profiles``)."""

    def check(self) -> None:
        if self.algo not in algorithms.ALGORITHMS:
            raise ConfigError(f"--algo {self.algo!r} is not an algorithm (allowed: {', '.join(algorithms.names())})")
        if not self.paths or any(p not in ("fast", "hf") for p in self.paths):
            raise ConfigError(f"--paths {','.join(self.paths)!r}: allowed fast, hf")
        if min(self.repeats, self.rl_steps) < 1 or self.warmup < 0 or any(n < 1 for n in self.scaling):
            raise ConfigError("--repeats and --rl-steps must be >= 1, --warmup >= 0, --scaling lengths >= 1")


@dataclass
class BenchResult:
    machine: str
    model: str
    params: int
    active_matmul_params: int
    config: dict
    matmul_gflops: float = 0.0
    matmul_dtype: str = "float32"
    """The dtype of the measured matmul rate MFU is against (``peak_dtype``)."""
    device: str = "cpu"
    """Where it was measured: cpu, or cuda and the GPU's name."""
    generation: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    rl_step: dict = field(default_factory=dict)
    scaling: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    profiles: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def huge_pages_on() -> bool:
    """Whether this process asked torch for transparent huge pages (``THP_MEM_ALLOC_ENABLE``, set by the command
    line: ``cli/pages.py``), which moves transformers' and TRL's step times more than ours."""
    return os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"


def huge_pages_note() -> str:
    """The line a comparison page says it with."""
    if huge_pages_on():
        return "huge pages asked for (THP_MEM_ALLOC_ENABLE=1): the other implementation ran under them too"
    return "no huge pages asked for, so the other implementation ran as its users run it"


# -- the device -----------------------------------------------------------------------------------
def bench_device(accelerator: str) -> torch.device:
    """The device a bench measures on, from ``train.accelerator``: cpu; gpu / cuda (a CUDA GPU, which must be
    visible); auto (a CUDA GPU when one is visible, else the CPU)."""
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if accelerator not in ("auto", "gpu", "cuda"):
        raise ConfigError(f"train.accelerator={accelerator!r}: bench measures on cpu or a CUDA GPU (auto, cpu, gpu)")
    if not torch.cuda.is_available():
        raise ConfigError(f"train.accelerator={accelerator} but torch {torch.__version__} sees no CUDA GPU; "
                          "use train.accelerator=cpu")
    return torch.device("cuda")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device``: CUDA kernels run asynchronously, so a clock read without this
    measures their launches, not their work. A no-op on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    return f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "cpu"


def peak_dtype(device: torch.device) -> torch.dtype:
    """What MFU is measured against: bfloat16 on a GPU (the tensor-core rate GPU MFU is quoted in), float32 on
    a CPU (the dtype the CPU presets train in)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def autocast_for(precision: str, device: torch.device):
    """The autocast Lightning's ``*-mixed`` precisions put around the training step, else nothing."""
    dtypes = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
    if precision in dtypes:
        return torch.autocast(device.type, dtype=dtypes[precision])
    return contextlib.nullcontext()


# -- FLOPs ----------------------------------------------------------------------------------------
def matmul_gflops(n: int | None = None, repeats: int = 20, device: torch.device | str = "cpu") -> float:
    """Measured GFLOP/s of an n x n matmul on ``device`` in ``peak_dtype(device)`` (best of three timings of
    ``repeats`` products after three warm-up ones); n = 8192 on a GPU, 1024 on a CPU by default."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    dtype = peak_dtype(device)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - t0) / repeats)
    # a square matmul is 2 n^3 flops
    return 2 * n**3 / best / 1e9


def active_matmul_params(model) -> int:
    """Weights one token multiplies: linear layers and the LM head, routed experts scaled by top_k / E."""
    cfg = model.config
    n_exp = getattr(cfg, "num_experts", 0) or 0
    top_k = getattr(cfg, "num_experts_per_tok", 0) or 0
    total = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Embedding):
            continue
        for p in mod.parameters(recurse=False):
            if p.ndim == 3 and n_exp:  # stacked expert weights (E, out, in)
                total += p.numel() * top_k // n_exp
            elif p.ndim >= 2:
                total += p.numel()
    return total


def model_flops(model, tokens: float, context: float) -> float:
    """Forward FLOPs of ``tokens`` tokens attending to ``context`` keys on average.

    2 * active weights per token, plus QK^T and PV: 4 * layers * heads * head_dim * context.
    """
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * context
    return tokens * (2 * active_matmul_params(model) + attn)


def median_time(fn, warmup: int, repeats: int, device: torch.device = torch.device("cpu")) -> tuple[float, list]:
    """Median wall seconds of ``repeats`` calls of fn after ``warmup`` unmeasured ones, and their outputs; each
    timed call is fenced by ``synchronize(device)``."""
    outs = []
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        outs.append(fn())
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), outs


# -- (a) generation ---------------------------------------------------------------------------------
def bench_generation(model, tok, prompts: list[str], max_new_tokens: int, temperature: float, engines, warmup,
                     repeats, moe_kernel: str = "auto") -> dict:
    """Per engine: seconds, tokens/s and completions/s of one rollout batch, on the model's device.
    ``moe_kernel``: the fast engine's (``rollout.moe_kernel``)."""
    out = {}
    device = next(model.parameters()).device
    for engine in engines:
        torch.manual_seed(0)
        compiling = compiled.compile_seconds()["compile_s"]
        sec, gens = median_time(lambda: generate(engine, model, tok, prompts, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, moe_kernel=moe_kernel),
                                warmup, repeats, device)
        tokens = statistics.median(float(g.response_mask.sum()) for g in gens)
        out[engine] = {"seconds": sec, "tokens": tokens, "tokens_per_s": tokens / sec,
                       "completions_per_s": len(prompts) / sec}
        if engine == "compiled":  # the first call of each batch bucket compiled its graph (in the warm-up)
            out[engine]["compile_s"] = compiled.compile_seconds()["compile_s"] - compiling
    if "fast" in out and "hf" in out:
        out["speedup"] = out["hf"]["seconds"] / out["fast"]["seconds"]
    if "compiled" in out and "hf" in out:
        out["compiled_speedup"] = out["hf"]["seconds"] / out["compiled"]["seconds"]
    return out


# -- (b) training -----------------------------------------------------------------------------------
def bench_training(model, gen, minibatches: int, forwards, warmup: int, repeats: int, peak_gflops: float,
                   precision: str = "32-true", moe_kernel: str = "auto") -> dict:
    """Forward + backward + AdamW step per minibatch over one rollout, as the modules run it (on a copy, on the
    model's device, autocast as ``precision`` (``train.precision``) asks; MoE experts by ``moe_kernel``)."""
    model = copy.deepcopy(model)
    device = next(model.parameters()).device
    out = {}
    ids, attn, P = gen.input_ids.clone(), gen.attention_mask.clone(), gen.prompt_len
    mask = gen.response_mask.clone()
    tokens = float(attn.sum())
    context = float(attn.sum(-1).float().pow(2).sum() / 2 / attn.sum())  # mean keys per token, causal
    flops = 3 * model_flops(model, tokens, context)  # backward ~ 2x forward
    model.train()
    for fwd in forwards:
        opt = adamw(model.parameters(), lr=1e-6)

        def step():
            for idx in torch.arange(len(ids), device=device).chunk(minibatches):
                with autocast_for(precision, device):
                    logp, _ = response_logp(model, ids[idx], attn[idx], P, with_entropy=True, forward=fwd,
                                            share_prompts=True, moe_kernel=moe_kernel)
                    (logp * mask[idx]).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        sec, _ = median_time(step, warmup, repeats, device)
        out[fwd] = {"seconds": sec, "tokens": tokens, "tokens_per_s": tokens / sec,
                    "padded_tokens": float(attn.numel()), "mfu": flops / sec / (peak_gflops * 1e9)}
    model.eval()
    if "packed" in out and "hf" in out:
        out["speedup"] = out["hf"]["seconds"] / out["packed"]["seconds"]
    return out


# -- (c) the full RL step ---------------------------------------------------------------------------
class _StepClock(L.Callback):
    """Wall time of every RL step: rollout (the dataloader's fetch) + training step + callbacks.

    With ``profile_step`` set, ``torch.profiler`` records that step (from the end of the one before). On a GPU
    each clock read waits for the device's queued work first (``synchronize``).
    """

    def __init__(self, profile_step: int | None = None, device: torch.device = torch.device("cpu")):
        self.ends: list[float] = []
        self.rows: list[dict] = []
        self.profile_step, self.prof = profile_step, None
        self.device = device

    def on_train_epoch_start(self, trainer, pl_module):
        if self.profile_step == 0:
            self._start_profiler()
        synchronize(self.device)
        self.ends = [time.perf_counter()]

    def _start_profiler(self):
        kinds = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            kinds.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=kinds)
        self.prof.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        synchronize(self.device)
        self.ends.append(time.perf_counter())
        step = len(self.ends) - 2  # the step that just ended
        if self.prof is not None and step == self.profile_step:
            self.prof.stop()
        if self.profile_step is not None and step + 1 == self.profile_step:
            self._start_profiler()
        m = pl_module.last_metrics
        self.rows.append({"completions": len(batch), "tokens": float(batch.response_mask.sum()),
                          "gen_s": m.get("time/gen_s", 0.0), "train_s": m.get("time/train_s", 0.0),
                          "context": float(batch.attention_mask.sum(-1).float().pow(2).sum() / 2
                                           / batch.attention_mask.sum()),
                          "train_tokens": float(batch.attention_mask.sum()),
                          "prompt_tokens": float(batch.attention_mask[:, :batch.prompt_len].sum())})


def path_overrides(path: str) -> dict:
    """``fast``: own engine, packed training forward, engine log-probs; ``hf``: transformers throughout."""
    if path == "fast":
        return {"rollout": {"engine": "auto", "old_logp_source": "rollout"}, "train": {"forward": "auto"}}
    return {"rollout": {"engine": "hf", "old_logp_source": "recompute"}, "train": {"forward": "hf"}}


def bench_rl_step(cfg: RunConfig, algo: str, ws_path: str, task, warmup: int, steps: int, peak_gflops: float,
                  model_for_flops, profile: list | None = None) -> dict:
    """The full RL step on ``bench_device(train.accelerator)`` in ``train.precision``; with ``profile`` (a list),
    the profiler's op table of the last step is appended to it."""
    device = bench_device(cfg.train.accelerator)
    clock = _StepClock(warmup + steps - 1 if profile is not None else None, device)
    trainer = L.Trainer(max_epochs=1, logger=False, callbacks=[clock], devices=1, precision=cfg.train.precision,
                        accelerator="gpu" if device.type == "cuda" else "cpu", limit_val_batches=0,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False)
    # the held-out eval is not part of an RL step
    run = assemble(cfg, algo, task, ws_path, 0, lambda module: trainer, steps=warmup + steps, evaluate=False,
                   eval_samples=0)
    trainer.fit(run.module, datamodule=run.datamodule)
    if clock.prof is not None:
        profile.append(clock.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    walls = [b - a for a, b in zip(clock.ends, clock.ends[1:])][warmup:]
    rows = clock.rows[warmup:]
    sec = statistics.median(walls)
    comp = statistics.median(r["completions"] for r in rows)
    toks = statistics.median(r["tokens"] for r in rows)
    flops = statistics.median(
        model_flops(model_for_flops, r["prompt_tokens"] + r["tokens"], r["context"])  # generation
        + 3 * model_flops(model_for_flops, r["train_tokens"], r["context"]) for r in rows)  # training
    return {"seconds": sec, "completions_per_s": comp / sec, "gen_tokens_per_s": toks / sec,
            "gen_s": statistics.median(r["gen_s"] for r in rows),
            "train_s": statistics.median(r["train_s"] for r in rows),
            "other_s": sec - statistics.median(r["gen_s"] for r in rows) - statistics.median(r["train_s"] for r in rows),
            "completions": comp, "gen_tokens": toks, "steps": len(walls), "mfu": flops / sec / (peak_gflops * 1e9),
            "engine": resolve_engine(run.module.settings.rollout.engine, run.module.policy),
            "old_logp_source": cfg.rollout.old_logp_source, "forward": cfg.train.forward}


# -- scaling ------------------------------------------------------------------------------------------
def bench_scaling(model, tok, prompts, lengths, temperature, engine: str, warmup: int, repeats: int,
                  moe_kernel: str = "auto") -> list:
    rows = []
    device = next(model.parameters()).device
    for n in lengths:
        torch.manual_seed(0)
        sec, gens = median_time(lambda: generate(engine, model, tok, prompts, max_new_tokens=n,
                                                 temperature=temperature, moe_kernel=moe_kernel),
                                warmup, repeats, device)
        tokens = statistics.median(float(g.response_mask.sum()) for g in gens)
        rows.append({"max_new_tokens": n, "engine": resolve_engine(engine, model), "seconds": sec, "tokens": tokens,
                     "tokens_per_s": tokens / sec, "seconds_per_1k_tokens": 1000 * sec / tokens})
    return rows


@dataclass
class BenchInputs:
    """What every measurement starts from: the task, the warm start (or the random built-in), the model and
    tokenizer loaded from it in float32 on ``bench_device(train.accelerator)``, the sampler (the model in
    ``rollout.dtype``, as a run samples with), the length cap, and one step's prompts (``prompts_per_step`` rows
    drawn with seed 0, each repeated ``group_size`` times)."""

    task: object
    warm_start: object
    model: object
    tokenizer: object
    max_new_tokens: int
    prompts: list
    sampler: object = None
    device: torch.device = torch.device("cpu")


def check_measurable(cfg: RunConfig) -> RunConfig:
    """``cfg`` when a measurement can start from it: its engine runs here and its model is found (a built-in, a
    local directory or a hub id in the local cache); otherwise a ConfigError, one line, before any work."""
    check_engine(cfg)
    try:
        classify_model_ref(cfg.model.name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


def bench_inputs(cfg: RunConfig, log=print) -> BenchInputs:
    device = bench_device(cfg.train.accelerator)
    task = load_task(cfg.task, cfg.seeds[0], cfg.model, cfg.rollout.response_cap(), log, cfg.task_options)
    ws = warm_start(task, cfg.model, cfg.warmstart, cfg.seeds[0], task.spec.max_new_tokens, progress=False, log=log)
    model = AutoModelForCausalLM.from_pretrained(ws.path, dtype=torch.float32).to(device).eval()
    tok = AutoTokenizer.from_pretrained(ws.path)
    r = cfg.rollout
    max_new = task.spec.max_new_tokens if r.max_new_tokens == "auto" else r.max_new_tokens
    g = torch.Generator().manual_seed(0)
    rows = task.train.select(torch.randint(len(task.train), (r.prompts_per_step,), generator=g).tolist())
    prompts = [p for p in list(rows["prompt"]) for _ in range(r.group_size)]
    return BenchInputs(task, ws, model, tok, max_new, prompts, SamplerWeights(r.dtype)(model), device)


def run_bench(preset: str, config_files: tuple = (), overrides: dict | None = None,
              opts: BenchOptions | None = None, log=print) -> BenchResult:
    """Everything above for one preset (``cpu-bench`` by default on the command line)."""
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.tracking.provenance import machine

    opts = opts or BenchOptions()
    opts.check()

    def cfg_for(path: str | None) -> RunConfig:
        over = deep_merge(overrides or {}, path_overrides(path)) if path else (overrides or {})
        return load_config(preset, tuple(config_files), over)

    cfg = check_measurable(cfg_for(None))
    quiet()
    bench = bench_inputs(cfg, log)
    task, ws, model, tok, max_new, prompts = (bench.task, bench.warm_start, bench.model, bench.tokenizer,
                                              bench.max_new_tokens, bench.prompts)
    r = cfg.rollout
    res = BenchResult(machine(), cfg.model.name, sum(p.numel() for p in model.parameters()),
                      active_matmul_params(model),
                      {"task": cfg.task, "prompts": r.prompts_per_step, "group_size": r.group_size,
                       "max_new_tokens": max_new, "temperature": r.temperature,
                       "minibatches": cfg.train.minibatches, "algo": opts.algo, "threads": torch.get_num_threads(),
                       "dtype": r.dtype, "precision": cfg.train.precision, "moe_kernel": r.moe_kernel})
    # the reference point (tables.REFERENCE) was measured on exactly this configuration
    res.config["reference_comparable"] = (cfg.model.name == "tiny-dense" and not cfg.warmstart.enabled
                                          and (r.prompts_per_step, r.group_size, max_new, r.temperature,
                                               cfg.train.minibatches) == (16, 8, 64, 1.0, 4))
    device, sampler = bench.device, bench.sampler
    res.device, res.matmul_dtype = device_name(device), str(peak_dtype(device)).removeprefix("torch.")
    res.matmul_gflops = matmul_gflops(device=device)
    log(f"matmul: {res.matmul_gflops:.0f} GFLOP/s {res.matmul_dtype} on {res.device} "
        f"({torch.get_num_threads()} CPU threads)")
    engines = ["fast" if p == "fast" else "hf" for p in opts.paths]
    if "fast" in engines and resolve_engine("auto", model) == "fast" and compiled.supported(model, False):
        engines.insert(engines.index("fast") + 1, "compiled")  # (a) also times the compiled decode step
    if "fast" in engines and resolve_engine("auto", model) != "fast":
        res.notes.append("the fast engine does not support this model; its rows use transformers")
    res.notes.append(huge_pages_note())
    res.generation = bench_generation(sampler, tok, prompts, max_new, r.temperature,
                                      [resolve_engine("auto", model) if e == "fast" else e for e in engines],
                                      opts.warmup, opts.repeats, r.moe_kernel)
    log("generation: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s" for k, v in res.generation.items()
                                   if isinstance(v, dict)))
    torch.manual_seed(0)
    gen = generate("auto", model, tok, prompts, max_new_tokens=max_new, temperature=r.temperature)
    forwards = ["packed" if p == "fast" else "hf" for p in opts.paths]
    forwards = ["auto" if f == "packed" and resolve_engine("auto", model) != "fast" else f for f in forwards]
    res.training = bench_training(model, gen, cfg.train.minibatches, forwards, opts.warmup, opts.repeats,
                                  res.matmul_gflops, cfg.train.precision, r.moe_kernel)
    log("training: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s" for k, v in res.training.items()
                                 if isinstance(v, dict)))
    for path in opts.paths:
        prof: list | None = [] if opts.profile else None
        res.rl_step[path] = bench_rl_step(cfg_for(path), opts.algo, str(ws.path), task, opts.warmup, opts.rl_steps,
                                          res.matmul_gflops, model, prof)
        if prof:
            res.profiles[path] = prof[0]
        log(f"rl step ({path}): {res.rl_step[path]['completions_per_s']:.0f} completions/s")
    if "fast" in res.rl_step and "hf" in res.rl_step:
        res.rl_step["speedup"] = res.rl_step["fast"]["completions_per_s"] / res.rl_step["hf"]["completions_per_s"]
    if opts.scaling:
        res.scaling = bench_scaling(sampler, tok, prompts, opts.scaling, r.temperature, "auto", opts.warmup,
                                    opts.repeats, r.moe_kernel)
        log("scaling: " + ", ".join(f"{s['max_new_tokens']}: {s['seconds']:.2f}s" for s in res.scaling))
    return res
