"""``bench --engines``: the rollout engines side by side, in one process, on the same model and batch.

The engines are the registry's (``rollout.engines``); each is checked for
this environment (``missing_reason``) before any work, and one that does not
support a model (``supports``) is skipped with a note. For each model (a
built-in, random weights, no warm start):

- generation: every engine asked for samples the same prompts (the preset's
  ``prompts_per_step`` x ``group_size``, temperature, length cap), median of
  ``repeats`` after ``warmup`` calls: tokens/s and completions/s. ``compiled``
  reports the seconds its decode graphs took to compile (in the warm-up);
  ``vllm`` its engine's start-up seconds and the median seconds of a weight
  push (the policy perturbed in place, then pushed, ``repeats`` times);
- with ``--moe-kernels``, on a MoE model: the fast engine with its experts
  run by each kernel named (``rollout.moe_kernel``), in rounds that take the
  kernels in turn (one rollout each), so that a slow spell of a shared
  machine falls on every kernel alike: median, fastest and slowest seconds;
- the full RL step (``--algo``, default grpo) with ``rollout.engine: vllm``
  against ``fast``, as ``bench`` (c) measures it, where ``--rl-steps`` > 0.

vLLM keeps one engine per process alive at a time, so each is shut down
before the next model's.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import torch

from gspo_bench import tables
from gspo_bench.config import ConfigError
from gspo_bench.rollout.engines import ENGINES, VLLM_AUTO_MIN_PARAMS, engine_names, generate


@dataclass
class EnginesResult:
    machine: str
    model: str
    params: int
    config: dict
    generation: dict = field(default_factory=dict)
    rl_step: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def check_engines(engines: tuple[str, ...]) -> None:
    """Every name a registered engine that runs here (ConfigError: the CLI's exit 2)."""
    bad = [e for e in engines if e not in ENGINES]
    if not engines or bad:
        raise ConfigError(f"--engines {','.join(engines)!r}: allowed {', '.join(engine_names())}")
    for e in engines:
        reason = ENGINES[e].missing_reason()
        if reason:
            raise ConfigError(reason)


def bench_vllm(model, tok, prompts, max_new_tokens: int, temperature: float, warmup: int, repeats: int,
               dtype: str) -> dict:
    """vLLM's generation, start-up and weight-push seconds (its engine built from a saved copy of ``model``)."""
    import tempfile

    from gspo_bench.bench.throughput import median_time
    from gspo_bench.models import is_moe
    from gspo_bench.rollout.vllm_engine import VllmEngine, vllm_generate

    with tempfile.TemporaryDirectory(prefix="gspo-bench-engines-") as folder:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        width = getattr(model.config, "moe_intermediate_size", None) if is_moe(model) else None
        # this batch's longest prompt and length cap, not the model's whole context, whose KV cache can outgrow
        # vLLM's budget on a CPU (qwen3-0.6b-arch's 40,960 positions)
        longest = max(map(len, tok(prompts, add_special_tokens=False)["input_ids"]), default=1)
        engine = VllmEngine(folder, dtype=dtype, max_model_len=min(model.config.max_position_embeddings,
                                                                   longest + max_new_tokens), seed=0,
                            moe_expert_width=width)
    try:
        torch.manual_seed(0)
        sec, gens = median_time(lambda: vllm_generate(engine, model, tok, prompts, max_new_tokens=max_new_tokens,
                                                      temperature=temperature), warmup, repeats,
                                next(model.parameters()).device)
        pushes = []
        weight = next(model.parameters())
        for _ in range(repeats):
            with torch.no_grad():
                weight.mul_(1.0)  # an in-place write: the engine must take the weights again
            pushes.append(engine.push(model))
        tokens = statistics.median(float(g.response_mask.sum()) for g in gens)
        return {"seconds": sec, "tokens": tokens, "tokens_per_s": tokens / sec,
                "completions_per_s": len(prompts) / sec, "startup_s": engine.startup_s,
                "weight_sync_s": statistics.median(pushes)}
    finally:
        engine.close()


def bench_engines_generation(model, tok, prompts, max_new_tokens: int, temperature: float, engines, warmup: int,
                             repeats: int, dtype: str = "float32", moe_kernel: str = "auto",
                             sampler=None) -> tuple[dict, list[str]]:
    """Per engine: seconds, tokens/s, completions/s (and compile / start-up / sync seconds); and notes.

    The engines of this package sample from ``sampler`` (the model cast to ``dtype``; default the model itself),
    their MoE experts run by ``moe_kernel``; vLLM builds its own engine in ``dtype`` from a saved copy."""
    from gspo_bench.bench.throughput import bench_generation
    from gspo_bench.rollout import compiled

    out, notes = {}, []
    own = []
    for e in engines:
        if ENGINES[e].capabilities.needs_model_dir:  # vLLM: its own engine, measured below
            continue
        reason = ENGINES[e].supports(model)
        if reason is not None:
            notes.append(f"{e}: does not support this model ({reason}); skipped")
        elif e == "compiled" and not compiled.supported(model, False):
            notes.append("compiled: not for this model (MoE and route recording decode eagerly); skipped")
        else:
            own.append(e)
    if own:
        gen = bench_generation(model if sampler is None else sampler, tok, prompts, max_new_tokens, temperature,
                               own, warmup, repeats, moe_kernel)
        out.update({k: v for k, v in gen.items() if isinstance(v, dict)})
    if "vllm" in engines:
        out["vllm"] = bench_vllm(model, tok, prompts, max_new_tokens, temperature, warmup, repeats, dtype)
    if "vllm" in out and "fast" in out:
        out["fast_over_vllm"] = out["fast"]["tokens_per_s"] / out["vllm"]["tokens_per_s"]
    return out, notes


def experts_kernel(model, kernel: str, device: torch.device, dtype: str) -> str | None:
    """The kernel a MoE model's experts run by when sampling in ``dtype`` on ``device`` (``auto`` resolved as
    the engines resolve it); None for a dense model."""
    from gspo_bench.models.builtin import is_moe
    from gspo_bench.rollout.fastlm import resolve_moe_kernel

    if not is_moe(model):
        return None
    c = model.config
    width = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    return resolve_moe_kernel(kernel, torch.empty(0, device=device, dtype=getattr(torch, dtype)), c.hidden_size, width)


def bench_moe_kernels(model, tok, prompts, max_new_tokens: int, temperature: float, kernels, warmup: int,
                      repeats: int, device: torch.device, dtype: str) -> dict:
    """The fast engine's rollout with the experts run by each of ``kernels``: ``warmup`` unmeasured rollouts per
    kernel, then ``repeats`` rounds of one timed rollout per kernel, in turn. Per kernel (the name asked):
    the kernel it resolved to, median / fastest / slowest seconds, tokens (median) and tokens/s at the median."""
    from gspo_bench.bench.throughput import median_time

    def once(kernel):
        torch.manual_seed(0)
        return generate("fast", model, tok, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                        moe_kernel=kernel)

    for k in kernels:
        for _ in range(warmup):
            once(k)
    times, tokens = {k: [] for k in kernels}, {k: [] for k in kernels}
    for _ in range(repeats):
        for k in kernels:
            sec, [gen] = median_time(lambda: once(k), 0, 1, device)
            times[k].append(sec)
            tokens[k].append(float(gen.response_mask.sum()))
    out = {}
    for k in kernels:
        sec, n = statistics.median(times[k]), statistics.median(tokens[k])
        out[k] = {"runs_by": experts_kernel(model, k, device, dtype), "seconds": sec, "min_s": min(times[k]),
                  "max_s": max(times[k]), "tokens": n, "tokens_per_s": n / sec, "repeats": repeats}
    return out


def run_engines_bench(preset: str, config_files: tuple, overrides: dict, engines: tuple[str, ...], algo: str,
                      warmup: int, repeats: int, rl_steps: int, log=print,
                      moe_kernels: tuple[str, ...] = ()) -> EnginesResult:
    """The engines of ``engines`` on the preset's model and batch (see the module docstring)."""
    from gspo_bench.bench.throughput import (bench_inputs, bench_rl_step, device_name, huge_pages_note, matmul_gflops,
                                             path_overrides)
    from gspo_bench.config import deep_merge, load_config
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.tracking.provenance import machine

    check_engines(engines)
    cfg = load_config(preset, tuple(config_files), overrides)
    quiet()
    bench = bench_inputs(cfg, log)
    task, ws, model, tok, max_new, prompts = (bench.task, bench.warm_start, bench.model, bench.tokenizer,
                                              bench.max_new_tokens, bench.prompts)
    r = cfg.rollout
    res = EnginesResult(machine(), cfg.model.name, sum(p.numel() for p in model.parameters()),
                        {"task": cfg.task, "prompts": r.prompts_per_step, "group_size": r.group_size,
                         "max_new_tokens": max_new, "temperature": r.temperature, "dtype": r.dtype, "algo": algo,
                         "threads": torch.get_num_threads(), "moe_kernel": r.moe_kernel,
                         "experts_by": experts_kernel(model, r.moe_kernel, bench.device, r.dtype),
                         "device": device_name(bench.device)})
    res.generation, res.notes = bench_engines_generation(model, tok, prompts, max_new, r.temperature, engines,
                                                         warmup, repeats, r.dtype, r.moe_kernel, bench.sampler)
    log("generation: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s" for k, v in res.generation.items()
                                   if isinstance(v, dict)))
    res.notes.append(huge_pages_note())
    if moe_kernels and res.config["experts_by"] is None:
        res.notes.append("--moe-kernels: a dense model has no experts; not measured")
    elif moe_kernels:
        res.kernels = bench_moe_kernels(model if bench.sampler is None else bench.sampler, tok, prompts, max_new,
                                        r.temperature, moe_kernels, warmup, repeats, bench.device, r.dtype)
        log("experts: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s" for k, v in res.kernels.items()))
    if rl_steps > 0:
        peak = matmul_gflops(device=bench.device)
        for path in [e for e in ("fast", "vllm") if e in engines]:
            over = deep_merge(overrides or {}, path_overrides("fast"))
            if path == "vllm":
                over = deep_merge(over, {"rollout": {"engine": "vllm"}})
            res.rl_step[path] = bench_rl_step(load_config(preset, tuple(config_files), over), algo, str(ws.path),
                                              task, warmup, rl_steps, peak, model)
            log(f"rl step ({path}): {res.rl_step[path]['completions_per_s']:.1f} completions/s")
        if "fast" in res.rl_step and "vllm" in res.rl_step:  # > 1: the step is faster with the fast engine
            res.rl_step["fast_over_vllm"] = res.rl_step["vllm"]["seconds"] / res.rl_step["fast"]["seconds"]
    return res


def crossover_params(results: list[dict]) -> float | None:
    """The parameter count where vLLM and the fast engine sample equally fast, interpolated log-linearly between
    the two measured dense models that bracket it (None when no pair does)."""
    import math

    pts = sorted((r["params"], r["generation"]["fast_over_vllm"]) for r in results
                 if "fast_over_vllm" in r["generation"] and "moe" not in r["model"])
    for (n0, s0), (n1, s1) in zip(pts, pts[1:]):
        if s0 >= 1 > s1:  # the fast engine ahead at n0, vLLM ahead at n1
            t = math.log(s0) / (math.log(s0) - math.log(s1))
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return None


def markdown(results: list[dict], command: str, commit: str) -> str:
    """The tables of ``bench --engines``: generation per model and engine, vLLM's start-up and sync, the full
    RL step, and the crossover."""
    lines = ["# Rollout engines side by side", "",
             f"Made by `{command}` at commit `{commit}`, on {results[0]['machine']}. Random-weight built-in models, "
             "no warm start; median of the measured repeats; one process, alone on the machine.", ""]
    for r in results:
        c = r["config"]
        lines += [f"## {r['model']} ({r['params'] / 1e6:.1f} M parameters)", "",
                  f"{c['prompts']} prompts x {c['group_size']} samples, at most {c['max_new_tokens']} new tokens, "
                  f"temperature {c['temperature']}, {c['dtype']}, {c['threads']} threads"
                  + (f"; the experts run by `{c['experts_by']}` (`rollout.moe_kernel: {c['moe_kernel']}`)"
                     if c.get("experts_by") else "") + ".", ""]
        rows = []
        for name, g in r["generation"].items():
            if isinstance(g, dict):
                setup, sync = g.get("compile_s", g.get("startup_s")), g.get("weight_sync_s")
                rows.append([name, f"{g['seconds']:.3f}", f"{g['tokens']:.0f}", f"{g['tokens_per_s']:.0f}",
                             f"{g['completions_per_s']:.1f}", "" if setup is None else f"{setup:.1f}",
                             "" if sync is None else f"{sync:.3f}"])
        lines.append(tables.markdown(("engine", "seconds", "tokens", "tokens/s", "completions/s",
                                      "compile / start-up s", "weight sync s"), rows).rstrip("\n"))
        if r.get("kernels"):
            ks = r["kernels"]
            lines += ["", f"The fast engine with the experts run by each kernel: {next(iter(ks.values()))['repeats']} "
                      "rounds, each a rollout per kernel in turn; median seconds, with the fastest and slowest "
                      "round:", "", tables.markdown(
                          ("rollout.moe_kernel", "experts run by", "seconds", "fastest", "slowest", "tokens",
                           "tokens/s"),
                          [[k, v["runs_by"], f"{v['seconds']:.3f}", f"{v['min_s']:.3f}", f"{v['max_s']:.3f}",
                            f"{v['tokens']:.0f}", f"{v['tokens_per_s']:.0f}"] for k, v in ks.items()]).rstrip("\n")]
        if "fast_over_vllm" in r["generation"]:
            ratio = r["generation"]["fast_over_vllm"]
            lines += ["", f"Fast engine over vLLM: **{ratio:.2f}x** tokens/s "
                      f"({'ours ahead' if ratio > 1 else 'vLLM ahead'})."]
        if r["rl_step"]:
            lines += ["", f"Full RL step ({c['algo']}):", "", tables.markdown(
                ("engine", "seconds", "completions/s", "gen s", "train s"),
                [[name, f"{s['seconds']:.2f}", f"{s['completions_per_s']:.1f}", f"{s['gen_s']:.2f}", f"{s['train_s']:.2f}"]
                 for name, s in r["rl_step"].items() if isinstance(s, dict)]).rstrip("\n")]
            if "fast_over_vllm" in r["rl_step"]:
                lines += ["", f"The RL step is {r['rl_step']['fast_over_vllm']:.2f}x as fast with the fast engine."]
        for note in r["notes"]:
            lines.append(f"\n- {note}")
        lines.append("")
    cross = crossover_params(results)
    if cross is not None:
        lines += ["## Crossover", "",
                  f"vLLM overtakes the fast engine at about **{cross / 1e6:.0f} M parameters** (dense, log-linear "
                  "between the two measured models that bracket it). `engine: auto` picks vLLM, when it is "
                  f"installed, for models from {VLLM_AUTO_MIN_PARAMS / 1e6:.0f} M parameters and for any model on a "
                  "GPU.", ""]
    return "\n".join(lines)
