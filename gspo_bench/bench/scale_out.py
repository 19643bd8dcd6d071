"""What scaling out can show on one small machine: per-rank work and the cost of talking.

Two commands (docs/scaling-out.md; ``results/scale-out.md``)::

    torchrun --nproc-per-node N -m gspo_bench.bench.scale_out measure OUT.json [--steps S]
    python -m gspo_bench.bench.scale_out report ONE.json TWO.json --out results/scale-out.md

``measure`` trains the default preset (its cached warm start, seed 0) for ``S`` RL steps on however many
processes torchrun started, each rank sampling its share of the prompts, and records per step the
slowest rank's generation and training time. Then it times the collectives a step makes: the gradient
all-reduce (the policy's parameters, once per minibatch) and the small ones (response lengths, the
non-finite flag, the metrics). ``report`` puts two measurements side by side and predicts N GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gspo_bench import tables


def _timed(fn, reps: int) -> float:
    """Median wall time of ``fn()`` in ms over ``reps`` calls (ranks in step: a barrier before each)."""
    out = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def measure(out: str, steps: int) -> None:
    import lightning as L

    from gspo_bench.core import collectives
    from gspo_bench.config import load_config
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.assembly import assemble
    from gspo_bench.train.distributed import strategy
    from gspo_bench.tasks import load_task
    from gspo_bench.train.warmstart import warm_start

    quiet()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = load_config("default", overrides={"train": {"steps": steps, "devices": world, "progress": False,
                                                      "eval_every": 10_000, "eval_prompts": 2 * world,
                                                      "eval_samples": 0}})
    silent = lambda *a, **k: None  # noqa: E731
    task = load_task(cfg.task, 0, cfg.model, cfg.rollout.response_cap(), silent, cfg.task_options)
    ws = warm_start(task, cfg.model, cfg.warmstart, 0, task.spec.max_new_tokens, progress=False, log=silent)
    steps_seen: list[dict] = []  # every step's metrics, reduced over ranks
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=world, strategy=strategy(cfg.train, False),
                        logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False)
    run = assemble(cfg, "grpo", task, ws.path, 0, lambda module: trainer, steps=steps, on_metrics=steps_seen.append,
                   eval_prompts=2 * world, eval_samples=0)
    module = run.module
    trainer.fit(module, datamodule=run.datamodule)
    rank = trainer.global_rank
    n_params = sum(p.numel() for p in module.policy.parameters())
    comm = {}
    if world > 1:
        grad = torch.randn(n_params)
        comm["grad_allreduce_ms"] = _timed(lambda: dist.all_reduce(grad), 20)
        lengths = torch.ones(cfg.rollout.prompts_per_step * cfg.rollout.group_size // world)
        comm["lengths_allgather_ms"] = _timed(lambda: collectives.all_gather_cat(lengths), 20)
        comm["flag_allreduce_ms"] = _timed(lambda: collectives.all_true(True, "cpu"), 20)
        comm["metrics_allgather_ms"] = _timed(lambda: collectives.reduce_metrics(steps_seen[-1]), 20)
    if rank == 0:
        skip = 1 if steps > 1 else 0  # the first step pays one-off costs (compiles, caches)
        import sys

        from gspo_bench.tracking.provenance import git_commit

        command = (f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} torchrun --nproc-per-node {world} "
                   f"-m gspo_bench.bench.scale_out {' '.join(sys.argv[1:])}")
        row = {"command": command, "commit": git_commit(), "processes": world,
               "threads_per_process": torch.get_num_threads(), "steps": steps,
               "prompts_per_step": cfg.rollout.prompts_per_step, "group_size": cfg.rollout.group_size,
               "rows_per_rank": cfg.rollout.prompts_per_step * cfg.rollout.group_size // world,
               "minibatches": cfg.train.minibatches, "params": n_params,
               "gen_s": statistics.mean(m["time/gen_s"] for m in steps_seen[skip:]),
               "train_s": statistics.mean(m["time/train_s"] for m in steps_seen[skip:]),
               "step_s": statistics.mean(m["time/step_s"] for m in steps_seen[skip:]), **comm}
        Path(out).write_text(json.dumps(row, indent=2))
        print(json.dumps(row, indent=2))


def report(one: str, two: str, out: str, command: str, commit: str) -> str:
    a, b = json.loads(Path(one).read_text()), json.loads(Path(two).read_text())
    made = "; ".join(f"`{r['command']}` at `{r['commit']}`" for r in (a, b) if "command" in r)
    mb = b["minibatches"]
    comm_step = mb * b["grad_allreduce_ms"] + b["lengths_allgather_ms"] + mb * b["flag_allreduce_ms"] + (
        b["metrics_allgather_ms"] * 2)  # the step's metrics, and the checkpoint's stop/go flag
    grad_mb = 4 * b["params"] / 2**20
    # T(1) = F + W and T(2) - comm = F + W / 2, so W = 2 (T(1) - (T(2) - comm)) and F = T(1) - W
    work = 2 * (a["step_s"] - (b["step_s"] - comm_step / 1e3))
    fixed = a["step_s"] - work
    lines = [
        "# Scaling out: what 2 processes on a 2-core CPU show",
        "",
        f"Made by `{command}` at commit `{commit}`" + (f", from the measurements of {made}." if made else "."),
        "",
        f"Default preset (tiny-dense, arith, {b['prompts_per_step']} prompts x {b['group_size']} samples, {mb} "
        f"minibatches), GRPO, seed 0, cached warm start; {a['steps']} RL steps each, the first left out of the means. Each process uses "
        f"{b['threads_per_process']} thread, so two processes use the two cores one process with one thread "
        "leaves idle: per-rank work can be seen to halve. Times are the slowest rank's.",
        "",
        tables.markdown(("processes", "rows per rank", "generation s/step", "training s/step", "step s"),
                        [[r["processes"], r["rows_per_rank"], f"{r['gen_s']:.3f}", f"{r['train_s']:.3f}",
                          f"{r['step_s']:.3f}"] for r in (a, b)]).rstrip("\n"),
    ]
    lines += [
        "",
        f"Per-rank rows halve ({a['rows_per_rank']} -> {b['rows_per_rank']}); generation takes "
        f"{b['gen_s'] / a['gen_s']:.2f}x and training {b['train_s'] / a['train_s']:.2f}x the one-process time.",
        "",
        "## Communication (gloo on localhost, 2 processes, median of 20)",
        "",
        f"- gradient all-reduce, {b['params']:,} float32 parameters ({grad_mb:.1f} MiB), once per minibatch: "
        f"{b['grad_allreduce_ms']:.2f} ms",
        f"- response lengths all-gather, once per step: {b['lengths_allgather_ms']:.3f} ms",
        f"- non-finite flag all-reduce, once per minibatch: {b['flag_allreduce_ms']:.3f} ms",
        f"- metrics all-gather (objects), twice per step: {b['metrics_allgather_ms']:.3f} ms",
        f"- per RL step: {mb} x {b['grad_allreduce_ms']:.2f} + {b['lengths_allgather_ms']:.3f} + {mb} x "
        f"{b['flag_allreduce_ms']:.3f} + 2 x {b['metrics_allgather_ms']:.3f} = **{comm_step:.1f} ms**, "
        f"{100 * comm_step / 1e3 / b['step_s']:.1f} % of the 2-process step",
        "",
        "## What N GPUs would give (arithmetic, not a measurement)",
        "",
        "Per-rank work did not halve exactly, so the two measurements are split into a part that shrinks with",
        "the number of ranks (W, each rank's share of the rows) and a part that does not (F: per-step fixed costs,",
        "and two processes sharing one memory bus): T(N) = F + W / N + comm(N).",
        "",
        f"- from T(1) = F + W = {a['step_s']:.3f} s and T(2) - comm = F + W / 2 = {b['step_s']:.3f} - "
        f"{comm_step / 1e3:.4f} = {b['step_s'] - comm_step / 1e3:.3f} s: W = {work:.3f} s, F = {fixed:.3f} s "
        f"({100 * fixed / a['step_s']:.0f} % of a one-process step does not shrink).",
        "- comm(N) on GPUs: k ring all-reduces of the gradient, each moving 2 (N-1) / N of its G bytes over a",
        "  link of bandwidth BW, plus the small collectives (taken at their gloo cost here, an upper bound).",
        "",
    ]
    small = b["lengths_allgather_ms"] + mb * b["flag_allreduce_ms"] + 2 * b["metrics_allgather_ms"]
    predicted = []
    for n, bw_gbs, link in ((2, 20.0, "PCIe 4, 20 GB/s"), (8, 20.0, "PCIe 4, 20 GB/s"), (8, 200.0, "NVLink, 200 GB/s"),
                            (64, 200.0, "NVLink, 200 GB/s")):
        # comm(N) = k x 2 (N - 1) / N x G / BW + the small collectives
        comm_n = (mb * 2 * (n - 1) / n * 4 * b["params"] / (bw_gbs * 1e9)) * 1e3 + small
        # T(N) = F + W / N + comm(N)
        t_n = fixed + work / n + comm_n / 1e3
        predicted.append([n, link, f"{comm_n:.2f} ms", f"{t_n:.3f} s", f"{a['step_s'] / t_n:.1f}x"])
    lines.append(tables.markdown(("N", "link (achieved)", "comm(N)", "T(N)", "speed-up over 1"),
                                 predicted).rstrip("\n"))
    big = 8e9 * 2  # an 8B-parameter model's bf16 gradients
    lines += [
        "",
        f"The fixed part F caps the speed-up at T(1) / F = {a['step_s'] / fixed:.1f}x for this tiny model on CPU; on "
        "GPUs with a real model, generation and training per rank dominate F and the cap rises. Communication is",
        f"small at this size. For an 8B model (16 GB of bf16 gradients) on N = 8 over NVLink the gradient all-reduce "
        f"alone is {mb} x 1.75 x 16 GB / 200 GB/s = {mb * 1.75 * big / 200e9:.2f} s per RL step, to set against each "
        "rank's generation and training of its share, which this machine cannot measure.",
        "",
        "Not tested here: NCCL, more than one machine, FSDP (Lightning runs FSDP on CUDA only), GPUs.",
    ]
    text = "\n".join(lines) + "\n"
    Path(out).write_text(text)
    return text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m gspo_bench.bench.scale_out")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run under torchrun: per-step times and collective costs")
    m.add_argument("out")
    m.add_argument("--steps", type=int, default=4)
    r = sub.add_parser("report", help="two measurements -> a Markdown page")
    r.add_argument("one")
    r.add_argument("two")
    r.add_argument("--out", default="results/scale-out.md")
    r.add_argument("--command", default="see docs/scaling-out.md")
    args = p.parse_args(argv)
    if args.cmd == "measure":
        measure(args.out, args.steps)
    else:
        from gspo_bench.tracking.provenance import git_commit

        print(report(args.one, args.two, args.out, args.command, git_commit()))


if __name__ == "__main__":
    main()
