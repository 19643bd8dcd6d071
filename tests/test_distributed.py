"""Multi-process training on CPU over gloo: the aggregation arithmetic by hand, the metric reduction across
two real processes, 2 processes against 1 on the same global batch (DAPO: token-mean; GSPO: sequence-mean),
and ``run --devices 2`` end to end through Lightning's own launcher.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gspo_bench.core import collectives as ddp
from gspo_bench.config import ConfigError, load_config
from gspo_bench.core.losses import agg_loss, policy_loss
from gspo_bench.cli.main import main
from gspo_bench.train.distributed import check_device, check_processes, fsdp_fallback

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the arithmetic ------------------------------------------------------------------------------------------
def test_each_rank_gets_its_rows_of_every_global_minibatch_and_the_whole_minibatchs_counts():
    lengths = torch.tensor([3.0, 0.0, 2.0, 5.0, 1.0, 4.0])  # global rows 0-2 on rank 0, 3-5 on rank 1
    parts = [torch.tensor([4, 0, 1]), torch.tensor([5, 3, 2])]
    r0 = list(ddp.local_minibatches(parts, lengths, 0, 2))
    r1 = list(ddp.local_minibatches(parts, lengths, 1, 2))
    assert [m.tolist() for m, _, _ in r0] == [[0, 1], [2]]
    assert [m.tolist() for m, _, _ in r1] == [[1], [2, 0]]
    # tokens = 1 + 3 + 0 and 4 + 5 + 2; non-empty sequences = 2 (row 1 is empty) and 3, the same on both ranks
    assert [(t, s) for _, t, s in r0] == [(4.0, 2.0), (11.0, 3.0)] == [(t, s) for _, t, s in r1]


def test_rank_terms_average_to_the_global_token_mean_not_to_a_mean_of_rank_means():
    # rank 0 holds 1 token of loss 1.0; rank 1 holds 3 tokens of loss 3.0; the minibatch has N = 4 tokens
    loss0, mask0 = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 0.0]])
    loss1, mask1 = torch.tensor([[3.0, 3.0, 3.0]]), torch.tensor([[1.0, 1.0, 1.0]])
    # each rank divides by N / W = 2: terms 1/2 and 9/2, whose mean (what DDP's gradient average sees) is
    # (1 + 9) / 4 = 2.5, the token mean over all 4 tokens
    t0, t1 = agg_loss(loss0, mask0, "token-mean", units=2.0), agg_loss(loss1, mask1, "token-mean", units=2.0)
    assert (float(t0), float(t1)) == (0.5, 4.5) and float((t0 + t1) / 2) == 2.5
    # a mean of per-rank means would say (1 + 3) / 2 = 2.0
    assert float((agg_loss(loss0, mask0, "token-mean") + agg_loss(loss1, mask1, "token-mean")) / 2) == 2.0
    # sequence means count non-empty sequences: rank 0 has 2 (one of them empty), rank 1 has 1, N = 2 in all
    seq0, smask0 = torch.tensor([2.0, 7.0]), torch.tensor([[1.0], [0.0]])
    seq1, smask1 = torch.tensor([4.0]), torch.tensor([[1.0]])
    s0, s1 = agg_loss(seq0, smask0, "seq-mean", units=1.0), agg_loss(seq1, smask1, "seq-mean", units=1.0)
    assert float((s0 + s1) / 2) == 3.0  # (2 + 4) / 2: the empty sequence's 7.0 stays out


def test_units_none_leaves_the_single_process_loss_bit_identical():
    torch.manual_seed(0)
    logp, old = torch.randn(3, 5) * 0.1 - 2, torch.randn(3, 5) * 0.1 - 2
    mask, adv = (torch.rand(3, 5) > 0.3).float(), torch.randn(3)
    for name in ("dapo", "gspo", "grpo"):
        a, _ = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask)
        b, _ = policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, units=None)
        assert torch.equal(a, b)


def _reduce_worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        metrics = {"reward/mean": [0.25, 0.75][rank], "ratio/max": [1.5, 1.2][rank], "ratio/min": [0.9, 0.7][rank],
                   "time/gen_s": [2.0, 3.0][rank], "throughput/gen_tokens_per_s": [100.0, 50.0][rank],
                   "clip/frac": [float("nan"), 0.1][rank]}
        if rank == 1:
            metrics["moe/only_here"] = 4.0
        torch.save(ddp.reduce_metrics(metrics), Path(out) / f"r{rank}.pt")
        assert ddp.all_true(rank == 0, "cpu") is False and ddp.all_true(True, "cpu") is True
        total = ddp.all_sum(torch.tensor([float(rank + 1)]))
        assert float(total) == 3.0
        assert ddp.broadcast_object({"from": rank}) == {"from": 0}
    finally:
        dist.destroy_process_group()


def test_step_metrics_reduce_across_two_real_processes(tmp_path):
    mp.spawn(_reduce_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "r0.pt"), torch.load(tmp_path / "r1.pt")
    assert r0 == pytest.approx(r1, nan_ok=True)
    assert r0["reward/mean"] == 0.5 and r0["ratio/max"] == 1.5 and r0["ratio/min"] == 0.7
    assert r0["time/gen_s"] == 3.0  # the slowest rank's time
    assert r0["throughput/gen_tokens_per_s"] == 150.0  # both ranks' tokens
    assert r0["moe/only_here"] == 4.0
    assert r0["clip/frac"] != r0["clip/frac"]  # a NaN on one rank stays NaN


def test_bad_process_layouts_are_config_errors():
    cfg = load_config("smoke", overrides={"rollout": {"prompts_per_step": 6}, "train": {"devices": 4}})
    with pytest.raises(ConfigError, match="prompts_per_step=6 must divide evenly over 4 processes"):
        check_processes(cfg)
    with pytest.raises(ConfigError, match="fsdp needs GPUs"):
        check_processes(load_config("smoke", overrides={"train": {"strategy": "fsdp", "accelerator": "cpu"}}))
    with pytest.raises(ConfigError, match="train.devices"):
        load_config("smoke", overrides={"train": {"devices": 0}})
    with pytest.raises(ConfigError, match="train.strategy"):
        load_config("smoke", overrides={"train": {"strategy": "horovod"}})
    with pytest.raises(ConfigError, match="train.accelerator='tpu' is not allowed"):
        load_config("smoke", overrides={"train": {"accelerator": "tpu"}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a CUDA GPU here")
@pytest.mark.parametrize("name", ["gpu", "cuda"])
def test_a_run_asked_onto_a_gpu_where_there_is_none_stops_before_any_work(name, tmp_path, capsys):
    with pytest.raises(ConfigError, match=f"train.accelerator={name} but torch .* sees no CUDA GPU"):
        check_device(load_config("smoke", overrides={"train": {"accelerator": name}}))
    db = tmp_path / "m.db"
    code = main(["run", "--preset", "smoke", "--tracking-uri", f"sqlite:///{db}", "--no-progress",
                 "--set", f"train.accelerator={name}"])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and len(text.splitlines()) == 1 and "sees no CUDA GPU" in text, text
    assert not db.exists()
    # a suite whose cells train on a Ray cluster leaves the device to the cluster's workers
    from gspo_bench.train.runner import validate

    remote = load_config("smoke", overrides={"train": {"accelerator": name},
                                             "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/r.db"}})
    assert validate(remote, here=False) == f"sqlite:///{tmp_path}/r.db"


def test_fsdp_falls_back_to_transformers_sampling_and_forward_and_says_so():
    said = []
    cfg = fsdp_fallback(load_config("smoke", overrides={"train": {"strategy": "fsdp"}}), said.append)
    assert (cfg.rollout.engine, cfg.train.forward) == ("hf", "hf") and "FSDP shards" in said[0]
    same = load_config("smoke", overrides={"train": {"devices": 2}})
    assert fsdp_fallback(same, said.append) is same and len(said) == 1  # DDP keeps the fast engine


# -- two processes against one -----------------------------------------------------------------------------
def _torchrun(n: int, out: Path, algos: list[str], cache: Path) -> None:
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GSPO_BENCH_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", f"--master-port={_free_port()}",
           str(ROOT / "tests" / "ddp_step.py"), str(out), *algos]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


ALGOS = ["dapo", "gspo", "ppo"]  # token-mean; sequence-mean with a sequence ratio; PPO: whitening, critic


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory):
    """The script's step for ALGOS in one process and in two: the folder holding ``one/`` and ``two/``."""
    root = tmp_path_factory.mktemp("one-and-two")
    _torchrun(1, root / "one", ALGOS, root / "cache")
    _torchrun(2, root / "two", ALGOS, root / "cache")
    return root


@pytest.mark.slow
def test_two_processes_end_one_rl_step_with_the_parameters_of_one(one_and_two):
    # the script's step splits 16 rows into 8 minibatches with minibatch_indices' generator (seed 0, step 0):
    # some minibatch has both rows on one rank, so the other rank takes part with no rows of its own
    from gspo_bench.algorithms.base import minibatch_indices

    parts = minibatch_indices(16, 8, torch.Generator().manual_seed(0))
    assert any(bool((p < 8).all() or (p >= 8).all()) for p in parts)
    for algo in ALGOS:
        one, two = (torch.load(one_and_two / d / f"{algo}.pt") for d in ("one", "two"))
        assert (one["world"], two["world"]) == (1, 2)
        moved = max(float((one["after"][k] - one["before"][k]).abs().max()) for k in one["after"])
        assert moved > 1e-3, f"{algo}: the step did not move the parameters"
        gap = max(float((one["after"][k] - two["after"][k]).abs().max()) for k in one["after"])
        # float tolerance; a mean of per-rank means instead of the global token count was off by ~8e-3
        assert gap < 1e-4, f"{algo}: 2 processes ended {gap:.2e} away from 1 (the step moved {moved:.2e})"
        # the gradient the strategy averaged is the global one, and the logged loss is the global loss
        for key in ("train/grad_norm", "train/loss", "reward/mean"):
            assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-7), key
        # the eval split is sharded (4 prompts each) and its pass@1 averaged over all 8
        assert two["eval"] == one["eval"]


@pytest.mark.slow
def test_two_processes_in_micro_batches_step_as_one_process_and_log_what_two_do_unsplit(one_and_two, tmp_path,
                                                                                       monkeypatch):
    """Every row a micro-batch of its own (``train.micro_batch_tokens: 1``): with 2 rows per minibatch a rank
    backpropagates 0, 1 or 2 parts, often not as many as the other rank, and still all-reduces once per
    minibatch. The step ends where one process's does, and every metric is the unsplit two processes'."""
    monkeypatch.setenv("MICRO_BATCH_TOKENS", "1")
    _torchrun(2, tmp_path / "micro", ALGOS, one_and_two / "cache")
    for algo in ALGOS:
        one, two = (torch.load(one_and_two / d / f"{algo}.pt") for d in ("one", "two"))
        micro = torch.load(tmp_path / "micro" / f"{algo}.pt")
        gap = max(float((one["after"][k] - micro["after"][k]).abs().max()) for k in one["after"])
        assert gap < 1e-4, f"{algo}: 2 processes in micro-batches ended {gap:.2e} away from 1"
        logged = {k for k in two["metrics"] if not k.startswith(("time/", "throughput/"))}
        assert logged <= set(micro["metrics"])
        for key in logged:
            assert micro["metrics"][key] == pytest.approx(two["metrics"][key], rel=1e-4, abs=1e-7), (algo, key)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_two_processes_accumulating_inside_the_matmuls_step_as_one_process(model, tmp_path, monkeypatch):
    """2 minibatches of 8 rows, 4 per rank, every row a micro-batch of its own: each rank's second and third
    parts add their weight gradients into .grad inside the matmuls (core/accumulate.py; on tiny-moe the
    experts' too, expert by expert) under no_sync, and its last part's gradient arrives through autograd,
    where DDP all-reduces. The step ends where one process's does, unsplit."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MODEL", model)
    monkeypatch.setenv("MINIBATCHES", "2")
    _torchrun(1, tmp_path / "one", ["gspo"], cache)
    monkeypatch.setenv("MICRO_BATCH_TOKENS", "1")
    _torchrun(2, tmp_path / "micro", ["gspo"], cache)
    one, micro = (torch.load(tmp_path / d / "gspo.pt") for d in ("one", "micro"))
    gap = max(float((one["after"][k] - micro["after"][k]).abs().max()) for k in one["after"])
    moved = max(float((one["after"][k] - one["before"][k]).abs().max()) for k in one["after"])
    assert gap < 1e-4 < moved, f"2 processes accumulating in the matmuls ended {gap:.2e} away from 1"


@pytest.fixture(scope="module")
def three_algos(tmp_path_factory):
    """``run --devices 2 --strategy ddp`` of grpo, gspo and dapo (``_two_process_cli``): its folder, process and
    output."""
    root = tmp_path_factory.mktemp("three-algos")
    proc, out = _two_process_cli(root, "--strategy", "ddp", algos="grpo,gspo,dapo")
    return root, proc, out


@pytest.mark.slow
def test_run_on_two_processes_logs_one_mlflow_run_per_algorithm_and_fills_the_global_batch(three_algos):
    root, proc, out = three_algos
    assert proc.returncode == 0, out[-3000:]
    assert out.count("== grpo (seed 0) ==") == 1  # rank 1 trains silently
    client = mlflow.MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("ranks").experiment_id])
    # one run per algorithm, not per rank
    assert sorted(r.data.tags["algo"] for r in runs) == ["dapo", "grpo", "gspo"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params["train.devices"] == "2" and run.data.tags["processes"] == "2"
        for key in ("reward/mean", "train/loss", "clip/frac", "train/grad_norm"):
            # one value per RL step: rank 1 logged nothing
            assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/pass1")] == [0, 1, 2]
        assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.yaml"}
    # DAPO's dynamic sampling fills the global batch: each rank its 2 groups, 4 in all at every step
    [dapo] = [r for r in runs if r.data.tags["algo"] == "dapo"]
    assert [m.value for m in client.get_metric_history(dapo.info.run_id, "dynamic/kept_groups")] == [4.0, 4.0]


def _two_process_cli(tmp_path, *extra, script=("-m", "gspo_bench"), env=None, algos="grpo,gspo"):
    """``run --devices 2`` of ``algos`` on a tiny config (no warm start, 2 steps), progress bars on, stdout to a
    file as a batch job's: the completed process and its output."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("warmstart: {enabled: false}\nrollout: {prompts_per_step: 4, group_size: 4}\n"
                   "train: {steps: 2, minibatches: 2, eval_every: 1, eval_prompts: 8, eval_samples: 2}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(tmp_path / "out.log", "w") as out:
        proc = subprocess.run([sys.executable, *script, "run", "--preset", "smoke", "--config", str(cfg), "--algos",
                               algos, "--devices", "2", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
                               "--experiment", "ranks", *extra], cwd=tmp_path, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=600)
    return proc, (tmp_path / "out.log").read_text()


@pytest.mark.slow
def test_two_processes_with_the_progress_bar_on_and_stdout_to_a_file_finish(three_algos):
    # the bar was on rank 0 only while Lightning was told it was on everywhere: rank 1 raised, and Lightning's
    # watcher SIGKILLed both processes (exit 137, nothing printed, the run left RUNNING)
    root, proc, out = three_algos
    assert proc.returncode == 0, out[-3000:]
    assert "--no-progress" not in proc.args and out.count("Epoch 0/0  ━") == 3  # one bar per algorithm, in the file
    client = mlflow.MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("ranks").experiment_id])
    assert sorted((r.data.tags["algo"], r.info.status) for r in runs) == [
        ("dapo", "FINISHED"), ("grpo", "FINISHED"), ("gspo", "FINISHED")]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["step:2", "trainer"])
def test_a_failure_on_rank_1_is_printed_with_its_rank_and_fails_the_run_with_exit_1(tmp_path, where):
    # step:2: rank 0 sees its collective break ("Connection closed by peer") and reports rank 1's own error;
    # trainer: rank 0 waits in the process group's setup, and the watch over rank 1 reports it
    proc, out = _two_process_cli(tmp_path, script=(str(ROOT / "tests" / "fail_rank.py"),),
                                 env={"GSPO_FAIL_RANK": "1", "GSPO_FAIL_AT": where})
    what = "forced failure at RL step 2" if where.startswith("step") else "forced failure while building the trainer"
    assert proc.returncode == 1, out[-3000:]
    assert f"rank 1 failed: RuntimeError: {what}" in out.splitlines()[-1], out[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("ranks").experiment_id])  # grpo; gspo never started
    assert run.data.tags["algo"] == "grpo" and run.info.status == "FAILED"
    assert run.data.tags["failed_reason"] == f"rank 1 failed: RuntimeError: {what}"
    report = client.download_artifacts(run.info.run_id, "rank1-error.txt", str(tmp_path))
    assert what in Path(report).read_text() and "Traceback" in Path(report).read_text()


@pytest.mark.slow
def test_a_two_process_run_stopped_by_ctrl_c_resumes_as_the_same_run(tmp_path):
    import signal
    import time

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("warmstart: {enabled: false}\nrollout: {prompts_per_step: 4, group_size: 4}\n"
                   "train: {steps: 12, minibatches: 2, eval_every: 4, eval_prompts: 8, eval_samples: 0, "
                   "checkpoint_every: 1}\n")  # 12 steps: the signal lands well before the last
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "gspo_bench", "run", "--preset", "smoke", "--config", str(cfg), "--algos", "gspo",
           "--devices", "2", "--tracking-uri", uri, "--experiment", "stop", "--no-progress"]
    client = mlflow.MlflowClient(uri)
    client.create_experiment("stop")  # the store's tables exist before the run and this test both read it
    # its own session, as a terminal's foreground job: Ctrl-C reaches rank 0 and the rank Lightning started
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=open(tmp_path / "first.log", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.5)
        try:
            runs = client.search_runs([client.get_experiment_by_name("stop").experiment_id])
        except Exception:  # not created yet
            continue
        if runs and int(runs[0].data.tags.get("gspo_bench.checkpoint_step", "0")) >= 2:
            break
    os.killpg(first.pid, signal.SIGINT)
    assert first.wait(timeout=120) == 130, (tmp_path / "first.log").read_text()[-3000:]
    [killed] = client.search_runs([client.get_experiment_by_name("stop").experiment_id])
    assert killed.info.status == "KILLED" and "resume from RL step" in killed.data.tags["killed_reason"], (
        (tmp_path / "first.log").read_text()[-3000:])
    again = subprocess.run(cmd + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"continuing run {killed.info.run_id}" in again.stdout
    [run] = client.search_runs([client.get_experiment_by_name("stop").experiment_id])
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    # every step once: what the first part logged is not logged again, and the rest is there
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")) == list(range(1, 13))
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval/pass1")) == [0, 4, 8, 12]


@pytest.mark.slow
def test_torchrun_with_two_nodes_on_localhost_trains_as_one_run(tmp_path):
    """The multi-machine path (``torchrun --nnodes 2``, ``--num-nodes 2``), with both "nodes" on this machine:
    every rank starts at once (both reach the warm start together), and only rank 0 may open the store."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("rollout: {prompts_per_step: 4, group_size: 4}\nwarmstart: {max_steps: 5}\n"
                   "train: {steps: 2, minibatches: 2, eval_every: 1, eval_prompts: 8, eval_samples: 0}\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"  # a new store: a second process creating its tables would collide
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GSPO_BENCH_CACHE": str(tmp_path / "cache")}
    env.pop("MLFLOW_TRACKING_URI", None)
    port = _free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
         str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "gspo_bench", "run", "--preset",
         "smoke", "--config", str(cfg), "--algos", "grpo,gspo", "--devices", "1", "--num-nodes", "2",
         "--tracking-uri", uri, "--experiment", "nodes", "--no-progress"],
        cwd=tmp_path, env=env, stdout=open(tmp_path / f"node{rank}.log", "w"), stderr=subprocess.STDOUT)
        for rank in (0, 1)]
    for rank, node in enumerate(nodes):
        assert node.wait(timeout=600) == 0, (tmp_path / f"node{rank}.log").read_text()[-3000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("nodes").experiment_id])
    assert sorted(r.data.tags["algo"] for r in runs) == ["grpo", "gspo"]
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["processes"] == "2"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")) == [1, 2]
