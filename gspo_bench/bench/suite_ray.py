"""``bench --suite-ray``: the smoke suite's wall time on the serial backend against ``--backend ray`` with N
workers on this machine, and what each cell costs beyond its training run.

Every run is a ``python -m gspo_bench suite`` of its own, into a throwaway MLflow store, sharing one warm-start
cache::

    suite --scenarios smoke --algos grpo,gspo --seeds 2 --set train.steps=2 [--set ...] --no-progress
          [--backend ray --ray-address HEAD --cpus-per-cell 1]

1. one serial run first, not timed: it builds the warm starts (then cached for every timed run) and warms the
   file caches;
2. a Ray head of this machine with N CPUs (``ray start --head --block --num-cpus N``), timed: the cluster's
   start-up, paid once per cluster, not per suite;
3. ``repeats`` times: the serial run, then the Ray run on that head (each cell a task of 1 CPU: N at a time).

Per run: the command's wall time (Python's start-up included), the suite's own ``wall_s`` (``suite.json``: from
the plan to the outputs) and the training time of its cells (the sum of their ``time/wall_s``). Overhead per
cell = (workers x wall - training time) / cells: the worker-seconds a cell costs beyond its run (joining the
cluster, a worker's start and imports, scheduling, the claim, the outputs), with workers = 1 for the serial run.
The serial run uses torch's default threads; a Ray worker one thread per CPU it holds (Ray sets
``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gspo_bench import tables

SUITE = ("--scenarios", "smoke", "--algos", "grpo,gspo", "--seeds", "2", "--set", "train.steps=2", "--no-progress")
COLUMNS = ("backend", "workers", "runs", "wall s (command)", "wall s (suite)", "training s (sum of cells)",
           "speed-up", "overhead s / cell")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict:
    """A child's environment: no tracking store or Ray address from outside; no Ray token (a head of this
    machine)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def ray_head(cpus: int, env: dict | None = None, timeout_s: float = 120.0):
    """A Ray head of this machine with ``cpus`` CPUs and no GPU, in its own temp folder and on free ports
    (``ray start --head --block``); yields ``(address, start-up seconds)``, and stops it (SIGTERM: ``--block``
    stops the processes it started) and removes its folder on the way out."""
    port = _free_port()
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
    log_path = Path(folder) / "head.log"
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--port", str(port),
           "--num-cpus", str(cpus), "--num-gpus", "0", "--temp-dir", folder, "--include-dashboard", "false",
           "--disable-usage-stats", "--object-store-memory", str(100 * 2**20),
           "--dashboard-agent-listen-port", str(_free_port()), "--metrics-export-port", str(_free_port())]
    # Ray Client's server (ray:// addresses, unused here) starts only where its dependency, grpcio, is installed
    # (ray[client]); then on a free port of its own, not the default 10001 another head may hold. A plain
    # ``pip install ray`` has no grpcio, and ``ray start`` refuses a client port there.
    if importlib.util.find_spec("grpc") is not None:
        cmd += ["--ray-client-server-port", str(_free_port())]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        head = subprocess.Popen(cmd, env=env or child_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while "Ray runtime started" not in log_path.read_text():
            if head.poll() is not None or time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"ray start --head did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", time.perf_counter() - t0
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait()
        shutil.rmtree(folder, ignore_errors=True)  # its sessions' logs and sockets


def suite_run(folder: Path, sets: tuple[str, ...], env: dict, ray_address: str | None = None) -> dict:
    """One ``suite`` in ``folder`` (its own store); its wall times, cells and training time from ``suite.json``."""
    cmd = [sys.executable, "-m", "gspo_bench", "suite", *SUITE, "--tracking-uri", f"sqlite:///{folder / 'mlflow.db'}",
           "--out", str(folder / "out")]
    for item in sets:
        cmd += ["--set", item]
    if ray_address:
        cmd += ["--backend", "ray", "--ray-address", ray_address, "--cpus-per-cell", "1"]
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    summary = folder / "out" / "suite.json"
    doc = json.loads(summary.read_text()) if summary.is_file() else {}
    return {"exit_code": proc.returncode, "wall_s": wall, "suite_s": doc.get("wall_s", float("nan")),
            "cells": doc.get("cells", 0), "finished": doc.get("finished", 0), "cell_s": doc.get("cell_s", 0.0),
            "workers": doc.get("workers", 1), "log_tail": "" if proc.returncode == 0 else
            (proc.stdout + proc.stderr)[-2000:]}


def measure(workers: int, repeats: int, sets: tuple[str, ...] = (), log=print) -> dict:
    """The measurement of the module docstring; runs under a temp folder of its own, removed after."""
    with tempfile.TemporaryDirectory(prefix="gspo-bench-suite-ray-") as scratch:
        root = Path(scratch)
        env = child_env(GSPO_BENCH_CACHE=os.environ.get("GSPO_BENCH_CACHE", str(root / "cache")))
        log("[bench] suite: serial, not timed (builds the warm starts)")
        warm = suite_run(root / "warm-up", sets, env)
        runs = {"local": [], "ray": []}
        with ray_head(workers, env) as (address, start_s):
            log(f"[bench] Ray head with {workers} CPUs up in {start_s:.1f} s at {address}")
            for k in range(repeats):
                for backend in ("local", "ray"):
                    r = suite_run(root / f"{backend}-{k}", sets, env, address if backend == "ray" else None)
                    log(f"[bench] {backend} #{k + 1}: {r['wall_s']:.1f} s (suite {r['suite_s']:.1f} s, cells "
                        f"{r['cell_s']:.1f} s, {r['finished']}/{r['cells']} FINISHED)")
                    runs[backend].append(r)
    return {"workers": workers, "repeats": repeats, "sets": list(sets), "cluster_start_s": start_s,
            "warm_up": warm, "runs": runs}


def ok(result: dict) -> bool:
    every = [result["warm_up"], *result["runs"]["local"], *result["runs"]["ray"]]
    return all(r["exit_code"] == 0 and r["cells"] and r["finished"] == r["cells"] for r in every)


def summary(result: dict) -> dict[str, dict]:
    """Per backend the medians over the repeats, the speed-up against serial and the overhead per cell."""
    out = {}
    for backend, runs in result["runs"].items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cells = runs[0]["cells"] or 1
        workers = result["workers"] if backend == "ray" else 1
        train = statistics.median(r["cell_s"] for r in runs)
        out[backend] = {"workers": workers, "wall_s": wall, "suite_s": statistics.median(r["suite_s"] for r in runs),
                        "cell_s": train, "overhead_s": (workers * wall - train) / cells, "cells": cells}
    for s in out.values():
        s["speedup"] = out["local"]["wall_s"] / s["wall_s"]
    return out


def rows(result: dict) -> list[list[str]]:
    return [[b, str(s["workers"]), str(len(result["runs"][b])), f"{s['wall_s']:.1f}", f"{s['suite_s']:.1f}",
             f"{s['cell_s']:.1f}", f"{s['speedup']:.2f}x", f"{s['overhead_s']:.1f}"]
            for b, s in summary(result).items()]


def markdown(result: dict, command: str, commit: str, machine: str) -> str:
    s = summary(result)
    sets = "".join(f" --set {x}" for x in result["sets"])
    lines = ["# The suite on Ray against the serial backend", "",
             f"Made by `{command}` at commit `{commit}`, on {machine}.", "",
             f"Each run: `python -m gspo_bench suite {' '.join(SUITE)}{sets}` ({s['local']['cells']} cells) into a "
             "store of its own, the warm starts built by an untimed serial run first; the Ray runs add `--backend "
             f"ray --ray-address HEAD --cpus-per-cell 1` on a head of this machine with {result['workers']} CPUs "
             f"(`ray start --head --num-cpus {result['workers']}`; its start-up, paid once per cluster: "
             f"{result['cluster_start_s']:.1f} s). Medians of {result['repeats']} run(s) each, serial and Ray "
             "alternating. Wall s (command): the whole process; wall s (suite): the suite's own `wall_s` "
             "(`suite.json`: joining the cluster, the plan, the cells and the outputs); training s: the sum of the "
             "cells' `time/wall_s`. Overhead s / cell = (workers x wall s (command) - training s) / cells: the "
             "worker-seconds a cell costs beyond its training run (`gspo_bench/bench/suite_ray.py`). The serial "
             "run uses torch's default threads, a Ray worker one thread.", "",
             tables.markdown(COLUMNS, rows(result)),
             f"Speed-up of Ray with {result['workers']} workers: {s['ray']['speedup']:.2f}x (the ideal "
             f"{result['workers']}x, less the overhead above and cells that do not divide evenly among the "
             "workers)."]
    return "\n".join(lines) + "\n"
