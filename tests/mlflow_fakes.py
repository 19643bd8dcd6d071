"""Synthetic FINISHED MLflow runs with hand-chosen curves, for the leaderboard / report / pairing tests."""

from __future__ import annotations

import time

from mlflow.entities import Metric, Param


def log_run(client, exp_id: str, *, algo: str, seed: int, evals, tags: dict | None = None, model: str = "tiny-dense",
            run_name: str | None = None, eval_reward: float | None = None, steps: int = 20, clip_steps: int = 4,
            metrics=(), params: dict | None = None) -> str:
    """One FINISHED run tagged like ``run`` tags its runs: ``evals`` [(step, eval/pass1)], ``eval/reward_mean``
    = pass@1 / 2 (or the constant ``eval_reward``), ``clip/frac`` 0.01 on steps 1..clip_steps, ``reward/mean``
    0.5 on steps 1..steps, plus ``metrics`` [(key, step, value)] and ``params``. Returns the run id."""
    all_tags = {"algo": algo, "task": "arith", "model": model, "seed": str(seed), "preset": "default",
                "collapse.count": "0", **(tags or {})}
    run = client.create_run(exp_id, run_name=run_name or f"{algo}-s{seed}", tags=all_tags)
    rid, now = run.info.run_id, int(time.time() * 1000)
    ms = [Metric("eval/pass1", v, now, s) for s, v in evals]
    ms += [Metric("eval/reward_mean", v / 2 if eval_reward is None else eval_reward, now, s) for s, v in evals]
    ms += [Metric("clip/frac", 0.01, now, s) for s in range(1, clip_steps + 1)]
    ms += [Metric("reward/mean", 0.5, now, s) for s in range(1, steps + 1)]
    ms += [Metric(k, v, now, s) for k, s, v in metrics]
    client.log_batch(rid, metrics=ms, params=[Param(k, v) for k, v in (params or {}).items()])
    client.set_terminated(rid, "FINISHED")
    return rid


def new_store(tmp_path_factory, name: str, *experiments: str):
    """A fresh sqlite MLflow store: (uri, client, {experiment: id}), each experiment with its own artifact folder."""
    import mlflow

    root = tmp_path_factory.mktemp(name)
    uri = f"sqlite:///{root}/m.db"
    client = mlflow.MlflowClient(uri)
    ids = {e: client.create_experiment(e, artifact_location=str(root / f"artifacts-{i}"))
           for i, e in enumerate(experiments)}
    return uri, client, ids


def one_line(capsys) -> str:
    """What a CLI call printed (stdout + stderr), asserted to be exactly one line."""
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert len(text.splitlines()) == 1, text
    return text
