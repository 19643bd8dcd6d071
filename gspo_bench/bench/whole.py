"""``bench --whole``: the wall time of ``run --algos all`` and where it goes.

Runs every algorithm for one seed of a preset (``default`` unless ``--preset``
says otherwise) exactly as ``run`` does, into a throwaway MLflow store, and
splits the wall time into the warm start (a cached one costs its load), the
rollouts (sampling and scoring, ``time/gen_s``), the updates
(``time/train_s``), the held-out evaluations, and the rest (model loading,
MLflow, Lightning's setup, checkpoints): the overhead. It counts every
completion generated, for training (dynamic sampling's dropped groups
included) and for evaluation (greedy and sampled), and reports completions
per hour of the whole benchmark.
"""

from __future__ import annotations

import tempfile
import time

from rich.table import Table

from gspo_bench import tables
from gspo_bench.config import deep_merge, load_config

PHASES = ("warm start", "rollout", "train", "eval", "overhead")


def whole_benchmark(preset: str = "default", config_files: tuple = (), overrides: dict | None = None,
                    log=print) -> dict:
    """Time ``run`` with every algorithm on the first seed of ``preset``; returns the breakdown."""
    from gspo_bench import algorithms
    from gspo_bench.rollout import compiled
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.runner import run
    from gspo_bench.tracking.provenance import machine
    from gspo_bench.tasks import load_task
    from gspo_bench.train.warmstart import warm_start

    quiet()
    with tempfile.TemporaryDirectory(prefix="gspo-bench-whole-") as store:
        over = deep_merge(overrides or {}, {"algos": algorithms.names(), "train": {"progress": False},
                                            "tracking": {"tracking_uri": f"sqlite:///{store}/mlflow.db",
                                                         "experiment": "bench-whole"}})
        cfg = load_config(preset, tuple(config_files), over)
        cfg = load_config(preset, tuple(config_files), deep_merge(over, {"seeds": cfg.seeds[:1]}))
        seed = cfg.seeds[0]
        t0 = time.perf_counter()
        task = load_task(cfg.task, seed, cfg.model, cfg.rollout.response_cap(), log, cfg.task_options)
        ws = warm_start(task, cfg.model, cfg.warmstart, seed, task.spec.max_new_tokens, progress=False, log=log)
        ws_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        compiling = compiled.compile_seconds()
        results = run(cfg, log=log)
        run_s = time.perf_counter() - t1
    wall = ws_s + run_s
    phases = {"warm start": ws_s}
    for name, key in (("rollout", "rollout_s"), ("train", "train_s"), ("eval", "eval_s")):
        phases[name] = sum(r.clock.get(key, 0.0) for r in results)
    # what no phase accounts for: loading models and data, MLflow, Lightning's setup, checkpoints
    phases["overhead"] = wall - sum(phases.values())
    train = sum(r.completions.get("train", 0) for r in results)
    evals = sum(r.completions.get("eval", 0) for r in results)
    return {
        "machine": machine(), "preset": preset, "model": cfg.model.name, "task": cfg.task, "seed": seed,
        "algos": [r.algo for r in results], "statuses": [r.status for r in results],
        "warm_start_cached": ws.cached, "steps": cfg.train.steps, "wall_s": wall, "phases": phases,
        "per_algo": [{"algo": r.algo, "seconds": r.seconds, **r.clock, **{f"{k}_completions": v
                                                                        for k, v in r.completions.items()}}
                     for r in results],
        "completions": {"train": train, "eval": evals},
        # completions per hour of the whole benchmark: every sampled completion over the whole wall time
        "completions_per_hour": (train + evals) / wall * 3600,
        "train_completions_per_hour": train / wall * 3600,
        # rollout.engine compiled: the first call of each decode shape (compile included), inside the phases
        "compile": {k: v - compiling[k] for k, v in compiled.compile_seconds().items()},
    }


def rows(d: dict) -> list[list[str]]:
    return [[name, f"{d['phases'][name]:.1f}", f"{100 * d['phases'][name] / d['wall_s']:.1f} %"] for name in PHASES]


def summary(d: dict) -> str:
    ws = "cached warm start" if d["warm_start_cached"] else "warm start made in this run"
    return (f"run --algos all ({len(d['algos'])} algorithms, seed {d['seed']}, {d['steps']} RL steps, {ws}) on "
            f"preset {d['preset']} ({d['model']}, {d['task']}): {d['wall_s']:.0f} s; {d['completions']['train']:,} "
            f"training and {d['completions']['eval']:,} eval completions, {d['completions_per_hour']:,.0f} "
            f"completions/hour ({d['train_completions_per_hour']:,.0f} for training)"
            + (f"; compiled decode graphs: {d['compile']['graphs']}, their first calls (compiling) "
               f"{d['compile']['compile_s']:.1f} s" if d.get("compile", {}).get("graphs") else ""))


def rich_table(d: dict) -> Table:
    table = Table(title="run --algos all, by phase")
    for col in ("phase", "seconds", "share"):
        table.add_column(col)
    for row in rows(d):
        table.add_row(*row)
    return table


def markdown(d: dict, command: str, commit: str) -> str:
    lines = ["## The whole benchmark: `run --algos all`", "", f"Made by `{command}` at commit `{commit}`, on "
             f"{d['machine']}.", "", summary(d) + ".", "", tables.markdown(("phase", "seconds", "share"), rows(d))]
    lines.append(tables.markdown(
        ("algorithm", "seconds", "rollout s", "train s", "eval s", "training completions", "eval completions"),
        [[a["algo"], f"{a['seconds']:.1f}", f"{a['rollout_s']:.1f}", f"{a['train_s']:.1f}", f"{a['eval_s']:.1f}",
          f"{a.get('train_completions', 0):,}", f"{a.get('eval_completions', 0):,}"] for a in d["per_algo"]]))
    return "\n".join(lines)
