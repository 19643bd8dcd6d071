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

A claim names the driver that scheduled it (``cells.DRIVER_TAG``), so the driver itself ends what its tasks
leave behind, on any node: a task that ends without its outcome (its worker dead ``RETRIES + 1`` times, its
node's raylet gone) has its claim ended and its run marked KILLED with the reason, in the one line the driver
prints for it. Every ``NODE_LOOK_S`` the driver asks Ray which nodes died: the claims held there end the same
way, and a cell that no node left can hold (a cluster of one node whose raylet died) ends KILLED at once rather
than waiting for a node that will not come.

A signal to the driver stops it as it stops ``--backend local`` (``train.interrupts``; ``ray.init``'s own SIGTERM
handler is put back to the command's): the first SIGINT or SIGTERM cancels the tasks (``ray.cancel``), which Ray
delivers to each running worker as a SIGINT, named there as the driver's signal; each cell in flight finishes its
RL step, saves a checkpoint and ends KILLED (``killed_reason`` as the serial backend writes it) with its claim,
and the command exits 130 / 143 with one summary. A second signal stops at once: the workers are killed and the
driver marks their runs and claims KILLED itself. The same command, run again, continues the stopped cells from
their checkpoints.

``--ray-address local`` starts Ray's own cluster of this machine (``ray.init``), whose processes Ray ties to the
driver's life, except the agents its raylet starts; a watchdog process (``WATCHDOG``, Linux) follows every
process of that cluster and kills what is left of it once the driver is gone, however it went (``kill -9``
included).

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
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from gspo_bench.config import CONNECT_TIMEOUT_S, ConfigError, RunConfig
from gspo_bench.config.names import GPU_ACCELERATORS
from gspo_bench.suite.backends import Cell, CellOutcome, run_cell
from gspo_bench.tracking.cells import DRIVER_TAG, NODE_TAG, cell_key
from gspo_bench.tracking.redact import redact
from gspo_bench.tracking.stores import sqlite_path
from gspo_bench.train import interrupts as signals
from gspo_bench.train.interrupts import Interrupted

RETRIES = 3  # Ray's own default for tasks: a cell whose worker dies is run again up to 3 more times
LOCAL = "local"
CLIENT_PORT = 10001  # Ray Client's port, for a ray:// address without one
NODE_LOOK_S = 5.0  # how often the driver asks Ray which nodes died while cells run
STOP_KEY = "gspo_bench.stop."  # + a driver's id: the signal that stopped it, in the cluster's key-value store
AT_ONCE_WAIT_S = 10.0  # a second signal: how long the driver waits for the killed workers before it marks their runs


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
    from gspo_bench.tracking import cells
    from gspo_bench.tracking.client import client as tracking_client

    client = tracking_client(cell.uri)
    exp = client.get_experiment_by_name(cell.experiment)
    if exp is None:
        return
    reason = "orphaned: its Ray node left the cluster"
    for run_id in cells.release_dead_claims(client, exp.experiment_id, cell.scenario, cell.algo, cell.seed, dead,
                                            reason):
        log(f"[resume] {cell.label}: run {run_id} was held on a Ray node that left the cluster: marked KILLED")


def _driver_signal(driver: str) -> int:
    """The signal that stopped the driver, which it leaves in the cluster's key-value store before it cancels its
    tasks; SIGINT (what ``ray.cancel`` delivers) where it left none."""
    from ray.experimental import internal_kv

    try:
        value = internal_kv._internal_kv_get(STOP_KEY + driver)
    except Exception:  # the store out of reach: the signal Ray delivered
        value = None
    return int(value) if value and value.isdigit() else signal.SIGINT


@contextlib.contextmanager
def _stopped_as_the_driver(driver: str):
    """For the block: SIGINT and SIGTERM stop the cell's run as they stop ``run`` (``train.interrupts``: the first
    at the end of its RL step, with a checkpoint, the run KILLED); a ``ray.cancel`` of the task, which reaches the
    worker as a SIGINT, is named as the signal that stopped the driver."""
    with signals.handle_signals(echo=lambda _: None):
        handler = signal.getsignal(signal.SIGINT)
        with contextlib.suppress(ValueError):  # not the main thread: Ray's own handling stays
            signal.signal(signal.SIGINT, lambda _, frame: handler(_driver_signal(driver), frame))
        yield


def stopped_line(label: str, e: Interrupted) -> str:
    """What a cell stopped by a signal says (as ``run``'s summary says it of a run)."""
    killed = [r for r in e.results if r.status == "KILLED"]
    if not killed:
        return f"[stopped] {label}: by {e.name}{' ' + e.where if e.where else ''}, before its run began"
    at = (f"checkpoint at RL step {e.checkpoint_step}" if e.checkpoint_step else
          "no checkpoint yet: it will start over")
    return f"[stopped] {label}: by {e.name}: run {killed[-1].run_id} marked KILLED ({at})"


def cell_task(cell: Cell, folder: str | None, driver: str) -> CellOutcome:
    """One cell in a Ray worker: claims of dead nodes released, then ``run_cell`` with this worker's node and its
    driver as the claim's owners; a signal (the driver's ``ray.cancel``) ends it KILLED. What it logs comes back
    with its outcome."""
    import ray

    lines: list[str] = []
    t0 = time.perf_counter()
    with _in_folder(folder), _stopped_as_the_driver(driver):
        try:
            dead = dead_nodes(ray.nodes())
            if dead:
                release_dead(cell, dead, lines.append)
            out = run_cell(cell, lines.append, owner={NODE_TAG: ray.get_runtime_context().get_node_id(),
                                                      DRIVER_TAG: driver})
        except Interrupted as e:  # the run is KILLED and the claim released on the way out
            out = CellOutcome("KILLED", seconds=time.perf_counter() - t0)
            lines.append(stopped_line(cell.label, e))
    return replace(out, lines=tuple(lines))


# -- on the driver ---------------------------------------------------------------------------------------------------
def _pinned(cell: Cell) -> Cell:
    """The cell as a worker runs it: the tracking URI the driver resolved, a sqlite file's path absolute."""
    path = sqlite_path(cell.uri)
    uri = f"sqlite:///{path.resolve()}" if path is not None else cell.uri
    return replace(cell, uri=uri, cfg=replace(cell.cfg, tracking=replace(cell.cfg.tracking, tracking_uri=uri)))


@contextlib.contextmanager
def _unwrapped():
    """A signal's handler that raises inside a Ray call comes out of it as a SystemError around what it raised:
    the ``Interrupted``, as raised."""
    try:
        yield
    except SystemError as e:
        if isinstance(e.__cause__, Interrupted):
            raise e.__cause__ from None
        raise


def ended_how(e: Exception) -> tuple[str, str]:
    """(what ended a task that brought back no outcome, the cell's status) for Ray's error ``e``."""
    import ray.exceptions as rx

    if isinstance(e, rx.RayTaskError):
        return "its Ray task raised", "FAILED"
    if isinstance(e, (rx.NodeDiedError, rx.LocalRayletDiedError)):
        return "its Ray node died (its raylet is gone)", "KILLED"
    if isinstance(e, rx.WorkerCrashedError):
        return f"its Ray worker died {RETRIES + 1} times", "KILLED"
    if isinstance(e, rx.TaskCancelledError):
        return "its Ray task was cancelled", "KILLED"
    return "its Ray task failed", "FAILED"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _marked(runs: list[str]) -> str:
    return "".join(f"; run {r} marked KILLED" for r in runs)


class RayBackend:
    """A joined Ray cluster; ``run`` submits the cells and yields their outcomes as they end. ``driver``: this
    driver's id in its cells' claims (``cells.DRIVER_TAG``); ``watchdog``: the process that ends a local cluster
    with this one (``watch_cluster``), None for a cluster that outlives the command."""

    name = "ray"

    def __init__(self, address: str, shapes: dict[str, tuple[float, float]], nodes: list[dict], driver: str,
                 watchdog: subprocess.Popen | None = None):
        self.address, self.shapes, self.nodes = address, shapes, nodes
        self.driver, self.watchdog = driver, watchdog
        self.stopped = False  # a signal's stop left its key in the cluster (``STOP_KEY``)
        self.workers = max(1, min(concurrent_cells(nodes, *s) for s in shapes.values())) if shapes else 1

    def describe(self) -> str:
        shapes = sorted(set(self.shapes.values()))
        per = "; ".join(f"{c:g} CPU(s) and {g:g} GPU(s)" for c, g in shapes)
        return (f"cells run as Ray tasks on the cluster at {self.address} ({_nodes_line(self.nodes)}): {per} per "
                f"cell, {self.workers} at a time; a task whose worker dies is retried up to {RETRIES} times")

    def release(self, cells: list[Cell], tag: str, values: set[str], reason: str) -> dict[str, list[str]]:
        """``cells.release_claims`` in each experiment of ``cells``: {label of one of ``cells``: [its runs marked
        KILLED]}. A store out of reach marks nothing (the next command finds those runs orphaned)."""
        from gspo_bench.tracking import cells as claims, stores

        labels = {(c.experiment, cell_key(c.scenario, c.algo, c.seed)): c.label for c in cells}
        marked: dict[str, list[str]] = {}
        for c in {(c.uri, c.experiment): c for c in cells}.values():
            try:
                client, exp = stores.open_store(c.uri, c.experiment)
                if exp is None:
                    continue
                one = cell_key(c.scenario, c.algo, c.seed) if len(cells) == 1 else None  # a narrower query
                for key, run_id in claims.release_claims(client, exp.experiment_id, tag, values, reason, one):
                    if (c.experiment, key) in labels:
                        marked.setdefault(labels[c.experiment, key], []).append(run_id)
            except Exception:
                continue
        return marked

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
        refs: dict = {}
        pending: list = []
        stop, dead, look = None, dead_nodes(self.nodes), time.monotonic() + NODE_LOOK_S
        try:
            # a first signal is only noted (``interrupts.deferred``): the cells in flight end at their step's end
            with signals.deferred(), _unwrapped():
                for i, c in enumerate(cells):
                    cpus, gpus = self.shapes[c.scenario]
                    ref = task.options(num_cpus=cpus, num_gpus=gpus, max_retries=RETRIES, name=c.label).remote(
                        c, folder, self.driver)
                    refs[ref] = i
                    pending.append(ref)
                while pending:
                    done, pending = ray.wait(pending, num_returns=1, timeout=1.0)  # a second at a time
                    if stop is None and signals.requested() is not None:
                        stop = signals.requested()
                        self._cancel(pending, stop)
                    for ref in done:
                        out = self._outcome(cells[refs[ref]], ref, stop)
                        if out is not None:
                            yield refs[ref], out
                    if pending and time.monotonic() >= look:
                        look = time.monotonic() + NODE_LOOK_S
                        nodes = ray.nodes()
                        gone = dead_nodes(nodes) - dead
                        if gone:
                            dead |= gone
                            stuck = yield from self._lost(cells, refs, pending, gone, nodes, log)
                            pending = [r for r in pending if r not in stuck]
                stop = signals.requested()
        except BaseException as e:  # a second signal (here, or in the caller between outcomes): stop at once
            if pending:
                self._stop_at_once(cells, [cells[refs[r]] for r in pending], pending, e, log)
            raise
        if stop is not None:
            for label, runs in self.release(cells, DRIVER_TAG, {self.driver}, f"{signals.NAMES.get(stop, stop)} "
                                            "stopped the suite's driver; its Ray task ended without its run").items():
                log(f"[stopped] {label}: its Ray task ended without its run{_marked(runs)}")
            raise Interrupted(stop)

    def _cancel(self, pending: list, signum: int) -> None:
        """Cancel the tasks: a running one's worker gets a SIGINT, named there as ``signum``; a queued one never
        runs."""
        import ray
        from ray.experimental import internal_kv

        self.stopped = True
        with contextlib.suppress(Exception):  # else the workers name Ray's SIGINT
            internal_kv._internal_kv_put(STOP_KEY + self.driver, str(int(signum)))
        for ref in pending:
            with contextlib.suppress(Exception):  # ended meanwhile
                ray.cancel(ref)

    def _outcome(self, cell: Cell, ref, stop: int | None) -> CellOutcome | None:
        """The task's outcome; for a task that brought none back, the line that says why, its claim ended and its
        run marked KILLED; None for a task a signal's stop cancelled before it ran."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            if stop is not None and isinstance(e, ray.exceptions.TaskCancelledError):
                return None
            how, status = ended_how(e)
            runs = [] if status == "FAILED" else self.release(
                [cell], DRIVER_TAG, {self.driver}, f"orphaned: {how} ({type(e).__name__})").get(cell.label, [])
            return CellOutcome(status, seconds=cell.estimate_s, lines=(
                f"[error] {cell.label}: {how}: {type(e).__name__}: {_first_line(e).rstrip('.')}{_marked(runs)}",))

    def _lost(self, cells: list[Cell], refs: dict, pending: list, gone: set[str], nodes: list[dict],
              log: Callable[[str], None]):
        """Nodes ``gone`` died: the claims held there end and their runs are marked KILLED; each cell no node left
        can hold ends KILLED now (its task would wait for a node for ever). Yields their outcomes; returns their
        refs."""
        import ray

        ids = ", ".join(sorted(n[:8] for n in gone))
        marked = self.release([cells[refs[r]] for r in pending], NODE_TAG, gone,
                              f"orphaned: its Ray node {ids} died (its raylet is gone)")
        stuck = []
        for ref in pending:
            c = cells[refs[ref]]
            runs = marked.get(c.label, [])
            if any(fits(n, *self.shapes[c.scenario]) for n in alive(nodes)):
                if runs:
                    log(f"[resume] {c.label}: its Ray node {ids} died{_marked(runs)}; Ray runs it again")
                continue
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
            stuck.append(ref)
            what = f"its Ray node {ids} died (its raylet is gone)" if runs else f"Ray node {ids} died"
            yield refs[ref], CellOutcome("KILLED", seconds=c.estimate_s, lines=(
                f"[error] {c.label}: {what}{_marked(runs)}; no node left in the cluster can run it "
                f"({_nodes_line(nodes)})",))
        return stuck

    def _stop_at_once(self, cells: list[Cell], running: list[Cell], pending: list, e: BaseException,
                      log: Callable[[str], None]) -> None:
        """Kill the workers of the tasks left, then end their claims and mark their runs KILLED here."""
        import ray

        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        with contextlib.suppress(Exception):
            ray.wait(pending, num_returns=len(pending), timeout=AT_ONCE_WAIT_S)
        why = e.name if isinstance(e, Interrupted) else type(e).__name__
        for label, runs in self.release(running, DRIVER_TAG, {self.driver}, f"{why} stopped the suite's driver at "
                                        "once: its Ray worker was killed mid-step").items():
            log(f"[stopped] {label}: by {why} at once, its Ray worker killed mid-step{_marked(runs)}")

    def close(self) -> None:
        import ray
        from ray.experimental import internal_kv

        if self.stopped:  # the key a signal's stop left
            with contextlib.suppress(Exception):
                internal_kv._internal_kv_del(STOP_KEY + self.driver)
        ray.shutdown()
        if self.watchdog is not None:
            end_watch(self.watchdog)


# the watchdog of a local cluster: stdlib only, so that it costs a bare interpreter
WATCHDOG = r"""
import os, select, signal, sys

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]  # parent pid, start time
    except (OSError, IndexError, ValueError):
        return None

family = {int(p): s[1] for p in sys.argv[1:] if (s := stat(p))}  # pid -> start time
while True:  # note the family's new members, then wait a second for the driver's end of the pipe to close
    table = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := stat(p))}
    grew = True
    while grew:
        grew = False
        for pid, (parent, start) in table.items():
            if pid not in family and family.get(parent, "") == table.get(parent, (0, None))[1]:
                family[pid], grew = start, True
    if select.select([sys.stdin], [], [], 1.0)[0]:
        break
for pid, start in family.items():
    if (s := stat(pid)) and s[1] == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``; none elsewhere)."""
    out = set()
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:  # after the name: state, parent pid, ...
                    out.add(int(name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return out


def watch_cluster(roots: set[int]) -> subprocess.Popen | None:
    """A watchdog (``WATCHDOG``) of the processes ``roots`` (those ``ray.init`` started) and of every process they
    start: while this process holds the write end of its stdin it notes them each second; once that end closes (this
    process gone, ``kill -9`` included, or ``end_watch``) it kills those still alive. In a session of its own, so a
    terminal's Ctrl-C leaves it be. None where there is nothing to watch (no ``/proc``)."""
    if not roots:
        return None
    return subprocess.Popen([sys.executable, "-c", WATCHDOG, *map(str, sorted(roots))], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def end_watch(watchdog: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Close the watchdog's stdin (it kills what is left of the cluster) and wait for it."""
    with contextlib.suppress(OSError):
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


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
    before = _children(os.getpid())
    try:
        # joining a cluster that refuses this driver, Ray's C++ client logs a line a second for 20 s to stderr
        # (not through Python's logging); the one line below says it instead
        with contextlib.nullcontext() if address == LOCAL else _stderr_muted(), _signals_kept():
            ray.init(address=address, **options)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ConfigError(f"Ray cluster at {address} cannot be joined: {type(e).__name__}: {first}"
                          + (TOKEN_HINT if _wants_token(e) else "")) from None
    # the processes of a cluster started here: ended with this process, however it ends
    watchdog = watch_cluster(_children(os.getpid()) - before) if address == LOCAL else None
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
        return RayBackend(address, shapes, nodes, uuid.uuid4().hex, watchdog)
    except BaseException:
        ray.shutdown()
        if watchdog is not None:
            end_watch(watchdog)
        raise
