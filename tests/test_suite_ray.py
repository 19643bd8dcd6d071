"""``suite --backend ray`` (``suite/ray_backend.py``): the address and resource rules on hand-made cluster rows, then
end to end on a real Ray cluster of this machine with 2 worker slots, started by hand as a user starts one
(``ray start --head``): the smoke suite's cells each FINISHED once with the serial backend's metric histories,
two drivers on one plan, a rerun that runs nothing, a worker killed mid-cell whose cell resumes from its
checkpoint, a driver stopped by a signal whose cells end KILLED, a second node that dies with the cells only it
could hold, and bad input as one line with exit 2; then on clusters a driver starts for itself (``--ray-address
local``): a raylet's death named in one line with its cells ended KILLED, and no process of the cluster left once
its driver is killed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from mlflow.entities import ViewType

from gspo_bench.bench.suite_ray import ray_head
from gspo_bench.cli.main import main
from gspo_bench.config import ConfigError, load_config
from gspo_bench.suite import ray_backend as rb
from gspo_bench.tracking.stores import open_store



@pytest.fixture(scope="module")
def ray_ready():
    """Ray importable here; a test that needs it skips saying why, except in CI (``GSPO_BENCH_CI=1``), whose test
    extra installs it, and which so fails instead."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        if os.environ.get("GSPO_BENCH_CI"):
            pytest.fail(f"CI installs the ray extra, yet: {e}")
        pytest.skip("needs the ray extra: pip install '.[ray]' (the test extra includes it)")

ROOT = Path(__file__).resolve().parent.parent
ALGOS, SEEDS = ("grpo", "gspo"), ("0", "1")
EXP = "suite-smoke"
# wall times and throughputs differ from run to run; everything else must match to the digit
VOLATILE = ("time/", "throughput/")


# -- the rules, on hand-made rows -------------------------------------------------------------------------------------
def _node(node_id: str, cpus: float, gpus: float = 0.0, alive: bool = True, ip: str = "10.0.0.1") -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": ip, "NodeManagerHostname": ip,
            "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}


def test_addresses_of_this_machine_and_of_others():
    me = socket.gethostname()
    for address in ("local", "auto", "127.0.0.1:6379", "localhost:6379", f"{me}:6379", "ray://127.0.0.1"):
        assert rb.on_this_machine(address), address
    for address in ("203.0.113.7:6379", "ray://203.0.113.7:10001", "ray://203.0.113.7"):
        assert not rb.on_this_machine(address), address
    assert rb.host_port("ray://head") == ("head", rb.CLIENT_PORT) and rb.host_port("[::1]:6379") == ("::1", 6379)
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        rb.host_port("head-without-port")


def test_address_falls_back_to_ray_address_then_local(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert rb.resolve_address(None) == "local"
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert rb.resolve_address(None) == "10.1.2.3:6379" and rb.resolve_address("local") == "local"


def test_a_file_store_is_one_other_machines_cannot_share():
    for uri in ("sqlite:///mlflow.db", "sqlite:////abs/m.db", "file:///tmp/mlruns", "mlruns"):
        assert rb.file_store(uri), uri
    for uri in ("http://mlflow:5000", "https://u:p@mlflow", "postgresql://u@db/mlflow", "databricks"):
        assert not rb.file_store(uri), uri


def test_cells_at_once_count_each_node_s_cpus_and_gpus():
    nodes = [_node("a", 8, 2), _node("b", 3), _node("c", 16, 4, alive=False)]
    assert rb.concurrent_cells(nodes, 1, 0) == 11  # 8 + 3; a dead node holds none
    assert rb.concurrent_cells(nodes, 2, 0) == 5  # 4 + 1
    assert rb.concurrent_cells(nodes, 1, 1) == 2  # node a's 2 GPUs; node b has none
    assert rb.concurrent_cells(nodes, 0.5, 0.5) == 4
    assert rb.dead_nodes(nodes) == {"c"}
    assert rb.fits(nodes[0], 8, 2) and not rb.fits(nodes[1], 1, 1)


def test_a_cell_s_resources_default_from_its_accelerator_and_devices():
    cpu = load_config("smoke", overrides={"train": {"accelerator": "cpu", "devices": 2}})
    gpu = load_config("smoke", overrides={"train": {"accelerator": "gpu", "devices": 2}})
    auto = load_config("smoke")
    assert rb.cell_resources(cpu, None, None, cluster_gpus=8) == (2.0, 0.0)  # one CPU per process
    assert rb.cell_resources(gpu, None, None, cluster_gpus=0) == (1.0, 2.0)
    assert rb.cell_resources(auto, None, None, cluster_gpus=0) == (1.0, 0.0)
    assert rb.cell_resources(auto, None, None, cluster_gpus=8) == (1.0, 1.0)  # auto: GPUs where there are some
    assert rb.cell_resources(auto, 4, 0.5, cluster_gpus=8) == (4.0, 0.5)  # the flags win


def test_a_cell_no_node_can_hold_is_one_line_naming_where_its_size_came_from():
    nodes = [_node("a", 2)]
    gpu = load_config("smoke", overrides={"train": {"accelerator": "gpu"}})
    with pytest.raises(ConfigError, match=r"^scenario smoke trains on GPUs .* --gpus-per-cell 0 with"):
        rb.check_fits("smoke", gpu, (1.0, 1.0), rb.RayRequest(), "local", nodes)
    with pytest.raises(ConfigError, match=r"^--cpus-per-cell: a cell asks for 4 CPU\(s\)"):
        rb.check_fits("smoke", load_config("smoke"), (4.0, 0.0), rb.RayRequest(cpus_per_cell=4), "local", nodes)
    rb.check_fits("smoke", load_config("smoke"), (2.0, 0.0), rb.RayRequest(), "local", nodes)


# -- a cluster of this machine, started by hand -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    """A driver's or the cluster's environment: one thread per process (the serial driver and the Ray workers
    compute alike), no token (Ray's default for a cluster started by `ray start` asks drivers for one), the
    session's warm-start cache (conftest), no store from outside."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return env


# a cluster's health checks of its nodes each second rather than each 3 s: a dead node is known dead within some
# 5 s rather than 15 (the tests that kill one wait that long)
QUICK_DEATH = {"RAY_health_check_period_ms": "1000"}


@pytest.fixture(scope="module")
def cluster(ray_ready):
    """``ray start --head --block`` with 2 CPUs and no GPU, its own temp folder and ports (as ``bench --suite-ray``
    starts it); stopped, with the processes it started, at the end of the module."""
    with ray_head(2, _env(**QUICK_DEATH)) as (address, _):
        yield SimpleNamespace(address=address)


def _argv(root: Path, *extra: str) -> list[str]:
    return ["suite", "--scenarios", "smoke", "--algos", ",".join(ALGOS), "--seeds", "2", "--set", "train.steps=2",
            "--no-progress", "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}", *extra]


def _suite(root: Path, *extra: str, out: str = "out", **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gspo_bench", *_argv(root, "--out", str(root / out), *extra)],
                            cwd=root, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _cell_runs(root: Path) -> list:
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name(EXP)
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("kind") in (None, "claim")]


def _claims(root: Path) -> list:
    """Every claim run of the store, deleted ones too."""
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name(EXP)
    return client.search_runs([exp.experiment_id], "tags.kind = 'claim'", run_view_type=ViewType.ALL)


def _histories(root: Path) -> dict:
    """{(algo, seed): {metric: [(step, value)]}} of the FINISHED cell runs."""
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return {(r.data.tags["algo"], r.data.tags["seed"]):
            {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
             for k in r.data.metrics if not k.startswith(VOLATILE)}
            for r in _cell_runs(root) if r.info.status == "FINISHED" and "kind" not in r.data.tags}


def _each_cell_once(root: Path) -> None:
    runs = _cell_runs(root)
    assert not [r for r in runs if r.data.tags.get("kind") == "claim"]  # every claim released
    cells = sorted((r.data.tags["algo"], r.data.tags["seed"], r.info.status) for r in runs)
    assert cells == sorted((a, s, "FINISHED") for a in ALGOS for s in SEEDS)


@pytest.fixture(scope="module")
def serial_started(tmp_path_factory):
    """The same suite on the serial backend, in a process of its own with one thread, as the Ray workers: its
    folder and process, started and left running (the cluster starts, and the Ray drivers run, beside it)."""
    root = tmp_path_factory.mktemp("serial")
    proc = _suite(root)
    yield root, proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def serial(serial_started):
    """The serial suite, ended: its folder, histories and ``suite.json``."""
    root, proc = serial_started
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-3000:]
    return SimpleNamespace(root=root, histories=_histories(root),
                           doc=json.loads((root / "out" / "suite.json").read_text()))


@pytest.fixture(scope="module")
def two_drivers(serial_started, cluster, tmp_path_factory):
    """Two ``--backend ray`` drivers started together on one plan, store and cluster."""
    root = tmp_path_factory.mktemp("ray")
    procs = [_suite(root, "--backend", "ray", "--ray-address", cluster.address, "--cpus-per-cell", "1",
                    out=f"out{i}") for i in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    return SimpleNamespace(root=root, outs=outs, codes=[p.returncode for p in procs])


@pytest.mark.slow
def test_two_drivers_on_a_ray_cluster_run_each_cell_once_with_the_serial_histories(two_drivers, serial):
    d = two_drivers
    _each_cell_once(d.root)
    ran = [line for o in d.outs for line in o.splitlines() if ": FINISHED in" in line]
    assert len(ran) == 4, "\n".join(o[-3000:] for o in d.outs)
    assert all("2 at a time" in o and "ETA: ~" in o and "on 2 workers" in o for o in d.outs), d.outs[0][-3000:]
    got = _histories(d.root)
    assert set(got) == set(serial.histories) and got == serial.histories  # every metric at every step
    assert 0 in d.codes  # the last to end saw every cell FINISHED


@pytest.mark.slow
def test_a_ray_suite_writes_the_serial_suite_s_outputs(two_drivers, serial):
    i = two_drivers.codes.index(0)
    out = two_drivers.root / f"out{i}"
    doc = json.loads((out / "suite.json").read_text())
    assert (doc["backend"], doc["workers"], doc["cells"], doc["finished"]) == ("ray", 2, 4, 4)
    assert doc["ranking"] == serial.doc["ranking"]  # the same finals, so the same means and ranks
    assert (serial.doc["backend"], serial.doc["workers"]) == ("local", 1)
    summary = (out / "summary.md").read_text()
    assert "cells run as Ray tasks, 2 at a time" in summary
    ranking = lambda text: [ln for ln in text.splitlines() if ln.startswith("| `")]  # noqa: E731
    assert ranking(summary) == ranking((serial.root / "out" / "summary.md").read_text())
    for name in ("leaderboard.md", "report.md", "runs.csv.gz"):
        assert (out / "smoke" / name).is_file() and (serial.root / "out" / "smoke" / name).is_file(), name


@pytest.mark.slow
def test_rerunning_a_finished_ray_suite_runs_nothing(two_drivers, cluster):
    before = sorted(r.info.run_id for r in _cell_runs(two_drivers.root))
    proc = _suite(two_drivers.root, "--backend", "ray", "--ray-address", cluster.address, out="again")
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-3000:]
    assert "4 already done, 0 to run" in out and out.count("already FINISHED") == 4 and ": FINISHED in" not in out
    assert sorted(r.info.run_id for r in _cell_runs(two_drivers.root)) == before


def _wait_for_checkpoint(proc: subprocess.Popen, root: Path):
    """The first RUNNING cell run with a checkpoint, polled while ``proc`` (a driver) runs."""
    t0 = time.time()
    while True:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.time() - t0 < 600, "no cell reached a checkpoint"
        if (root / "mlflow.db").is_file():
            # under the store's lock: the driver may be making its tables
            client, exp = open_store(f"sqlite:///{root / 'mlflow.db'}", EXP)
            runs = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'") if exp else []
            run = next((r for r in runs if "kind" not in r.data.tags and "gspo_bench.checkpoint_step" in r.data.tags),
                       None)
            if run is not None:
                return run
        time.sleep(0.05)


@pytest.mark.slow
def test_a_worker_killed_mid_cell_resumes_its_cell_from_its_checkpoint(cluster, tmp_path):
    # more steps and a checkpoint every 2: a killed cell has a checkpoint and steps left to run
    proc = _suite(tmp_path, "--backend", "ray", "--ray-address", cluster.address, "--set", "train.steps=8",
                  "--set", "train.checkpoint_every=2")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    victim = _wait_for_checkpoint(proc, tmp_path)
    pid = int(victim.data.tags["gspo_bench.pid"])
    assert pid != proc.pid  # a Ray worker, not the driver
    os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-3000:]
    _each_cell_once(tmp_path)
    [again] = [r for r in _cell_runs(tmp_path) if (r.data.tags["algo"], r.data.tags["seed"])
               == (victim.data.tags["algo"], victim.data.tags["seed"])]
    assert again.info.run_id == victim.info.run_id  # the same MLflow run, continued
    assert re.search(rf"continuing run {victim.info.run_id} from its checkpoint at RL step [2468]\b", out), out
    assert out.count("continuing run") == 1 and out.count(": FINISHED in") == 4  # no other cell ran again
    client = mlflow.MlflowClient(uri)
    steps = [m.step for m in client.get_metric_history(victim.info.run_id, "reward/mean")]
    assert sorted(steps) == list(range(1, 9))  # every step once: the resumed part logged nothing twice


@pytest.mark.slow
# twice: alone, for the second signal must land mid-step, and another test's load shifts the steps it times; once:
# another test's load only slows the cells, which leaves the signal more time to land
@pytest.mark.parametrize("signum, times", [pytest.param(signal.SIGTERM, 1, id="SIGTERM-at-the-step-s-end"),
                                           pytest.param(signal.SIGINT, 2, marks=pytest.mark.alone,
                                                        id="SIGINT-twice-at-once")])
def test_a_driver_stopped_by_a_signal_ends_its_cells_killed_and_releases_their_claims(cluster, tmp_path, signum,
                                                                                       times):
    # once: cells of 40 steps, so that the signal (seen by the driver within a second) lands before a cell in
    # flight ends by itself (8 steps take 2-4 s here); twice: RL steps long enough (1000 prompts, some 6 s here)
    # that the second signal lands mid-step
    slow = (("--set", "rollout.prompts_per_step=1000", "--set", "train.checkpoint_every=1") if times == 2 else
            ("--set", "train.steps=40"))
    proc = _suite(tmp_path, "--backend", "ray", "--ray-address", cluster.address, "--set", "train.steps=8",
                  "--set", "train.checkpoint_every=2", *slow)
    _wait_for_checkpoint(proc, tmp_path)
    proc.send_signal(signum)
    if times == 2:
        time.sleep(1.5)  # past the driver's next look (each second)
        proc.send_signal(signum)
    out = proc.communicate(timeout=300)[0]
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum and out.count(f"stopped by {name}") == 1, out[-3000:]
    assert "Traceback" not in out and "resume: run the same command again" in out, out[-3000:]
    runs = [r for r in _cell_runs(tmp_path) if "kind" not in r.data.tags]
    assert runs and not [r for r in runs if r.info.status == "RUNNING"], out[-3000:]
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert killed and all(f"run {r.info.run_id} marked KILLED" in out for r in killed), out[-3000:]
    # a cell that finished its RL step is named as the serial backend names it; one whose worker the second signal
    # killed mid-step, by the driver
    at_step_end = rf"{name} at RL step \d+; (resume from RL step \d+ with --resume|no checkpoint yet)"
    at_once = f"{name} stopped the suite's driver at once: its Ray worker was killed mid-step"
    reasons = [r.data.tags["killed_reason"] for r in killed]
    assert all(re.fullmatch(at_step_end, x) or (times == 2 and x == at_once) for x in reasons), reasons
    assert times == 1 or at_once in reasons, reasons
    claims = _claims(tmp_path)
    assert claims and not [c for c in claims if c.info.status == "RUNNING"]  # each released, none left RUNNING


@pytest.mark.slow
def test_a_node_that_dies_with_no_node_left_for_its_cells_ends_each_killed_in_one_line(cluster, tmp_path):
    # a second node of the cluster, the only one that holds a cell of 3 CPUs (the head has 2)
    log_path = tmp_path / "node.log"
    with open(log_path, "w") as log:
        node = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--address", cluster.address,
                                 "--block", "--num-cpus", "3", "--num-gpus", "0", "--disable-usage-stats",
                                 "--object-store-memory", str(100 * 2**20), "--dashboard-agent-listen-port",
                                 str(_free_port()), "--metrics-export-port", str(_free_port())],
                                env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc = None
    try:
        t0 = time.time()
        while "Ray runtime started" not in log_path.read_text():
            assert node.poll() is None and time.time() - t0 < 120, log_path.read_text()[-3000:]
            time.sleep(0.2)
        proc = _suite(tmp_path, "--backend", "ray", "--ray-address", cluster.address, "--cpus-per-cell", "3",
                      "--set", "train.steps=8", "--set", "train.checkpoint_every=2")
        victim = _wait_for_checkpoint(proc, tmp_path)
        for pid in (node.pid, *_family(node.pid)):  # the node dies: its raylet, its workers, all of it
            os.kill(pid, signal.SIGKILL)
        out = proc.communicate(timeout=300)[0]
    finally:
        for pid in (node.pid, *_family(node.pid)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        node.wait()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    label = f"smoke / {victim.data.tags['algo']} / seed {victim.data.tags['seed']}"
    [line] = [ln for ln in out.splitlines() if ln.startswith(f"[error] {label}:")]
    assert "its Ray node" in line and f"run {victim.info.run_id} marked KILLED" in line, out[-3000:]
    # each cell says so in its one line, rather than waiting for a node that will not come
    assert out.count("; no node left in the cluster can run it") == 4, out[-3000:]
    runs = [r for r in _cell_runs(tmp_path) if "kind" not in r.data.tags]
    assert [(r.info.run_id, r.info.status) for r in runs] == [(victim.info.run_id, "KILLED")], out[-3000:]
    assert "its Ray node" in runs[0].data.tags["killed_reason"]
    assert not [c for c in _claims(tmp_path) if c.info.status == "RUNNING"]


# -- a cluster the driver starts for itself (--ray-address local) -----------------------------------------------------
def _family(pid: int) -> dict[int, tuple[str, str]]:
    """The process ``pid`` started, and theirs: {pid: (name, start time)} (Linux ``/proc``)."""
    table = {}
    for p in Path("/proc").iterdir():
        try:
            text = (p / "stat").read_text()
        except (OSError, ValueError):
            continue
        if p.name.isdigit():
            head, rest = text.rsplit(")", 1)
            fields = rest.split()
            table[int(p.name)] = (int(fields[1]), head.split("(", 1)[1], fields[19])
    family, grew = {pid}, True
    while grew:
        grew = False
        for child, (parent, _, _) in table.items():
            if parent in family and child not in family:
                family.add(child)
                grew = True
    return {p: table[p][1:] for p in family - {pid}}


def _still_there(family: dict[int, tuple[str, str]]) -> dict[int, str]:
    """The processes of ``family`` still running (the same pid and start time): {pid: name}."""
    left = {}
    for pid, (name, start) in family.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            left[pid] = name
    return left


def _gone_within(family: dict[int, tuple[str, str]], seconds: float) -> dict[int, str]:
    t0 = time.time()
    while (left := _still_there(family)) and time.time() - t0 < seconds:
        time.sleep(0.5)
    return left


def _local_suite(root: Path) -> subprocess.Popen:
    """A driver of a cluster it starts (its environment is the cluster's)."""
    return _suite(root, "--backend", "ray", "--ray-address", "local", "--cpus-per-cell", "1", "--set",
                  "train.steps=8", "--set", "train.checkpoint_every=2", **QUICK_DEATH)


@pytest.mark.slow
def test_a_local_cluster_s_processes_end_with_its_driver_killed_with_sigkill(ray_ready, tmp_path):
    proc = _local_suite(tmp_path)
    _wait_for_checkpoint(proc, tmp_path)  # the cluster and the workers of its cells at work
    family = _family(proc.pid)
    assert "raylet" in {name for name, _ in family.values()}, family
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone_within(family, 30) == {}  # nothing of the cluster outlives its driver


@pytest.mark.slow
def test_a_dead_raylet_is_named_in_one_line_and_its_cells_end_killed(ray_ready, tmp_path):
    proc = _local_suite(tmp_path)
    victim = _wait_for_checkpoint(proc, tmp_path)
    family = _family(proc.pid)
    [raylet] = [pid for pid, (name, _) in family.items() if name == "raylet"]
    for pid in (raylet, *_family(raylet)):  # the cluster's one node dies: its raylet, and its workers with it
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert "died 4 times" not in out, out[-3000:]
    label = f"smoke / {victim.data.tags['algo']} / seed {victim.data.tags['seed']}"
    [line] = [ln for ln in out.splitlines() if ln.startswith(f"[error] {label}:")]
    assert "its Ray node" in line and f"run {victim.info.run_id} marked KILLED" in line, out[-3000:]
    runs = [r for r in _cell_runs(tmp_path) if "kind" not in r.data.tags]
    assert not [r for r in runs if r.info.status == "RUNNING"], out[-3000:]
    [run] = [r for r in runs if r.info.run_id == victim.info.run_id]
    assert run.info.status == "KILLED" and "Ray node" in run.data.tags["killed_reason"]
    assert not [c for c in _claims(tmp_path) if c.info.status == "RUNNING"]
    assert _gone_within(family, 30) == {}  # the driver's cluster stopped with it


# -- bad input --------------------------------------------------------------------------------------------------------
def _one_line_exit_2(argv: list[str], root: Path, capsys) -> str:
    assert main(argv) == 2
    text = capsys.readouterr().out.strip()
    assert "error" in text and len(text.splitlines()) == 1, text
    assert not (root / "mlflow.db").exists()  # nothing started
    return text


def test_an_unreachable_address_is_one_line(ray_ready, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    text = _one_line_exit_2(_argv(tmp_path, "--backend", "ray", "--ray-address", f"127.0.0.1:{_free_port()}"),
                            tmp_path, capsys)
    assert "does not answer" in text and "ray start --head" in text


def test_a_sqlite_store_with_an_address_of_another_machine_is_one_line_naming_the_alternatives(ray_ready, tmp_path,
                                                                                                monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    text = _one_line_exit_2(_argv(tmp_path, "--backend", "ray", "--ray-address", "203.0.113.7:6379"), tmp_path,
                            capsys)
    assert "sqlite:///" in text and "mlflow server" in text and "PostgreSQL" in text


@pytest.mark.slow
def test_gpus_per_cell_on_a_cluster_without_gpus_is_one_line(cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    text = _one_line_exit_2(_argv(tmp_path, "--backend", "ray", "--ray-address", cluster.address,
                                  "--gpus-per-cell", "1"), tmp_path, capsys)
    assert "--gpus-per-cell 1: no node of the Ray cluster" in text and "0 GPU(s) in all" in text


@pytest.mark.slow
def test_joining_keeps_the_command_s_signal_handlers(cluster, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    mine = lambda signum, frame: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, mine)
    try:
        backend = rb.connect(rb.RayRequest(cluster.address), [("smoke", load_config("smoke"), "sqlite:///x.db")])
        try:
            assert signal.getsignal(signal.SIGTERM) is mine  # Ray's own would exit at once, without a summary
            assert backend.workers == 2
        finally:
            backend.close()
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("extra, needle", [
    (["--cpus-per-cell", "1"], "--cpus-per-cell applies only with --backend ray"),
    (["--ray-address", "local"], "--ray-address applies only with --backend ray"),
    (["--backend", "ray", "--cpus-per-cell", "0"], "--cpus-per-cell 0 must be > 0"),
    (["--backend", "ray", "--gpus-per-cell", "-1"], "--gpus-per-cell -1 must be")])
def test_ray_options_without_the_ray_backend_or_out_of_range_are_one_line(extra, needle, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.chdir(tmp_path)
    assert needle in _one_line_exit_2(_argv(tmp_path, *extra), tmp_path, capsys)


@pytest.mark.slow
def test_a_dry_run_on_a_local_ray_cluster_plans_over_its_workers(ray_ready, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", *_argv(tmp_path, "--backend", "ray", "--ray-address",
                                                                      "local", "--cpus-per-cell", "1", "--dry-run")],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = re.search(r"cells run as Ray tasks on the cluster at local \(1 node\(s\), (\d+) CPU\(s\).*: 1 CPU\(s\) and 0 "
                  r"GPU\(s\) per cell, (\d+) at a time", proc.stdout)
    assert m and m.group(1) == m.group(2), proc.stdout
    assert "dry run: nothing run, nothing written" in proc.stdout and not (tmp_path / "mlflow.db").exists()
