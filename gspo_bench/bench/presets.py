"""``bench --presets``: presets run end to end at a cut size, each in its own process, timed.

On a CPU the GPU presets (``gpu-dense``, ``gpu-moe``) cannot run at their own size; what a CPU can say about
them is that their whole pipeline (the built-in model at full size, the vLLM engine, bf16-mixed training, MLflow)
runs, and at what cost in memory and time per RL step. Each preset runs as ``python -m gspo_bench run
--preset NAME`` with the ``CUT_SIZE`` settings (then the command's own ``--set``) into a throwaway MLflow
store, in a child process of its own, so its peak resident memory is the child's own ``ru_maxrss``
(``os.wait4``), what ``/usr/bin/time -v`` reports. Seconds per RL step are the median of every run's
``time/step_s`` (rollout + update; the evaluations are outside it); the wall time includes the start-up
(model built, vLLM engine started, once per algorithm).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gspo_bench import tables

CUT_SIZE = (
    "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "train.steps=2",
    "train.minibatches=1", "train.eval_every=2", "train.eval_prompts=2", "train.eval_samples=0",
    "train.checkpoint_every=0", "task.params={n_eval: 2}",
)
"""The cut size a CPU runs the GPU presets at: 2 prompts x 2 samples of at most 4 tokens, 2 RL steps of one
optimiser step each, 2 eval prompts (the starting point's check too: ``task.params.n_eval``), no checkpoint.
Everything else (model, engine, precisions) stays the preset's."""


def measure_preset(preset: str, sets: tuple[str, ...] = (), *, timeout: float = 1800, env: dict | None = None,
                   log=print) -> dict:
    """Run ``preset`` at the cut size (``CUT_SIZE``, then ``sets``) in a child process; its status per
    algorithm, peak RSS, wall time and seconds per RL step."""
    from gspo_bench.tracking.client import client as tracking_client

    with tempfile.TemporaryDirectory(prefix="gspo-bench-presets-") as store:
        uri = f"sqlite:///{store}/mlflow.db"
        cmd = [sys.executable, "-m", "gspo_bench", "run", "--preset", preset, "--no-progress", "--tracking-uri",
               uri, "--experiment", preset]
        for item in (*CUT_SIZE, *sets):
            cmd += ["--set", item]
        child_env = {**os.environ, **(env or {})}
        child_env.pop("MLFLOW_TRACKING_URI", None)
        log(f"[bench] {preset}: run at the cut size ({', '.join((*CUT_SIZE, *sets))})")
        t0 = time.perf_counter()
        with open(Path(store) / "out.log", "w+") as out:
            proc = subprocess.Popen(cmd, cwd=store, env=child_env, stdout=out, stderr=subprocess.STDOUT)
            try:
                _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not every child's
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - t0
            out.seek(0)
            tail = out.read()[-2000:]
        client = tracking_client(uri)
        exp = client.get_experiment_by_name(preset)
        runs = client.search_runs([exp.experiment_id]) if exp else []
        steps = [m.value for r in runs for m in client.get_metric_history(r.info.run_id, "time/step_s")]
        syncs = [m.value for r in runs for m in client.get_metric_history(r.info.run_id, "time/weight_sync")]
        first = runs[0].data if runs else None
        return {
            "preset": preset,
            "model": first.params.get("model.name", "?") if first else "?",
            "engine": first.tags.get("engine", "?") if first else "?",
            "precision": first.params.get("train.precision", "?") if first else "?",
            "runs": sorted((r.data.tags.get("algo", "?"), r.info.status) for r in runs),
            "exit_code": proc.returncode,
            "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
            "wall_s": wall,
            "step_s": statistics.median(steps) if steps else float("nan"),
            "weight_sync_s": statistics.median(syncs) if syncs else float("nan"),
            "steps": len(steps),
            "log_tail": "" if proc.returncode == 0 else tail,
        }


def ok(result: dict) -> bool:
    return result["exit_code"] == 0 and bool(result["runs"]) and all(s == "FINISHED" for _, s in result["runs"])


COLUMNS = ("preset", "model", "engine", "precision", "runs", "peak RSS (MiB)", "wall s", "s / RL step",
           "s / weight push")


def _s(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"  # NaN: nothing logged (no vLLM push with another engine)


def rows(results: list[dict]) -> list[list[str]]:
    return [[r["preset"], r["model"], r["engine"], r["precision"],
             ", ".join(f"{a} {s}" for a, s in r["runs"]) or f"none (exit {r['exit_code']})",
             f"{r['peak_rss_mib']:,.0f}", f"{r['wall_s']:.0f}", _s(r["step_s"]), _s(r["weight_sync_s"])]
            for r in results]


def markdown(results: list[dict], sets: tuple[str, ...], command: str, commit: str, machine: str) -> str:
    lines = ["## GPU presets on a CPU, at a cut size", "", f"Made by `{command}` at commit `{commit}`, on {machine}.",
             "", "Each preset ran as `python -m gspo_bench run --preset NAME` in a process of its own with "
             + " ".join(f"`--set {s}`" for s in (*CUT_SIZE, *sets))
             + " (the cut size: `gspo_bench/bench/presets.py`); model, engine and precisions are the preset's. "
             "Peak RSS is that process's `ru_maxrss`; s / RL step is the median `time/step_s` (rollout and "
             "update) over every algorithm's steps; wall s includes start-up and evaluations.", "",
             tables.markdown(COLUMNS, rows(results))]
    return "\n".join(lines)
