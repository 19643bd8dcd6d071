"""A run whose loss's mask leaves no token: ``train/masked_all`` each step, one warning, and a run where it held at
every step ends FAILED with the reason (not FINISHED with a zero loss)."""

from __future__ import annotations

from types import SimpleNamespace

import mlflow
import pytest

from gspo_bench.callbacks import MaskedAllRun, MaskedAllWatch
from gspo_bench.config import load_config
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides


def _module(masked_all: float, step: int):
    rollout = SimpleNamespace(mask_truncated=True, rejection=None, rejection_threshold=None)
    return SimpleNamespace(name="dapo", rl_step=step, last_metrics={"train/masked_all": masked_all},
                           settings=SimpleNamespace(rollout=rollout))


def _watch(flags: list[float], state: dict | None = None) -> tuple[MaskedAllWatch, list[str]]:
    lines: list[str] = []
    watch = MaskedAllWatch(lines.append)
    if state is not None:
        watch.load_state_dict(state)
    for step, flag in enumerate(flags, start=1):
        watch.on_train_batch_end(None, _module(flag, step), None, None, 0)
    return watch, lines


def test_some_steps_masked_warn_once_and_the_run_stands():
    watch, lines = _watch([0.0, 1.0, 1.0, 0.0])
    assert lines == ["[warning] dapo step 2: rollout.mask_truncated masked every token of the loss, so the step "
                     "trained on nothing (train/masked_all counts such steps)"]
    watch.on_train_end(None, _module(0.0, 4))  # steps 1 and 4 trained: not a failure
    assert watch.state_dict() == {"steps": 4, "masked": 2}


def test_every_step_masked_fails_the_run_and_a_resume_counts_on():
    watch, lines = _watch([1.0, 1.0])
    assert len(lines) == 1
    with pytest.raises(MaskedAllRun, match="rollout.mask_truncated masked every token of the loss at all 2 RL steps"):
        watch.on_train_end(None, _module(1.0, 2))
    # resumed from a checkpoint after step 2 (its state), the run's steps 3-4 trained: it stands
    resumed, lines = _watch([0.0, 0.0], state=watch.state_dict())
    assert lines == [] and resumed.state_dict() == {"steps": 4, "masked": 2}
    resumed.on_train_end(None, _module(0.0, 4))
    # ... and one that resumes into more masked steps still fails, over all of its steps
    again, _ = _watch([1.0], state=watch.state_dict())
    with pytest.raises(MaskedAllRun, match="at all 3 RL steps"):
        again.on_train_end(None, _module(1.0, 3))


def test_a_run_whose_every_token_is_rejected_ends_failed_with_the_reason(mixed_task, tmp_path, monkeypatch):
    """Rejection by KL with a band that leaves out ratio 1 (1.5 to 2): the sampler's and the trainer's log-probs
    agree, so every token's ratio is about 1 and every token of every step is rejected."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    o = tiny_overrides(mixed_task, uri, rollout={"rejection": "token_k1", "rejection_threshold": "1.5_2"},
                       tracking={"tracking_uri": uri, "experiment": "masked"})
    lines: list[str] = []
    [r] = run(load_config("smoke", overrides={**o, "algos": ["dapo"]}), log=lines.append)
    assert r.status == "FAILED", r.last
    assert r.error == ("MaskedAllRun: rollout.rejection=token_k1 (threshold 1.5_2) masked every token of the loss at "
                       "all 2 RL steps: the policy was never trained (the loss was 0 throughout)")
    assert sum("masked every token of the loss, so the step trained on nothing" in line for line in lines) == 1
    assert not any("Traceback" in line for line in lines)  # a reason, not a bug
    client = mlflow.MlflowClient(uri)
    got = client.get_run(r.run_id)
    assert got.info.status == "FAILED" and got.data.tags["failed_reason"] == r.error
    assert [m.value for m in client.get_metric_history(r.run_id, "train/masked_all")] == [1.0, 1.0]
    assert [m.value for m in client.get_metric_history(r.run_id, "mismatch/rejected_frac")] == [1.0, 1.0]


def test_a_run_that_trains_logs_masked_all_as_0(mixed_task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    o = tiny_overrides(mixed_task, uri, tracking={"tracking_uri": uri, "experiment": "plain"})
    [r] = run(load_config("smoke", overrides={**o, "algos": ["dapo"]}), log=lambda *a: None)
    assert r.status == "FINISHED"
    history = mlflow.MlflowClient(uri).get_metric_history(r.run_id, "train/masked_all")
    assert [m.value for m in history] == [0.0, 0.0]
