"""A real collapse, driven by an absurd learning rate, read back from MLflow; failures marked FAILED."""

from __future__ import annotations

import json

import mlflow
import pytest

from gspo_bench.config import load_config
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides


def _cfg(task, uri, exp, **extra):
    o = tiny_overrides(task, uri, **extra)
    o["tracking"] = {"tracking_uri": uri, "experiment": exp}
    o["algos"] = ["grpo"]
    return load_config("smoke", overrides=o)


@pytest.mark.parametrize("on_collapse", ["continue", "stop"])
def test_absurd_learning_rate_collapses_and_is_logged(on_collapse, mixed_task, tracking_uri):
    exp = f"collapse-{on_collapse}"
    cfg = _cfg(mixed_task, tracking_uri, exp, train={"steps": 4, "minibatches": 4, "lr": 5.0, "eval_every": 10,
                                                     "eval_samples": 0},
               collapse={"on_collapse": on_collapse})
    [res] = run(cfg, log=lambda *a: None)
    assert res.status == "FINISHED" and res.collapse_events >= 1
    client = mlflow.MlflowClient(tracking_uri)
    [row] = client.search_runs([client.get_experiment_by_name(exp).experiment_id])
    tags = row.data.tags
    kinds = [k.split(".", 1)[1] for k in tags if k.startswith("collapse.") and k != "collapse.count"]
    assert kinds, tags
    assert int(tags["collapse.count"]) == res.collapse_events
    # each event is a metric at its own step, and the tag holds that step
    for kind in kinds:
        hist = client.get_metric_history(row.info.run_id, f"collapse/{kind}")
        assert [m.step for m in hist][0] == int(tags[f"collapse.{kind}"])
    path = client.download_artifacts(row.info.run_id, "collapse_events.json")
    events = json.load(open(path))
    assert {e["kind"] for e in events} == set(kinds) and all(e["time"] > 0 for e in events)
    steps_done = len(client.get_metric_history(row.info.run_id, "reward/mean"))
    if on_collapse == "stop":
        assert steps_done == min(e["step"] for e in events) < 4
    else:
        assert steps_done == 4


def test_exception_mid_run_marks_run_failed(mixed_task, tracking_uri, monkeypatch):
    import gspo_bench.algorithms.base as modules

    real = modules.policy_loss
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("boom")
        return real(*a, **k)

    monkeypatch.setattr(modules, "policy_loss", flaky)
    cfg = _cfg(mixed_task, tracking_uri, "failing")
    [res] = run(cfg, log=lambda *a: None)
    assert res.status == "FAILED" and "boom" in res.error
    client = mlflow.MlflowClient(tracking_uri)
    [row] = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    assert row.info.status == "FAILED"
