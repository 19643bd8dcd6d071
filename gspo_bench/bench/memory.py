"""``bench --memory``: the memory one RL step adds, with and without each memory control.

Each (controls, rollout size) runs in a child process of its own, so one measurement's freed memory never
lowers the next one's: the model (by default ``qwen3-0.6b-arch``, Qwen3-0.6B's shape with its 151,936-token
vocabulary) and its optimiser, then one RL step of the configured algorithm through Lightning, as ``run``
takes it. Before it, one optimiser step on zero gradients at a learning rate of 0 allocates AdamW's states
(the weights do not move: ``AllocateOptimiserStates``), which is what a step after the first finds; the step
is measured:

- on a CPU, the process's peak resident memory during the step (the kernel's high-water mark, reset at the
  step's start through ``/proc/self/clear_refs``) minus its resident memory when the step starts;
- on a GPU, torch's peak allocated memory during the step minus what was allocated when it started.

The step is the update: old log-probs, advantages, every minibatch's forward and backward, the optimiser
steps. Its gradients are allocated inside it (the optimiser frees them after each step), so one float32 per
weight is part of what every step adds, whatever the controls. The rollout is sampled before it starts (its
KV cache is not counted), by the fast engine, which samples the policy module itself (vLLM would hold a second
copy of the weights and its own cache), and held-out evaluation is off.

On a CPU the child runs with glibc's mmap threshold fixed at 64 KiB (``MALLOC_MMAP_THRESHOLD_``): every
larger block is mapped on its own and returned to the system when freed, so resident memory follows the
tensors alive rather than what the allocator kept from earlier steps (which would absorb part of the step and
understate it).

A step's seconds move by a tenth or more from one process to the next on a shared CPU, so ``--rounds N`` takes every
measurement N times, round after round; the table gives each one's medians, and the step-time bounds are
taken round by round, each control against the uncontrolled step of its own round (``time_ratios``). Nothing
here is asserted by a test; ``results/memory.md`` is what the command wrote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import torch

from gspo_bench import tables

CONTROLS: dict[str, dict] = {
    "none": {"micro_batch_tokens": None, "logit_chunk_tokens": 0, "activation_checkpointing": False},
    "micro": {"micro_batch_tokens": 256, "logit_chunk_tokens": 0, "activation_checkpointing": False},
    "chunk": {"micro_batch_tokens": None, "logit_chunk_tokens": 256, "activation_checkpointing": False},
    "ckpt": {"micro_batch_tokens": None, "logit_chunk_tokens": 0, "activation_checkpointing": True},
    "all": {"micro_batch_tokens": 256, "logit_chunk_tokens": 256, "activation_checkpointing": True},
    "select": {"micro_batch_tokens": None, "logit_chunk_tokens": 0, "activation_checkpointing": "selective"},
    "all-select": {"micro_batch_tokens": 256, "logit_chunk_tokens": 256, "activation_checkpointing": "selective"},
}
"""The ``train.`` settings of each named set of controls. ``micro``: gradient accumulation over micro-batches
of at most 256 real tokens; ``chunk``: log-probs and entropy over 256 response tokens at a time; ``ckpt``:
each decoder layer's activations recomputed in the backward; ``select``: only the operators between each
layer's matrix products recomputed (selective checkpointing); ``all``, ``all-select``: every control, with
full or selective checkpointing. 256 tokens: below the smaller default rollout
(4 prompts x 4 samples, about 650 real tokens), so that both sizes are cut into micro-batches of the same
size and what grows with the rollout shows."""

DEFAULT_PROMPTS = (4, 16)
"""``--prompts`` unless given: two rollout sizes 4x apart, the larger about as large as a 24 GiB machine holds
with every control off (with about 7 GiB of weights and AdamW states resident, a step without controls adds
about 5 MiB per response token; at 24 prompts it ran out of memory)."""

DEFAULT_SETTINGS = ("model.name=qwen3-0.6b-arch", "rollout.engine=fast", "rollout.group_size=4",
                    "rollout.max_new_tokens=32",
                    "rollout.old_logp_source=recompute", "train.minibatches=1", "train.eval_prompts=2",
                    "train.eval_samples=0", "train.checkpoint_every=0", "warmstart.enabled=false",
                    "task.params={n_eval: 2}")
"""What the measurement runs unless ``--set`` says otherwise: the real-vocabulary model from random weights, the
fast engine (one copy of the weights in the process), 4 samples of at most 32 tokens per prompt, the old log-probs recomputed (a forward the step includes), one
optimiser step per rollout, so that the step's whole rollout is one minibatch; an eval split of 2 prompts, since the
starting point's greedy check is not part of a step."""

COLUMNS = ["controls", "prompts x samples", "response tokens", "step adds (GiB)", "peak (GiB)", "step s"]


def parse_controls(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in CONTROLS]
    if unknown or not names:
        from gspo_bench.config import ConfigError

        raise ConfigError(f"--memory: unknown controls {', '.join(unknown) or '(none given)'} "
                          f"(allowed: {', '.join(CONTROLS)})")
    return list(dict.fromkeys(names))


# -- in the child ---------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


class StepMemory(L.Callback):
    """Measures training step ``index`` (0-based): what it adds over the memory in use when it starts."""

    def __init__(self, index: int):
        self.index, self.result = index, None
        self._start = self._t0 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx != self.index:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
        else:
            # writing 5 resets the process's peak resident set (VmHWM) to its current size
            Path("/proc/self/clear_refs").write_text("5")
            self._start = _status_kib("VmRSS") * 1024
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx != self.index:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = _status_kib("VmHWM") * 1024
        mask = batch.response_mask
        self.result = {"added": peak - self._start, "peak": peak, "seconds": time.perf_counter() - self._t0,
                       "rows": int(mask.shape[0]), "response_tokens": int(mask.sum()),
                       "device": str(pl_module.device)}


PHASES = ("step/prepare", "step/forward", "step/loss", "step/backward", "step/metrics", "step/optimizer")
"""The RL step's phases, as ``algorithms/base.py`` labels them for the profiler (``torch.profiler.record_function``):
old and reference log-probs; each micro-batch's forward, loss and backward; the whole minibatch's metrics from
its parts; clipping and the optimiser step."""


class StepProfile(L.Callback):
    """``torch.profiler`` over training step ``index`` (0-based; a step after the measured one, so the
    profiler's own cost is in neither the memory nor the seconds measured): its table written to ``path``."""

    def __init__(self, index: int, path: str):
        self.index, self.path, self.prof = index, path, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.index:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if pl_module.device.type == "cuda" else []),
                record_shapes=True)
            self.prof.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx != self.index or self.prof is None:
            return
        self.prof.__exit__(None, None, None)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).write_text(profile_text(self.prof.key_averages(),
                                                self.prof.key_averages(group_by_input_shape=True)))


def profile_text(events, by_shape=None) -> str:
    """The step's phases (``PHASES``: calls, total CPU ms, share of the phases' sum), then the 30 operators of
    most self CPU time, as torch.profiler tabulates them; ``by_shape`` (the same events grouped by their
    inputs' shapes): then the 30 (operator, input shapes) of most self CPU time, where a cost that comes with
    the vocabulary or a weight's size shows by its shape."""
    rows = {e.key: e for e in events if e.key in PHASES}
    total = sum(e.cpu_time_total for e in rows.values()) or 1.0
    out = ["phase                 calls   CPU ms   share", *(
        f"{k:<20} {rows[k].count:>6} {rows[k].cpu_time_total / 1e3:>8.1f} {rows[k].cpu_time_total / total:>6.1%}"
        for k in PHASES if k in rows), "", events.table(sort_by="self_cpu_time_total", row_limit=30)]
    if by_shape is not None:
        out += ["", "by input shapes:", by_shape.table(sort_by="self_cpu_time_total", row_limit=30,
                                                       max_name_column_width=40, max_shapes_column_width=90)]
    return "\n".join(out) + "\n"


class AllocateOptimiserStates(L.Callback):
    """Before training starts, one step of every optimiser on gradients of zeros at a learning rate of 0, then
    the gradients freed and the rates put back: AdamW allocates its moments, and both its update and its
    weight decay are scaled by the rate, so the weights stay exactly as they were."""

    def on_train_start(self, trainer, pl_module):
        for opt in trainer.optimizers:
            rates = [group["lr"] for group in opt.param_groups]
            for group in opt.param_groups:
                group["lr"] = 0.0
                for p in group["params"]:
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
            for group, lr in zip(opt.param_groups, rates):
                group["lr"] = lr


def measure_step(preset: str, overrides: dict, algo: str, profile: str | None = None) -> dict:
    """One measurement (in this process): build the run's objects as ``run`` does, allocate the optimisers'
    states, take one RL step and measure it. ``profile``: then a second step under ``torch.profiler``, its
    table written there (``StepProfile``)."""
    from gspo_bench.config import load_config
    from gspo_bench.tasks import load_task
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.assembly import assemble
    from gspo_bench.train.warmstart import warm_start

    cfg = load_config(preset, (), overrides)
    quiet()
    task = load_task(cfg.task, cfg.seeds[0], cfg.model, cfg.rollout.response_cap(), lambda *_: None,
                     cfg.task_options)
    ws = warm_start(task, cfg.model, cfg.warmstart, cfg.seeds[0], task.spec.max_new_tokens, progress=False,
                    log=lambda *_: None)
    probe = StepMemory(index=0)
    extra = [] if profile is None else [StepProfile(1, profile)]
    trainer = L.Trainer(max_epochs=1, logger=False, callbacks=[AllocateOptimiserStates(), probe, *extra],
                        accelerator=cfg.train.accelerator, devices=1, precision=cfg.train.precision,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False)
    # the held-out evaluation is not part of an RL step
    run = assemble(cfg, algo, task, ws.path, 0, lambda module: trainer, steps=1 if profile is None else 2,
                   evaluate=False, eval_samples=0)
    trainer.fit(run.module, datamodule=run.datamodule)
    return probe.result


# -- in the parent --------------------------------------------------------------------------------------
def child_overrides(settings: tuple[str, ...], controls: str, prompts: int) -> tuple[str, ...]:
    """The ``--set`` items of one measurement: the defaults, the command's own, the controls, the size."""
    own = tuple(f"train.{k}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}"
                for k, v in CONTROLS[controls].items())
    return (*DEFAULT_SETTINGS, *settings, *own, f"rollout.prompts_per_step={prompts}")


def measure(preset: str, settings: tuple[str, ...], controls: str, prompts: int, algo: str,
            timeout: float = 3600, profile_dir: str | None = None) -> dict:
    """One measurement in a child process of its own; its result, or its failure and the end of its output.
    ``profile_dir``: a profile of a second step too, in ``profile_path``'s file there."""
    sets = child_overrides(settings, controls, prompts)
    spec = json.dumps({"preset": preset, "sets": sets, "algo": algo,
                       "profile": None if profile_dir is None else str(profile_path(profile_dir, controls, prompts))})
    # freed blocks over 64 KiB go back to the system, so resident memory is the live tensors' (module docstring)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gspo_bench.bench.memory", spec], capture_output=True, text=True,
                          timeout=timeout, env=env)
    row = {"controls": controls, "prompts": prompts, "wall_s": time.perf_counter() - t0}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MEMORY ")]
    if proc.returncode != 0 or not lines:
        why = (proc.stdout + proc.stderr)[-2000:]
        if proc.returncode < 0:  # ended by a signal: the kernel's out-of-memory killer sends SIGKILL
            sig = -proc.returncode
            why += f"\nthe measurement was killed by signal {sig}" + (
                " (SIGKILL: most likely out of memory; try fewer --prompts)" if sig == 9 else "")
        return {**row, "error": why}
    return {**row, **json.loads(lines[-1][len("MEMORY "):])}


def failure_line(error: str) -> str:
    """The line that says why a measurement failed: the last non-blank line of its output (the exception's
    message, or what signal ended it), whole."""
    return next((ln.strip() for ln in reversed(error.splitlines()) if ln.strip()), "no output")


def profile_path(folder: str, controls: str, prompts: int) -> Path:
    """Where ``bench --memory --profile`` writes one measurement's profile."""
    return Path(folder) / f"{controls}-{prompts}p.txt"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _secs(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def rows(results: list[dict], group_size: int) -> list[list[str]]:
    return [[r["controls"], f"{r['prompts']} x {group_size}", str(r.get("response_tokens", "-")),
             _gib(r["added"]) if "added" in r else "failed", _gib(r["peak"]) if "peak" in r else "-",
             _secs(r["seconds"]) if "seconds" in r else "-"] for r in results]


def medians(results: list[dict]) -> list[dict]:
    """One result per (controls, prompts), in first-seen order, from the rounds of ``--rounds``: the median of
    its finished rounds' memory and seconds (each a list of one value per round under ``rounds_s``), or its
    last failure when no round finished."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["controls"], r["prompts"]), []).append(r)
    out = []
    for runs in groups.values():
        done = [r for r in runs if "added" in r]
        if not done:
            out.append(runs[-1])
            continue
        merged = {**done[0], "rounds_s": [r["seconds"] for r in done], "failed_rounds": len(runs) - len(done)}
        for key in ("added", "peak", "seconds"):
            merged[key] = statistics.median(r[key] for r in done)
        out.append(merged)
    return out


TIME_BOUNDS = {"micro": 1.2, "all": 1.6, "all-select": 1.6}
"""The step-time bounds the controls are held to against the uncontrolled step: micro-batches at most 1.2x,
every control at most 1.6x (with either checkpointing)."""


def time_ratios(results: list[dict]) -> list[str]:
    """The step-time bounds as sentences: at each rollout size, each bounded control's step seconds over the
    uncontrolled step's, round by round (the measurements of one round run one after another, so a slow spell
    of the machine weighs on both sides of a ratio alike), the median ratio, its range over the rounds, and
    whether the median is inside its bound."""
    import statistics

    by: dict[tuple, list[float | None]] = {}
    for r in results:
        by.setdefault((r["controls"], r["prompts"]), []).append(r.get("seconds"))
    out = []
    for size in sorted({r["prompts"] for r in results}):
        base = by.get(("none", size), [])
        for c, bound in TIME_BOUNDS.items():
            pairs = [(x, n) for x, n in zip(by.get((c, size), []), base) if x and n]
            if not pairs:
                continue
            per_round = [x / n for x, n in pairs]
            mid = statistics.median(per_round)
            spread = (f"; rounds {min(per_round):.2f}x to {max(per_round):.2f}x" if len(per_round) > 1 else "")
            verdict = "inside" if mid <= bound else "over"
            out.append(f"{size} prompts: `{c}` takes {mid:.2f}x the uncontrolled step's seconds (median of "
                       f"{len(per_round)} round{'s' * (len(per_round) > 1)}{spread}), {verdict} its bound of "
                       f"{bound}x")
    return out


def ratios(results: list[dict]) -> list[str]:
    """The two bounds the controls are built for, as sentences with their numbers."""
    by = {(r["controls"], r["prompts"]): r.get("added") for r in results}
    sizes = sorted({r["prompts"] for r in results})
    out = []
    if len(sizes) >= 2:
        small, large = sizes[0], sizes[-1]
        for c in CONTROLS:
            a, b = by.get((c, small)), by.get((c, large))
            if a and b:
                out.append(f"`{c}`: the {large}-prompt rollout's step adds {b / a:.2f}x what the {small}-prompt "
                           f"one's adds")
    for size in sizes:
        for c, how in (("all", ""), ("all-select", " (selective checkpointing)")):
            none, every = by.get(("none", size)), by.get((c, size))
            if none and every:
                out.append(f"{size} prompts: every control on{how}, the step adds {every / none:.2f}x what it adds "
                           "with none")
    return out


def markdown(results: list[dict], group_size: int, command: str, commit: str, machine: str,
             raw: list[dict] | None = None) -> str:
    """The page: ``results`` (one row per measurement, or ``medians`` of several rounds, with ``raw`` the rounds'
    own results, whose ratios the time bounds take round by round)."""
    device = next((r["device"] for r in results if "device" in r), "?")
    what = ("torch's peak allocated GPU memory during the step minus what was allocated at its start"
            if device.startswith("cuda") else
            "peak resident memory during the step (VmHWM, reset at its start) minus resident memory at its start")
    lines = ["# Memory of one RL step\n", f"`{command}` at commit `{commit}`, on {machine} ({device}).\n",
             f"What one RL step adds: {what}, with the weights and AdamW's states already allocated (the "
             "gradients are allocated inside the step, as in every step of a run), each measurement in a process "
             "of its own. Settings: "
             f"{', '.join(f'`{s}`' for s in DEFAULT_SETTINGS)}, then the command's `--set`.\n",
             tables.markdown(COLUMNS, rows(results, group_size)), ""]
    rounds = max((len(r.get("rounds_s", [])) for r in results), default=0)
    if rounds > 1:
        lines[-2:-1] = [f"Each row is the median of {rounds} rounds (each round takes every measurement once, in "
                        "the same order), and the table after it gives each round's seconds:\n",
                        tables.markdown(COLUMNS, rows(results, group_size)), "",
                        tables.markdown(["controls", "prompts", *(f"round {i + 1} s" for i in range(rounds))],
                                        [[r["controls"], str(r["prompts"]),
                                          *(_secs(s) for s in r.get("rounds_s", []))] for r in results])]
    lines += [f"- {s}" for s in ratios(results)]
    lines += [f"- {s}" for s in time_ratios(raw or results)]
    for r in results:
        if "error" in r:
            lines.append(f"\n`{r['controls']}` at {r['prompts']} prompts failed:\n\n```\n{r['error'][-800:]}\n```")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """The child: ``python -m gspo_bench.bench.memory '{"preset": ..., "sets": [...], "algo": ...}'``."""
    from gspo_bench import algorithms  # noqa: F401  (each algorithm registers itself)
    from gspo_bench.config import parse_sets

    spec = json.loads((argv or sys.argv[1:])[0])
    result = measure_step(spec["preset"], parse_sets(list(spec["sets"])), spec["algo"], spec.get("profile"))
    print("MEMORY " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
