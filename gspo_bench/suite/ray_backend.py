"""``suite --backend ray``: each cell a Ray task on a cluster, so the suite spreads over many machines and GPUs.

The driver (the ``suite`` command) plans as ``--backend local`` does, joins the cluster at ``--ray-address``
(else ``$RAY_ADDRESS``, else ``local``: a cluster of this machine alone, started for the command and stopped
after it), submits every to-do cell as one task asking for ``--cpus-per-cell`` CPUs and ``--gpus-per-cell``
GPUs (by default from the scenario's ``train.accelerator`` and ``train.devices``: a GPU run asks for its
devices, a CPU run for one CPU per process) and takes each outcome as it ends. The bar, the lines, the ETA
(over ``workers``: the cells the cluster's nodes can hold at once) and the outputs are ``run.py``'s.

A task runs ``backends.run_cell``: the cell is claimed in the tracking store (a claim run, the same one
``--backend local`` drivers take, so any mix of drivers on one plan and store runs each cell once), then run
with ``resume=True``. Its worker logs to the store the driver names (the driver's resolved tracking URI, in
the cell's config) from the driver's working folder where that folder exists on the worker's machine, so
relative paths (a task YAML, a sqlite file) mean what they mean to the driver.

A worker that dies mid-cell (``kill -9``, out of memory, a node that leaves the cluster) is retried by Ray
(``RETRIES`` times). The retry takes the cell over through the claims: the dead worker's claim is dead (its
process is gone on its host, or its node is one Ray reports dead: ``tracking.cells.release_dead_claims``), and
``runner.run(resume=True)`` marks the orphaned run KILLED and continues it from its last checkpoint as the same
MLflow run. Checkpoints are the run's artifacts: on several machines the artifact store must be one every
worker reaches (an ``mlflow server`` with ``--artifacts-destination``, or ``tracking.artifact_location`` on
shared storage).

A signal to the driver stops it as it stops ``--backend local`` (exit 130 / 143 and one summary; ``ray.init``'s own
SIGTERM handler is put back to the command's), and Ray ends a driver's tasks with it: their runs are orphans
that the same command, run again, continues from their checkpoints.

Checked before any work, each a ConfigError (one line, exit 2): Ray installed; an address that answers; a
tracking store that is a file on this machine (sqlite) refused when the address, or the cluster it joins,
spans other machines; a cell's CPUs and GPUs available on at least one node; one machine per cell
(``train.num_nodes`` 1).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from gspo_bench.config import CONNECT_TIMEOUT_S, ConfigError, RunConfig
from gspo_bench.config.names import GPU_ACCELERATORS
from gspo_bench.suite.backends import Cell, CellOutcome, run_cell
from gspo_bench.tracking.cells import NODE_TAG
from gspo_bench.tracking.redact import redact
from gspo_bench.tracking.stores import sqlite_path
from gspo_bench.train.interrupts import Interrupted

RETRIES = 3  # Ray's own default for tasks: a cell whose worker dies is run again up to 3 more times
LOCAL = "local"
CLIENT_PORT = 10001  # Ray Client's port, for a ray:// address without one


@dataclass(frozen=True)
class RayRequest:
    """The suite's Ray options; None: the default (module docstring)."""

    address: str | None = None
    cpus_per_cell: float | None = None
    gpus_per_cell: float | None = None


def resolve_address(given: str | None) -> str:
    """``--ray-address``, else ``$RAY_ADDRESS``, else ``local``."""
    return (given or os.environ.get("RAY_ADDRESS") or LOCAL).strip()


def host_port(address: str) -> tuple[str, int] | None:
    """The host and port a ``host:port`` or ``ray://host[:port]`` address names; None for ``local`` / ``auto``."""
    if address in (LOCAL, "auto"):
        return None
    client = address.startswith("ray://")
    rest = address[len("ray://"):] if client else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        if client:
            return rest.strip("[]"), CLIENT_PORT
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT (the head's GCS port, 6379 by default), "
                          "ray://HOST[:PORT], auto or local")
    return host.strip("[]"), int(port)


def on_this_machine(address: str) -> bool:
    """Whether the address can only name a cluster started on this machine (``local``, ``auto``, a loopback host or
    this host's own name or address); its nodes may still span machines, which ``connect`` checks once joined."""
    hp = host_port(address)
    if hp is None:
        return True
    host = hp[0].lower()
    if host in ("localhost", "::1") or host.startswith("127."):
        return True
    me = socket.gethostname()
    if host in (me.lower(), socket.getfqdn().lower()):
        return True
    try:
        return socket.gethostbyname(host) in ("127.0.0.1", socket.gethostbyname(me))
    except OSError:  # a name this machine cannot resolve: not this machine
        return False


def file_store(uri: str) -> bool:
    """A tracking store that is a file on this machine: sqlite, or MLflow's file store (a ``file:`` URI or a
    plain path)."""
    scheme = uri.split(":", 1)[0].lower() if "://" in uri or uri.startswith("file:") else ""
    return sqlite_path(uri) is not None or scheme == "file" or (scheme == "" and uri != "databricks")


def shared_store_needed(address: str, uri: str, why: str) -> ConfigError:
    return ConfigError(f"--backend ray --ray-address {address}: {why}, but the tracking store {redact(uri)} is a "
                       "file on this machine that workers elsewhere cannot share; use an MLflow tracking server "
                       "(mlflow server --backend-store-uri postgresql://... --artifacts-destination SHARED, then "
                       "--tracking-uri http://HOST:5000) or PostgreSQL (--tracking-uri postgresql://USER@HOST/DB "
                       "with --set tracking.artifact_location=SHARED)")


def probe_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A ``host:port`` address must take a TCP connection within ``timeout_s``: a closed port or an unknown host is
    one line at once, rather than Ray's own minute of retries."""
    hp = host_port(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"Ray cluster at {address} does not answer ({e.strerror or e}): start one with `ray start "
                          "--head` (its address is printed), or use --ray-address local") from None


TOKEN_HINT = ("; the cluster asks for its token (Ray's token authentication, on by default for `ray start`): set "
              "RAY_AUTH_MODE=token and give the token (~/.ray/auth_token or RAY_AUTH_TOKEN)")


def _wants_token(e: BaseException) -> bool:
    """Whether ``e`` (or an error it was raised from) is Ray refusing a driver without the cluster's token."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if "AuthToken" in str(e) or "AuthenticationError" in type(e).__name__:
            return True
        e = e.__cause__ or e.__context__
    return False


def alive(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n.get("Alive")]


def dead_nodes(nodes: list[dict]) -> set[str]:
    """The ids of the nodes Ray reports dead (``ray.nodes()`` rows)."""
    return {n["NodeID"] for n in nodes if not n.get("Alive")}


def fits(node: dict, cpus: float, gpus: float) -> bool:
    have = node.get("Resources", {})
    return have.get("CPU", 0.0) + 1e-9 >= cpus and have.get("GPU", 0.0) + 1e-9 >= gpus


def concurrent_cells(nodes: list[dict], cpus: float, gpus: float) -> int:
    """How many cells of ``cpus`` CPUs and ``gpus`` GPUs the alive nodes hold at once (each node: its CPUs / cpus,
    and its GPUs / gpus where cells take GPUs, whichever is fewer)."""
    total = 0
    for n in alive(nodes):
        have = n.get("Resources", {})
        per = math.floor(have.get("CPU", 0.0) / cpus + 1e-9)
        if gpus > 0:
            per = min(per, math.floor(have.get("GPU", 0.0) / gpus + 1e-9))
        total += per
    return total


def cell_resources(cfg: RunConfig, cpus: float | None, gpus: float | None, cluster_gpus: float) -> tuple[float, float]:
    """(CPUs, GPUs) a cell of ``cfg`` asks for: the flags where given; else GPUs for each device of a run on GPUs
    (``train.accelerator`` gpu, or auto on a cluster with GPUs) and one CPU, or one CPU per device of a CPU run."""
    t = cfg.train
    on_gpu = t.accelerator in GPU_ACCELERATORS or (t.accelerator == "auto" and cluster_gpus > 0)
    g = float(gpus) if gpus is not None else (float(t.devices) if on_gpu else 0.0)
    c = float(cpus) if cpus is not None else (1.0 if g > 0 else float(t.devices))
    return c, g


def _nodes_line(nodes: list[dict]) -> str:
    res = [n.get("Resources", {}) for n in alive(nodes)]
    cpus, gpus = [r.get("CPU", 0.0) for r in res], [r.get("GPU", 0.0) for r in res]
    return (f"{len(res)} node(s), {sum(cpus):g} CPU(s) and {sum(gpus):g} GPU(s) in all, at most "
            f"{max(cpus, default=0):g} CPU(s) and {max(gpus, default=0):g} GPU(s) on one")


def check_fits(name: str, cfg: RunConfig, shape: tuple[float, float], req: RayRequest, address: str,
               nodes: list[dict]) -> None:
    """ConfigError unless some alive node holds a cell of ``shape``; the line names the flag or setting it came
    from."""
    cpus, gpus = shape
    if any(fits(n, cpus, gpus) for n in alive(nodes)):
        return
    where = f"no node of the Ray cluster at {address} has them ({_nodes_line(nodes)})"
    if gpus > 0 and not any(fits(n, 0.0, gpus) for n in alive(nodes)):
        if req.gpus_per_cell is not None:
            raise ConfigError(f"--gpus-per-cell {gpus:g}: {where}; leave it out on a cluster without GPUs")
        raise ConfigError(f"scenario {name} trains on GPUs (train.accelerator={cfg.train.accelerator}, train.devices="
                          f"{cfg.train.devices}), so each cell asks for {gpus:g} GPU(s): {where}; --gpus-per-cell 0 "
                          "with --set train.accelerator=cpu runs it on CPUs")
    flag = ("--cpus-per-cell" if req.cpus_per_cell is not None else
            f"train.devices={cfg.train.devices} of scenario {name}")
    raise ConfigError(f"{flag}: a cell asks for {cpus:g} CPU(s) and {gpus:g} GPU(s) on one node: {where}")


@contextlib.contextmanager
def _stderr_muted():
    """File descriptor 2 into a scratch file for the block (C++ libraries write there directly), then back."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def _signals_kept():
    """The SIGINT and SIGTERM handlers as they were before the block: ``ray.init`` sets its own for SIGTERM (exit
    at once), which would take the command's clean stop (``train.interrupts``) away."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            if handler is not None:
                signal.signal(s, handler)


# -- in the worker ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _in_folder(folder: str | None):
    """In the driver's working folder where it exists here (a worker starts where its node's Ray started)."""
    before = os.getcwd()
    moved = bool(folder) and Path(folder).is_dir()
    if moved:
        os.chdir(folder)
    try:
        yield
    finally:
        if moved:
            os.chdir(before)


def release_dead(cell: Cell, dead: set[str], log: Callable[[str], None]) -> None:
    """The cell's claims held on nodes Ray reports dead are released and their runs marked KILLED, so this task
    can take the cell over (their heartbeats would hold it for ``lifecycle.ORPHAN_AFTER_S``)."""
    import mlflow

    from gspo_bench.tracking import cells

    client = mlflow.MlflowClient(cell.uri)
    exp = client.get_experiment_by_name(cell.experiment)
    if exp is None:
        return
    reason = "orphaned: its Ray node left the cluster"
    for run_id in cells.release_dead_claims(client, exp.experiment_id, cell.scenario, cell.algo, cell.seed, dead,
                                            reason):
        log(f"[resume] {cell.label}: run {run_id} was held on a Ray node that left the cluster: marked KILLED")


def cell_task(cell: Cell, folder: str | None) -> CellOutcome:
    """One cell in a Ray worker: claims of dead nodes released, then ``run_cell`` with this worker's node as the
    claim's owner; what it logs comes back with its outcome."""
    import ray

    lines: list[str] = []
    with _in_folder(folder):
        dead = dead_nodes(ray.nodes())
        if dead:
            release_dead(cell, dead, lines.append)
        out = run_cell(cell, lines.append, owner={NODE_TAG: ray.get_runtime_context().get_node_id()})
    return replace(out, lines=tuple(lines))


# -- on the driver ---------------------------------------------------------------------------------------------------
def _pinned(cell: Cell) -> Cell:
    """The cell as a worker runs it: the tracking URI the driver resolved, a sqlite file's path absolute."""
    path = sqlite_path(cell.uri)
    uri = f"sqlite:///{path.resolve()}" if path is not None else cell.uri
    return replace(cell, uri=uri, cfg=replace(cell.cfg, tracking=replace(cell.cfg.tracking, tracking_uri=uri)))


class RayBackend:
    """A joined Ray cluster; ``run`` submits the cells and yields their outcomes as they end."""

    name = "ray"

    def __init__(self, address: str, shapes: dict[str, tuple[float, float]], nodes: list[dict]):
        self.address, self.shapes, self.nodes = address, shapes, nodes
        self.workers = max(1, min(concurrent_cells(nodes, *s) for s in shapes.values())) if shapes else 1

    def describe(self) -> str:
        shapes = sorted(set(self.shapes.values()))
        per = "; ".join(f"{c:g} CPU(s) and {g:g} GPU(s)" for c, g in shapes)
        return (f"cells run as Ray tasks on the cluster at {self.address} ({_nodes_line(self.nodes)}): {per} per "
                f"cell, {self.workers} at a time; a task whose worker dies is retried up to {RETRIES} times")

    def run(self, cells: list[Cell], log: Callable[[str], None],
            on_start: Callable[[int], None] | None = None) -> Iterator[tuple[int, CellOutcome]]:
        import ray

        from gspo_bench.tracking import stores

        cells = [_pinned(c) for c in cells]
        # each experiment made here first: a new one's artifacts default to ./mlruns of this folder, not a worker's
        for c in {(c.uri, c.experiment, c.cfg.tracking.artifact_location): c for c in cells}.values():
            stores.ensure_experiment(c.uri, c.experiment, c.cfg.tracking.artifact_location)
        task = ray.remote(cell_task)
        folder = os.getcwd()
        refs = {}
        for i, c in enumerate(cells):
            cpus, gpus = self.shapes[c.scenario]
            ref = task.options(num_cpus=cpus, num_gpus=gpus, max_retries=RETRIES, name=c.label).remote(c, folder)
            refs[ref] = i
        pending = list(refs)
        while pending:
            # a second at a time, so a signal to the driver is handled between waits
            try:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            except SystemError as e:  # a signal's handler raised inside Ray's wait, which wraps what it raised
                if isinstance(e.__cause__, Interrupted):
                    raise e.__cause__ from None
                raise
            for ref in done:
                i = refs[ref]
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as e:  # the task raised (before its run: the store), or its worker
                    # died RETRIES + 1 times
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                    how = ("its Ray task raised" if isinstance(e, ray.exceptions.RayTaskError) else
                           f"its Ray worker died {RETRIES + 1} times")
                    out = CellOutcome("FAILED", seconds=cells[i].estimate_s, lines=(
                        f"[error] {cells[i].label}: {how}: {type(e).__name__}: {first}",))
                yield i, out

    def close(self) -> None:
        import ray

        ray.shutdown()


def connect(req: RayRequest, scenarios: list[tuple[str, RunConfig, str]]) -> RayBackend:
    """Join (or, for ``local``, start) the cluster and check it can run every scenario's cells (module docstring);
    ``scenarios``: (name, config, tracking URI) of each."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'gspo-bench[ray]' (in a clone: pip install "
                          "'.[ray]')") from None
    address = resolve_address(req.address)
    files = [uri for _, _, uri in scenarios if file_store(uri)]
    if files and not on_this_machine(address):
        raise shared_store_needed(address, files[0], "that address is another machine")
    for name, cfg, _ in scenarios:
        if cfg.train.num_nodes != 1:
            raise ConfigError(f"scenario {name}: train.num_nodes={cfg.train.num_nodes}: --backend ray runs each cell "
                              "as one task on one machine; use train.num_nodes=1 (and train.devices for its GPUs)")
    probe_address(address)
    options = dict(log_to_driver=False, logging_level=logging.ERROR)
    if address == LOCAL:
        options["include_dashboard"] = False
    try:
        # joining a cluster that refuses this driver, Ray's C++ client logs a line a second for 20 s to stderr
        # (not through Python's logging); the one line below says it instead
        with contextlib.nullcontext() if address == LOCAL else _stderr_muted(), _signals_kept():
            ray.init(address=address, **options)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ConfigError(f"Ray cluster at {address} cannot be joined: {type(e).__name__}: {first}"
                          + (TOKEN_HINT if _wants_token(e) else "")) from None
    try:
        nodes = ray.nodes()
        machines = {n.get("NodeManagerAddress") for n in alive(nodes)}
        if files and len(machines) > 1:
            raise shared_store_needed(address, files[0], f"its cluster spans {len(machines)} machines")
        cluster_gpus = max((n.get("Resources", {}).get("GPU", 0.0) for n in alive(nodes)), default=0.0)
        shapes = {}
        for name, cfg, _ in scenarios:
            shapes[name] = cell_resources(cfg, req.cpus_per_cell, req.gpus_per_cell, cluster_gpus)
            check_fits(name, cfg, shapes[name], req, address, nodes)
        return RayBackend(address, shapes, nodes)
    except BaseException:
        ray.shutdown()
        raise
