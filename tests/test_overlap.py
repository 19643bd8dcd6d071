"""Asynchronous rollouts (gspo_bench.rollout.overlap): a real worker process sampling while the trainer trains,
bounded staleness, the worker's death, and what an asynchronous run logs and tags."""

from __future__ import annotations

import queue
import time

import mlflow
import pytest
import torch

from gspo_bench.config import ConfigError, RolloutConfig, load_config
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.rollout.overlap import OverlappedRollouts, ProducerDied, WorkerSpec, split_cores
from gspo_bench.tasks import Task, TaskSpec, generate_arith
from gspo_bench.train.runner import run
from tests.conftest import saved_builtin, tiny_overrides


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_builtin("tiny-dense", tmp_path_factory.mktemp("overlap-model"))


@pytest.fixture(scope="module")
def task():
    train, eval_ = generate_arith(0, min_digits=1, max_digits=2, n_train=200, n_eval=16)
    return Task(TaskSpec(name="arith-small", kind="arith"), train, eval_)


def settings(**kw) -> RolloutConfig:
    s = dict(prompts_per_step=2, group_size=3, max_new_tokens=4, engine="fast", dynamic_sampling=False,
             overlong_buffer=None, advantage_scale="group", seeding="request")
    return RolloutConfig(**{**s, **kw})


def datamodule(task, folder, steps=6, **kw) -> RolloutDataModule:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    return RolloutDataModule(task, AutoTokenizer.from_pretrained(folder), settings(**kw), steps=steps, seed=0,
                             policy=model, model_dir=str(folder))


def test_the_worker_samples_ahead_but_never_more_than_k_versions(task, folder):
    dm = datamodule(task, folder, max_staleness=2)
    try:
        seen = []
        for step in range(6):
            batch = dm.rollout(step)
            with torch.no_grad():  # an update: the next hand-over is other weights
                for p in dm.policy.parameters():
                    p.add_(1e-3)
            time.sleep(0.5)  # training slower than sampling: the worker runs as far ahead as it may
            versions = batch.versions[batch.loss_mask.bool()].unique().tolist()
            assert len(versions) == 1  # one version per rollout, no partial rollouts
            seen.append((step - versions[0], batch.stats["async/staleness_mean"], batch.stats["async/buffer_depth"]))
        # wait: the first from the first weights, then up to K = 2 behind, never more; the queue holds at most K
        stale = [s for s, _, _ in seen]
        assert stale[0] == 0 and max(stale) == 2 and all(0 <= s <= 2 for s in stale), stale
        assert all(s == m for s, m, _ in seen) and all(d <= 2 for _, _, d in seen)
        assert dm.overlap.proc.is_alive()
        proc = dm.overlap.proc
    finally:
        dm.close_engine()
    assert not proc.is_alive() and dm.overlap is None  # closed with the run


def test_the_synchronous_loop_starts_no_worker(task, folder):
    dm = datamodule(task, folder, max_staleness=0)
    dm.rollout(0)
    assert dm.overlap is None and "async/staleness_mean" not in dm.rollout(1).stats


def test_a_worker_that_dies_stops_the_trainer_with_one_line(task, folder):
    dm = datamodule(task, folder, max_staleness=1)
    try:
        dm.rollout(0)
        dm.overlap.proc.kill()
        dm.overlap.proc.join(timeout=10)
        with pytest.raises(ProducerDied, match=r"the rollout producer \(pid \d+\) died with exit code -9"):
            for step in range(1, 4):  # the one sampled ahead may still be in the queue
                dm.rollout(step)
    finally:
        dm.close_engine()


class _Alive:
    pid, exitcode = 1, None

    def is_alive(self):
        return True


def _spec(**kw) -> WorkerSpec:
    return WorkerSpec(None, None, settings(**kw), 0, "", False, True, False, 0, 10, (0,))


def test_drop_skips_rollouts_more_than_k_versions_old_and_counts_them():
    over = OverlappedRollouts(_spec(max_staleness=1, stale_policy="drop"))
    over.proc, over.out = _Alive(), queue.Queue()
    mask = torch.ones(2, 3)
    for index, version in ((0, 0), (1, 0), (2, 0), (3, 2)):
        batch = type("B", (), {"stats": {}, "loss_mask": mask, "versions": torch.full((2, 3), version)})()
        over.out.put((index, version, batch))
    # step 3 at version 3: the rollouts of version 0 are 3 old (> K = 1), dropped; the one of version 2 is taken
    got = over.take(3)
    assert got.stats["async/staleness_mean"] == 1.0 and got.stats["async/dropped_frac"] == pytest.approx(3 / 4)


def test_a_responses_staleness_is_its_oldest_tokens_and_partial_ones_are_counted():
    over = OverlappedRollouts(_spec(max_staleness=2))
    over.proc, over.out = _Alive(), queue.Queue()
    # row 0 started at version 0 and went on under version 1 (a partial rollout); row 1 all version 1; -1: padding
    versions = torch.tensor([[0, 0, 1, 1], [1, 1, -1, -1]])
    batch = type("B", (), {"stats": {}, "loss_mask": (versions >= 0).float(), "versions": versions})()
    over.out.put((2, 0, batch))
    got = over.take(2)
    # staleness at version 2: row 0's oldest token is version 0 (2 stale), row 1's version 1 (1 stale)
    assert got.stats["async/staleness_mean"] == 1.5 and got.stats["async/staleness_max"] == 2.0
    assert got.stats["async/partial_frac"] == 0.5


def test_partial_rollouts_tag_each_token_with_the_version_that_sampled_it(task, folder):
    """The producer's ``refresh`` (the worker's, under rollout.partial) loads newer weights between two decode
    steps; the responses under way continue under them and their later tokens carry the new version."""
    dm = datamodule(task, folder, max_new_tokens=6)
    p = dm.producer
    p.sync_weights(dm.policy.state_dict(), 3)
    newer = {k: v + 0.01 for k, v in dm.policy.state_dict().items()}
    calls = []

    def refresh() -> bool:
        calls.append(1)
        if len(calls) == 2:  # before the second decode step: tokens 0-1 of version 3, the rest of version 7
            p.sync_weights(newer, 7)
            return True
        return False

    p.refresh = refresh
    batch = p.rollout(0)
    live = batch.loss_mask.bool()
    assert set(batch.versions[live].tolist()) == {3, 7}
    assert bool((batch.versions[:, :2][live[:, :2]] == 3).all()) and bool((batch.versions[:, 2:][live[:, 2:]] == 7).all())
    for t, row in zip(batch.trajectories, batch.versions):
        assert list(t.versions) == row[:len(t.versions)].tolist()  # the trajectories keep them, token by token
    assert p.version == 7


def test_sync_every_thins_the_hand_overs_but_never_strands_the_worker():
    over = OverlappedRollouts(_spec(max_staleness=1, sync_every=3))
    over.started = True  # no process: only what would be handed over
    sent = []
    over.weights = type("Q", (), {"put": lambda self, item: sent.append(item[0])})()
    for version in range(8):
        over.sync_weights({"w": torch.zeros(1)}, version)
    # every third, and whenever the last one handed over would leave the worker more than K = 1 behind
    assert sent == [0, 2, 3, 5, 6]


def test_the_settings_refuse_what_cannot_run():
    with pytest.raises(ConfigError, match="two kinds of staleness"):
        RolloutConfig(max_staleness=1, staleness=2)
    with pytest.raises(ConfigError, match="stale_policy"):
        RolloutConfig(max_staleness=1, stale_policy="later")
    with pytest.raises(ConfigError, match="only an asynchronous sampler sees: set rollout.max_staleness > 0"):
        RolloutConfig(partial=True)
    with pytest.raises(ConfigError, match="a cast sampler"):
        RolloutConfig(partial=True, max_staleness=1, dtype="bfloat16")
    with pytest.raises(ConfigError, match="rollout.partial='yes' must be true or false"):
        RolloutConfig(partial="yes", max_staleness=1)
    from gspo_bench.rollout.engines import check_engine

    with pytest.raises(ConfigError, match="engine hf cannot continue a response under new weights; use --engine "
                                          "fast or compiled"):
        check_engine(load_config("smoke", overrides={"rollout": {"max_staleness": 1, "partial": True,
                                                                 "engine": "hf"}}))
    check_engine(load_config("smoke", overrides={"rollout": {"max_staleness": 1, "partial": True,
                                                             "engine": "fast"}}))
    from gspo_bench.cli.main import main

    assert main(["run", "--preset", "smoke", "--engine", "hf", "--set", "rollout.max_staleness=1", "--set",
                 "rollout.partial=true", "--tracking-uri", "sqlite:////nonexistent/never.db"]) == 2
    from gspo_bench.train.distributed import check_processes

    cfg = load_config("smoke", overrides={"rollout": {"max_staleness": 1}, "train": {"devices": 2}})
    with pytest.raises(ConfigError, match="one rollout worker"):
        check_processes(cfg)
    trainer, worker = split_cores()
    assert trainer and worker and (set(trainer).isdisjoint(worker) or trainer == worker)


@pytest.mark.parametrize("partial", [False, True])
def test_an_asynchronous_run_finishes_logs_its_overlap_and_is_tagged(mixed_task, tracking_uri, partial):
    cfg = load_config("smoke", overrides=tiny_overrides(
        mixed_task, tracking_uri, algos=["grpo"], tracking={"tracking_uri": tracking_uri, "experiment": "async"},
        rollout={"max_staleness": 1, "seeding": "request", "partial": partial}, train={"steps": 4}))
    t0 = time.time()
    [res] = run(cfg, log=lambda *a: None)
    assert res.status == "FINISHED", res.error
    client = mlflow.MlflowClient(tracking_uri)
    got = client.get_run(res.run_id)
    assert got.data.tags["async"] == "true" and got.data.tags["max_staleness"] == "1"
    assert got.data.tags["partial"] == str(partial).lower()
    history = {k: [m.value for m in sorted(client.get_metric_history(res.run_id, k), key=lambda m: m.step)]
               for k in ("async/staleness_mean", "async/overlap", "reward/mean", "async/partial_frac")}
    assert len(history["async/partial_frac"]) == 4 and all(0.0 <= v <= 1.0 for v in history["async/partial_frac"])
    if not partial:
        assert history["async/staleness_mean"] == [0.0, 1.0, 1.0, 1.0]  # every step logged once
        assert history["async/partial_frac"] == [0.0] * 4
    else:  # a response's later tokens may be fresher, never its oldest staler than K
        assert len(history["async/staleness_mean"]) == 4 and all(0 <= v <= 1 for v in history["async/staleness_mean"])
    assert len(history["reward/mean"]) == 4 and all(0.0 <= v <= 1.0 for v in history["async/overlap"])
    from tests.test_docs import ASYNC_ONLY

    logged = set(got.data.metrics)
    assert all(any(k.startswith(p) for k in logged) for p in ASYNC_ONLY)  # what the docs say asynchronous runs log
    assert time.time() - t0 < 600


def test_a_run_whose_worker_was_killed_resumes_with_every_step_logged_once(mixed_task, tmp_path, monkeypatch):
    from gspo_bench.train import checkpoint

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    cfg = load_config("smoke", overrides=tiny_overrides(
        mixed_task, uri, algos=["grpo"], tracking={"tracking_uri": uri, "experiment": "killed-worker"},
        rollout={"max_staleness": 1, "seeding": "request"}, train={"steps": 5, "checkpoint_every": 1}))
    original = checkpoint.Checkpointer.after_step

    def after_step(self, module):  # kill -9 the worker once step 3 is checkpointed
        original(self, module)
        if module.rl_step == 3:
            proc = module.trainer.datamodule.overlap.proc
            proc.kill()
            proc.join(timeout=10)

    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", after_step)
    [failed] = run(cfg, log=lambda *a: None)
    assert failed.status == "FAILED" and "rollout producer" in failed.error and "died" in failed.error
    monkeypatch.setattr(checkpoint.Checkpointer, "after_step", original)
    [done] = run(cfg, resume=True, log=lambda *a: None)
    assert done.status == "FINISHED" and done.run_id == failed.run_id  # the same run, continued
    client = mlflow.MlflowClient(uri)
    for key in ("reward/mean", "async/staleness_mean", "train/loss"):
        steps = [m.step for m in client.get_metric_history(done.run_id, key)]
        assert sorted(steps) == [1, 2, 3, 4, 5], (key, steps)  # every step once: in-flight rollouts sampled again


def test_an_asynchronous_run_plays_multi_turn_episodes_in_its_worker(tracking_uri):
    """calc with max_staleness 1: the worker plays the episodes turn by turn (env/* from its rollouts), the
    trainer trains on them one version stale."""
    cfg = load_config("smoke", overrides={**tiny_overrides(
        "calc", tracking_uri, rollout={"max_staleness": 1, "max_new_tokens": 24},
        train={"steps": 2, "eval_samples": 0},
        tracking={"experiment": "async-calc"}), "algos": ["grpo"]})
    [res] = run(cfg, log=lambda *a: None)
    assert res.status == "FINISHED", res.error
    client = mlflow.MlflowClient(tracking_uri)
    history = {k: [m.value for m in sorted(client.get_metric_history(res.run_id, k), key=lambda m: m.step)]
               for k in ("async/staleness_mean", "env/turns_mean")}
    assert history["async/staleness_mean"] == [0.0, 1.0]
    assert len(history["env/turns_mean"]) == 2 and all(v >= 1 for v in history["env/turns_mean"])
