"""``bench --vs trl``: the full RL step of this harness against TRL's ``GRPOTrainer``, side by side.

One process measures TRL, ours, TRL again (a drift of the machine shows as a gap between the TRL runs),
each ``warmup`` unmeasured cycles, then ``cycles`` measured ones. A cycle is one RL step: a rollout of
``prompts x group_size`` completions, rewards, advantages, ``minibatches`` optimiser steps. Ours is
``bench.bench_rl_step`` on the fast path; TRL's is ``GRPOTrainer`` with ``grpo_config_kwargs``, on the
same checkpoint, prompts and verifier (docs/bench-vs-trl.md). ``trl`` is the ``compare`` extra.
"""

from __future__ import annotations

import json
import shlex
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from rich.table import Table
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, ProgressCallback, TrainerCallback

from gspo_bench import tables
from gspo_bench import algorithms
from gspo_bench.bench.throughput import (bench_device, bench_rl_step, check_measurable, huge_pages_on, matmul_gflops,
                                         path_overrides)
from gspo_bench.config import ConfigError, RunConfig, deep_merge, load_config, parse_sets
from gspo_bench.tracking.runs import quiet
from gspo_bench.tracking.provenance import git_commit, machine
from gspo_bench.tasks import load_task
from gspo_bench.train.warmstart import warm_start

EXTRA = "pip install 'gspo-bench[compare]'"
TARGET = 4.0  # the bar we set: ours / TRL, generated tokens/s of the full step, against every TRL run


# -- pure helpers ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Matched:
    """The settings both sides run with, read from our resolved config."""

    prompts: int
    group_size: int
    max_new_tokens: int
    temperature: float
    minibatches: int
    lr: float
    weight_decay: float
    max_grad_norm: float
    eps_low: float
    eps_high: float
    scale_rewards: str
    verify_timeout: float
    seed: int

    @property
    def completions(self) -> int:
        # one rollout: every prompt sampled group_size times
        return self.prompts * self.group_size


def matched(cfg: RunConfig, algo: str, task_max_new_tokens: int) -> Matched:
    """Our resolved ``algo`` settings as the two sides share them; what TRL cannot express is a ConfigError."""
    if algo != "grpo":
        raise ConfigError(f"--vs trl compares grpo only (TRL's GRPOTrainer), not --algo {algo!r}")
    s = cfg.resolve(algo, algorithms.get(algo).recipe, task_max_new_tokens)
    r = s.rollout
    if (s.loss.eps_low is None or s.loss.kl_coef or r.dynamic_sampling or r.overlong_buffer or r.staleness
            or r.advantage_baseline != "group_mean" or r.advantage_estimator != "group"):
        raise ConfigError("--vs trl: eps_low null, KL, dynamic sampling, overlong shaping, staleness, a leave-one-out "
                          "baseline, an advantage estimator other than group: not matched")
    if cfg.train.lr_schedule != "constant":
        # TRL's scheduler steps once per optimiser step, ours once per RL step: the two decays differ
        raise ConfigError(f"--vs trl: train.lr_schedule={cfg.train.lr_schedule}: not matched (TRL decays per "
                          "optimiser step, we per RL step); add --set train.lr_schedule=constant")
    if (r.prompts_per_step * r.group_size) % cfg.train.minibatches:
        raise ConfigError(f"--vs trl: the rollout must split into {cfg.train.minibatches} equal minibatches")
    return Matched(r.prompts_per_step, r.group_size, r.max_new_tokens, r.temperature, cfg.train.minibatches,
                   cfg.train.lr, cfg.train.weight_decay, cfg.train.max_grad_norm, s.loss.eps_low, s.loss.eps_high,
                   r.advantage_scale, r.verify_timeout, cfg.seeds[0])


def grpo_config_kwargs(m: Matched, output_dir: str, total_cycles: int) -> dict:
    """``GRPOConfig`` fields for ``total_cycles`` RL steps of ``m``: one generation = one of our rollouts."""
    return dict(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=m.seed,
        # completions per optimiser step: the rollout split into our minibatches
        per_device_train_batch_size=m.completions // m.minibatches,
        # one generation batch (per_device_train_batch_size x steps_per_generation) = our rollout; each of its
        # steps_per_generation steps is one optimiser step (no accumulation), the batch is used once
        steps_per_generation=m.minibatches, gradient_accumulation_steps=1, num_iterations=1,
        num_generations=m.group_size, max_steps=total_cycles * m.minibatches,
        max_completion_length=m.max_new_tokens, temperature=m.temperature, top_p=1.0, top_k=0,
        learning_rate=m.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=m.weight_decay,
        max_grad_norm=m.max_grad_norm, optim="adamw_torch_fused",
        # our grpo: token ratio clipped to [1 - eps_low, 1 + eps_high], each sequence's token mean, then
        # the mean over sequences (TRL's loss_type "grpo"); group z-score advantages; no reference model
        loss_type="grpo", epsilon=m.eps_low, epsilon_high=m.eps_high, beta=0.0, scale_rewards=m.scale_rewards,
        use_vllm=False, report_to="none", save_strategy="no", logging_steps=m.minibatches, disable_tqdm=True,
        log_level="error", dataloader_num_workers=0, log_completions=False,
    )


def cycle_walls(ends: list[float], steps_per_cycle: int) -> list[float]:
    """Wall seconds of each cycle from the clock's times: the start, then the end of every optimiser step."""
    marks = ends[::steps_per_cycle]  # start, end of cycle 1, end of cycle 2, ...
    # a cycle lasts from the end of the previous one (or the start) to the end of its last optimiser step
    return [b - a for a, b in zip(marks, marks[1:])]


@dataclass
class Side:
    """One measured run: medians over its measured cycles."""

    name: str
    seconds: float
    completions: float
    gen_tokens: float
    cycles: int
    optimizer_steps_per_cycle: float
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        # rates are the median cycle's counts over the median cycle's wall time (bench_rl_step's convention)
        d.update(completions_per_s=self.completions / self.seconds, gen_tokens_per_s=self.gen_tokens / self.seconds,
                 mean_length=self.gen_tokens / self.completions)  # tokens per completion, eos included
        return d


def summarise(name: str, walls: list[float], counts: list[tuple[int, int]], steps: float, extra: dict) -> Side:
    """A Side from the measured cycles' walls, (completions, generated tokens) and optimiser steps per cycle."""
    if not walls or len(walls) != len(counts):
        raise RuntimeError(f"{name}: {len(walls)} timed cycles but {len(counts)} rollouts counted")
    return Side(name, statistics.median(walls), statistics.median(c for c, _ in counts),
                statistics.median(t for _, t in counts), len(walls), steps, {"walls": list(walls), **extra})


def ratios(ours: dict, trl_runs: dict[str, dict]) -> dict:
    """ours / TRL for each TRL run, completions/s and generated tokens/s (> 1: ours is faster)."""
    return {name: {k: ours[k] / t[k] for k in ("completions_per_s", "gen_tokens_per_s")}
            for name, t in trl_runs.items()}


def checks(m: Matched, runs: dict[str, dict]) -> list[str]:
    """Is the comparison like for like? One line per property, with each run's value where one differs."""
    def same(what: str, want: float, key: str) -> str:
        ok = all(r[key] == want for r in runs.values())
        return f"{what}: {want:g} on every run: " + ("yes" if ok else "NO: " + ", ".join(
            f"{n} {r[key]:g}" for n, r in runs.items()))

    return [same(f"completions per cycle ({m.prompts} prompts x {m.group_size})", m.completions, "completions"),
            same("optimiser steps per cycle", m.minibatches, "optimizer_steps_per_cycle"),
            f"max new tokens: {m.max_new_tokens} on both sides; mean completion length (tokens, eos included): "
            + ", ".join(f"{n} {r['mean_length']:.1f}" for n, r in runs.items())]


def table_rows(res: dict) -> list[list[str]]:
    """One row per run in measuring order; the ratio columns are ours / that run."""
    def row(n: str, r: dict, q: dict | None) -> list[str]:
        return [n, f"{r['seconds']:.2f}", f"{r['completions']:g}", f"{r['gen_tokens']:g}", f"{r['mean_length']:.1f}",
                f"{r['completions_per_s']:.1f}", f"{r['gen_tokens_per_s']:.0f}",
                *(f"{q[k]:.2f}x" if q else "-" for k in ("completions_per_s", "gen_tokens_per_s"))]

    return [row(n, res["runs"][n], res["ratios"].get(n)) for n in res["order"]]


COLUMNS = ("run", "s / cycle", "completions", "gen tokens", "mean length", "completions/s", "gen tokens/s",
           "ours / run (completions/s)", "ours / run (gen tokens/s)")


def verdict(res: dict) -> str:
    t = res["target"]
    return (f"target: ours / TRL >= {TARGET:g}x in generated tokens/s of the full RL step against "
            f"every TRL run: lowest {t['min_ratio']:.2f}x -> {'met' if t['met'] else 'NOT met'}")


def markdown(res: dict, command: str, commit: str) -> str:
    m = res["config"]
    lines = ["## The full RL step against TRL's GRPOTrainer", "",
             f"Made by `{command}` at commit `{commit}`, on {res['machine']}; trl {res['versions']['trl']}, "
             f"transformers {res['versions']['transformers']}. {m['prompts']} prompts x {m['group_size']} samples, "
             f"at most {m['max_new_tokens']} new tokens, {m['minibatches']} optimiser steps per cycle; medians of "
             f"{res['cycles']} cycles after {res['warmup']} warm-up, measured in the order "
             f"{', '.join(res['order'])}; both sides in one process, "
             + ("with huge pages asked for (THP_MEM_ALLOC_ENABLE=1)." if res.get("huge_pages") else
                "without huge pages, as TRL runs by default."), "",
             tables.markdown(COLUMNS, table_rows(res)), verdict(res) + ".", "",
             *(f"- {c}" for c in res["checks"])]
    return "\n".join(lines) + "\n"


# -- I/O: the two sides, the command -----------------------------------------------------------------------
def import_trl():
    try:
        import trl
    except ImportError:
        raise ConfigError(f"bench --vs trl needs trl, not installed: {EXTRA}") from None
    return trl


class _CycleClock(TrainerCallback):
    """Wall clock at the start of training and at the end of every optimiser step."""

    ends: list[float]

    def on_train_begin(self, args, state, control, **kw):
        self.ends = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kw):
        self.ends.append(time.perf_counter())


def run_trl(trl, name: str, ws_path: str, task, m: Matched, warmup: int, cycles: int) -> Side:
    """TRL's GRPOTrainer for ``warmup + cycles`` cycles on our checkpoint, prompts and verifier."""
    model = AutoModelForCausalLM.from_pretrained(ws_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(ws_path)
    before = [p.detach().clone() for p in model.parameters()]
    counts: list[tuple[int, int]] = []

    def verifier(prompts, completions, completion_ids, answer, **_):
        counts.append((len(completion_ids), sum(len(c) for c in completion_ids)))  # eos included, as ours
        return task.score(list(completions), list(answer), m.verify_timeout)[0]

    clock = _CycleClock()
    with tempfile.TemporaryDirectory(prefix="gspo-bench-trl-") as out:
        args = trl.GRPOConfig(**grpo_config_kwargs(m, out, warmup + cycles))
        trainer = trl.GRPOTrainer(model=model, reward_funcs=verifier, args=args, processing_class=tok,
                                  train_dataset=task.train.select_columns(["prompt", "answer"]), callbacks=[clock])
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        trainer.train()
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters()))
    steps = trainer.state.global_step
    logged = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    extra = {"optimizer_steps": steps, "params_changed": changed, "generate": "transformers model.generate",
             "logged_mean_length": statistics.median(logged[warmup:] or [float("nan")])}
    return summarise(name, cycle_walls(clock.ends, m.minibatches)[warmup:], counts[warmup:],
                     steps / (warmup + cycles), extra)  # optimiser steps per cycle, over all cycles


def run_ours(cfg: RunConfig, ws_path: str, task, m: Matched, warmup: int, cycles: int, peak_gflops: float) -> Side:
    """``bench`` (c) on the fast path, unchanged: Lightning loop, rollout, rewards, advantages, optimiser steps."""
    flops_model = AutoModelForCausalLM.from_pretrained(ws_path, dtype=torch.float32)
    d = bench_rl_step(cfg, "grpo", ws_path, task, warmup, cycles, peak_gflops, flops_model)
    extra = {k: d[k] for k in ("gen_s", "train_s", "other_s", "mfu", "engine", "old_logp_source", "forward")}
    # bench_rl_step returns the medians over its measured steps, not each step's wall time
    return Side("ours", d["seconds"], d["completions"], d["gen_tokens"], d["steps"], float(m.minibatches), extra)


def compare(preset: str, config_files: tuple, overrides: dict, warmup: int, cycles: int, algo: str = "grpo",
            log=print) -> dict:
    """TRL, ours, TRL on one preset; the ``vs_trl`` dict of the bench JSON."""
    if warmup < 0 or cycles < 1:
        raise ConfigError("--rl-steps must be >= 1 and --warmup >= 0")
    trl = import_trl()
    cfg = check_measurable(load_config(preset, config_files, deep_merge(overrides, path_overrides("fast"))))
    # the header once every input has been checked: a bad one is the command's only line
    log(f"[bold]bench --vs trl[/bold] preset={preset}: TRL, ours, TRL; {cycles} cycles each")
    quiet()
    task = load_task(cfg.task, cfg.seeds[0], cfg.model, cfg.rollout.response_cap(), log, cfg.task_options)
    m = matched(cfg, algo, task.spec.max_new_tokens)
    ws = warm_start(task, cfg.model, cfg.warmstart, cfg.seeds[0], task.spec.max_new_tokens, progress=False, log=log)
    runs: dict[str, dict] = {}
    for name in ("trl_1", "ours", "trl_2"):
        peak = matmul_gflops(device=bench_device(cfg.train.accelerator)) if name == "ours" else 0.0
        side = (run_ours(cfg, str(ws.path), task, m, warmup, cycles, peak) if name == "ours"
                else run_trl(trl, name, str(ws.path), task, m, warmup, cycles))
        runs[name] = side.to_dict()
        log(f"{name}: {runs[name]['seconds']:.2f} s / cycle, {runs[name]['gen_tokens_per_s']:.0f} gen tokens/s")
    q = ratios(runs["ours"], {k: v for k, v in runs.items() if k != "ours"})
    low = min(r["gen_tokens_per_s"] for r in q.values())
    return {"machine": machine(), "model": cfg.model.name, "task": cfg.task, "preset": preset, "config": asdict(m),
            "warmup": warmup, "cycles": cycles, "order": list(runs), "runs": runs, "ratios": q,
            "target": {"metric": "gen_tokens_per_s", "ratio": TARGET, "min_ratio": low, "met": low >= TARGET},
            "checks": checks(m, runs), "threads": torch.get_num_threads(),
            # what torch's allocator read (cli/pages.py: the command line leaves it unset here, as TRL's users do)
            "huge_pages": huge_pages_on(),
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}}


def vs_command(args, console) -> int:
    """``bench --vs trl``: measure, print the table and the checks, write JSON / Markdown as asked."""
    if args.vs != "trl":
        raise ConfigError(f"--vs {args.vs!r}: allowed trl")
    if args.whole or args.profile or args.figure or (args.model and len(args.model) > 1):
        raise ConfigError("--vs trl takes one --model and no --whole, --profile or --figure")
    import_trl()  # before any work: a missing extra is one line, exit 2
    flags: dict = {"task": args.task} if args.task else {}  # the flags win over --set, as in bench
    flags.update({"model": {"name": args.model[0]}} if args.model else {})
    flags.update({"rollout": {"max_new_tokens": args.max_new_tokens}} if args.max_new_tokens is not None else {})
    over = deep_merge(parse_sets(args.sets), flags)
    preset = args.preset or "cpu-bench"
    res = compare(preset, tuple(args.config), over, args.warmup, args.rl_steps, args.algo, log=console.print)
    table = Table(*COLUMNS, title="full RL step: ours (fast path) vs TRL GRPOTrainer, medians per cycle")
    for row in table_rows(res):
        table.add_row(*row)
    console.print(table)
    for line in [verdict(res), *res["checks"]]:
        console.print(line, soft_wrap=True)
    text = json.dumps({"machine": res["machine"], "model": res["model"], "config": res["config"], "vs_trl": res},
                      indent=2)
    if not args.json:
        print(text)
    for path, content in ((args.json, lambda: text), (args.markdown, lambda: markdown(
            res, "python -m gspo_bench " + shlex.join(args.argv), git_commit()))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content())
            console.print(f"wrote {path}")
    return 0
