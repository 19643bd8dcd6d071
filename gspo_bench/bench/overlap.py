"""``bench --async``: what asynchronous rollouts buy, measured against the synchronous loop.

For each ``K`` of ``--async`` (0 is the synchronous loop) one algorithm runs one seed of a preset exactly as
``run`` does, with ``rollout.max_staleness = K`` and a generator per completion, into a throwaway MLflow store.
Each run's wall time gives its RL steps per hour and tokens per second; its histories give the overlap the
worker achieved and the staleness the trainer saw. With ``partial`` each K > 0 runs twice, without and with
partial rollouts (``rollout.partial``), and the rows say how many responses spanned versions.

A model of the case where the sampler has a device of its own (a GPU beside the trainer's): from the
synchronous run's own per-step times, generation ``g`` and training ``t`` (the evaluation included), the
synchronous step costs ``g + t`` and an overlapped one ``max(g, t)``, so the predicted speedup is
``(g + t) / max(g, t)``. On this CPU the two processes split the cores, so each side runs slower than alone
and the achieved speedup stays under that bound; the achieved overlap says how much of the training time the
worker filled.
"""

from __future__ import annotations

import statistics
import tempfile

from gspo_bench import tables
from gspo_bench.config import deep_merge, load_config


def async_benchmark(preset: str = "default", config_files: tuple = (), overrides: dict | None = None,
                    ks: tuple[int, ...] = (0, 1, 2), algo: str = "grpo", log=print, partial: bool = False) -> dict:
    """One run of ``algo`` on the first seed of ``preset`` per ``K`` in ``ks`` (and, with ``partial``, a second
    per K > 0 with partial rollouts); returns the measurements."""
    from gspo_bench.tracking.client import client
    from gspo_bench.tracking.provenance import machine
    from gspo_bench.tracking.runs import quiet
    from gspo_bench.train.runner import run

    quiet()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gspo-bench-async-") as store:
        uri = f"sqlite:///{store}/mlflow.db"
        cases = [(int(k), p) for k in ks for p in ((False, True) if partial and k > 0 else (False,))]
        for k, part in cases:
            over = deep_merge(overrides or {}, {
                "algos": [algo], "train": {"progress": False},
                "rollout": {"max_staleness": k, "seeding": "request", "partial": part},
                "tracking": {"tracking_uri": uri, "experiment": f"bench-async-k{k}{'-partial' if part else ''}"}})
            cfg = load_config(preset, tuple(config_files), over)
            cfg = load_config(preset, tuple(config_files), deep_merge(over, {"seeds": cfg.seeds[:1]}))
            log(f"K = {k}{', partial rollouts' if part else ''}: {algo}, seed {cfg.seeds[0]}, {cfg.train.steps} "
                "RL steps")
            [res] = run(cfg, log=log)
            mc = client(uri)
            hist = {key: [m.value for m in sorted(mc.get_metric_history(res.run_id, key), key=lambda m: m.step)]
                    for key in ("async/overlap", "async/staleness_mean", "response/length_mean",
                                "async/partial_frac")}
            steps = cfg.train.steps
            per_step = cfg.rollout.prompts_per_step * cfg.rollout.group_size
            tokens = sum(hist["response/length_mean"]) * per_step  # response tokens sampled for training
            rows.append({
                "k": k, "partial": part, "status": res.status, "seconds": res.seconds, "steps": steps,
                "steps_per_hour": steps / res.seconds * 3600, "tokens_per_s": tokens / res.seconds,
                "gen_s": res.clock["rollout_s"] / steps, "train_s": res.clock["train_s"] / steps,
                "eval_s": res.clock["eval_s"] / steps,
                "overlap": statistics.fmean(hist["async/overlap"]) if hist["async/overlap"] else 0.0,
                "staleness": statistics.fmean(hist["async/staleness_mean"]) if hist["async/staleness_mean"] else 0.0,
                "partial_frac": statistics.fmean(hist["async/partial_frac"]) if hist["async/partial_frac"] else 0.0,
            })
    sync = next((r for r in rows if r["k"] == 0), None)
    model = None
    if sync is not None:
        g, t = sync["gen_s"], sync["train_s"] + sync["eval_s"]
        # a step overlapped on a device of its own: max(g, t) instead of g + t
        model = {"gen_s": g, "train_s": t, "predicted_speedup": (g + t) / max(g, t, 1e-9)}
        for r in rows:
            r["speedup"] = sync["seconds"] / r["seconds"]
    return {"machine": machine(), "preset": preset, "algo": algo, "rows": rows, "model": model,
            "model_name": cfg.model.name}


COLUMNS = ("K", "partial", "status", "seconds", "RL steps/hour", "tokens/s", "speedup vs K=0", "overlap",
           "staleness", "responses spanning versions", "gen s/step", "train+eval s/step")


def table_rows(d: dict) -> list[list[str]]:
    return [[str(r["k"]), "yes" if r.get("partial") else "no", r["status"], f"{r['seconds']:.1f}",
             f"{r['steps_per_hour']:,.0f}", f"{r['tokens_per_s']:,.0f}", f"{r.get('speedup', float('nan')):.2f}x",
             f"{r['overlap']:.2f}", f"{r['staleness']:.2f}", f"{100 * r.get('partial_frac', 0.0):.0f} %",
             f"{r['gen_s']:.2f}", f"{r['train_s'] + r['eval_s']:.2f}"] for r in d["rows"]]


def summary(d: dict) -> str:
    m = d["model"]
    if m is None:
        return "no synchronous run (K = 0) to compare with"
    overlapped = [r for r in d["rows"] if r["k"] > 0]
    if not overlapped:
        return (f"{d['algo']} on preset {d['preset']} ({d['model_name']}): the synchronous step spends "
                f"{m['gen_s']:.2f} s generating and {m['train_s']:.2f} s training and evaluating; no K > 0 was run")
    best = max(overlapped, key=lambda r: r.get("speedup", 0.0))
    how = f"K = {best['k']}" + (" with partial rollouts" if best.get("partial") else "")
    share = m["gen_s"] / max(m["gen_s"] + m["train_s"], 1e-9)
    return (f"{d['algo']} on preset {d['preset']} ({d['model_name']}): the synchronous step spends "
            f"{m['gen_s']:.2f} s generating and {m['train_s']:.2f} s training and evaluating, so a sampler on a "
            f"device of its own would make a step {m['predicted_speedup']:.2f}x as fast (max(g, t) for g + t); "
            f"on this CPU, with the cores split, the best asynchronous setting, {how}, reached "
            f"{best.get('speedup', 0):.2f}x, its worker generating during {100 * best['overlap']:.0f} % of the "
            f"training time" + ("" if best.get("speedup", 0) >= 1 else
                                f" (slower than the synchronous loop: generation is {100 * share:.0f} % of a "
                                f"synchronous step, and each side runs on half the cores)"))


def markdown(d: dict, command: str, commit: str) -> str:
    return "\n".join(["## Asynchronous rollouts: `bench --async`", "",
                      f"Made by `{command}` at commit `{commit}`, on {d['machine']}.", "", summary(d) + ".", "",
                      tables.markdown(COLUMNS, table_rows(d))])
