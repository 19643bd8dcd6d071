"""A cell claimed in the tracking store before it runs, so that drivers sharing one store never run a cell twice
at the same time.

A *cell* is one (preset, algorithm, seed) of an experiment. A driver about to run one first writes a claim: an
MLflow run of its own in that experiment, tagged ``kind=claim``, ``cell=<preset>/<algo>/<seed>`` and its
owner (``lifecycle.owner_tags``: host, pid, process start time, heartbeat). Tables never count such a run
(``kind`` is a hidden kind). The claim holds while its run is RUNNING and not orphaned (its process gone on this
host, or no heartbeat for ``lifecycle.ORPHAN_AFTER_S`` from another: ``lifecycle.orphan_reason``); the driver
refreshes its heartbeat while the cell runs and releases it when the cell ends, however it ends.

A claim run never stays RUNNING: releasing one ends it (FINISHED when its cell ended or its driver yielded,
KILLED with a ``killed_reason`` when its holder was stopped or is dead), then deletes it, so no table or listing of
the store meets it again.

Why a run and not a lock: a run is the one thing every MLflow store (a SQLite file, PostgreSQL, an ``mlflow
server`` over HTTP) can create, list and delete, and a store behind a server offers no lock. Mutual exclusion
comes from the order of writes and reads, as in the classic "announce, then look" protocol:

1. write my claim;
2. list the cell's live claims; if mine is the only one, the cell is mine;
3. otherwise release mine, wait a random while and try again (``attempts`` times), or give up.

Two drivers can never both win: a winner's listing did not see the other claim, so that claim was written
after the listing, hence after the winner's own claim, and its owner's listing sees the winner's claim (which a
winner keeps until its cell ends) and yields. Both may yield at once; the random waits separate them. This
needs a store where a write is seen by every read that starts after it, as a single database (behind a server
or not) gives.

Before it claims, and again once it holds the claim, the driver asks whether the cell is already taken care of:
a FINISHED run of it (done, by this driver's plan or another's), or a RUNNING run of it whose process is alive
(a ``run`` started by hand, or a driver older than claims). Either way it leaves the cell alone.

A claim taken by a scheduler's worker (``suite --backend ray``) also names the worker's node (tag ``NODE_TAG``)
and the driver that scheduled it (tag ``DRIVER_TAG``). When the scheduler reports that node dead, or the driver
knows its task ended without releasing the claim (its worker killed, its node gone), the worker's process cannot
be asked (it may be on another host) and its heartbeat would hold the cell for ``lifecycle.ORPHAN_AFTER_S``:
``release_claims`` (``release_dead_claims`` for a dead node) ends such a claim KILLED and marks the cell's run of
the same process KILLED, so a retried task, or the next command, continues it from its checkpoint.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from gspo_bench.tracking.client import end_run, start_run
from gspo_bench.tracking.lifecycle import orphan_reason, owner_tags
from gspo_bench.tracking.ui import CLAIM_KIND, benchmark_run

CELL_TAG = "cell"
NODE_TAG = "gspo_bench.node"  # the scheduler's id of the node a claim's process runs on, where one scheduled it
DRIVER_TAG = "gspo_bench.driver"  # the id of the driver that scheduled the claim's process, where one did
HEARTBEAT_S = 60.0  # a claim's heartbeat while its cell runs (a claim is dead after lifecycle.ORPHAN_AFTER_S)


def cell_key(preset: str, algo: str, seed: int) -> str:
    return f"{preset}/{algo}/{seed}"


def end_claim(client, run_id: str, status: str, reason: str | None = None) -> None:
    """End a claim run with ``status`` (``reason`` as its ``killed_reason``), then delete it; a claim another driver
    ended meanwhile is left as it is."""
    try:
        end_run(client, run_id, status, tags={"killed_reason": reason} if reason else None)
        client.delete_run(run_id)
    except Exception:  # ended and deleted meanwhile by another driver (a deleted run takes no more writes)
        pass


@dataclass
class Claim:
    """A claim this process holds: its run id, and the heartbeat thread that keeps it alive."""

    client: object
    run_id: str
    cell: str
    _stop: threading.Event = field(default_factory=threading.Event)
    _beat: threading.Thread | None = None

    def keep_alive(self, every_s: float = HEARTBEAT_S) -> None:
        def beat():
            while not self._stop.wait(every_s):
                try:
                    self.client.set_tag(self.run_id, "gspo_bench.heartbeat", f"{time.time():.0f}")
                except Exception:  # a store that stopped answering: the cell's own run reports it
                    pass

        self._beat = threading.Thread(target=beat, daemon=True, name=f"gspo_bench-claim-{self.cell}")
        self._beat.start()

    def release(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """Stop the heartbeat, end the claim run with ``status`` and delete it (a store gone meanwhile: the claim
        dies with this process, as a claim of a killed driver does)."""
        self._stop.set()
        end_claim(self.client, self.run_id, status, reason)

    def __enter__(self) -> "Claim":
        self.keep_alive()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.release()
        else:  # an exception out of the cell (a signal's stop): the claim ends KILLED, as its cell's run does
            self.release("KILLED", f"its holder stopped: {exc_type.__name__}")


def _live(run) -> bool:
    return run.info.status == "RUNNING" and orphan_reason(run) is None


def cell_runs(client, experiment_id: str, preset: str, algo: str, seed: int) -> list:
    """The experiment's runs of the cell (its training runs, not claims), any status."""
    query = f"tags.algo = '{algo}' and tags.seed = '{seed}' and tags.preset = '{preset}'"
    return [r for r in client.search_runs([experiment_id], query, max_results=1000) if benchmark_run(r.data.tags)]


def taken(client, experiment_id: str, preset: str, algo: str, seed: int) -> str | None:
    """Why the cell needs no run from this driver, or None: a FINISHED run of it, or a RUNNING one at work."""
    for r in cell_runs(client, experiment_id, preset, algo, seed):
        if r.info.status == "FINISHED":
            return f"FINISHED meanwhile (run {r.info.run_id})"
        if _live(r):
            t = r.data.tags
            return (f"being run by pid {t.get('gspo_bench.pid')} on {t.get('gspo_bench.host')} "
                    f"(run {r.info.run_id})")
    return None


def live_claims(client, experiment_id: str, cell: str) -> list:
    """The cell's live claims; a dead one (its driver killed) is ended KILLED on the way, as nobody else will."""
    query = f"tags.kind = '{CLAIM_KIND}' and tags.{CELL_TAG} = '{cell}'"
    live = []
    for r in client.search_runs([experiment_id], query, max_results=1000):
        if _live(r):
            live.append(r)
        else:
            end_claim(client, r.info.run_id, "KILLED", orphan_reason(r))
    return live


def claim_cell(client, experiment_id: str, preset: str, algo: str, seed: int, attempts: int = 5,
               wait_s: tuple[float, float] = (0.2, 2.0),
               tags: dict[str, str] | None = None) -> tuple[Claim | None, str | None]:
    """``(claim, None)`` when this process now holds the cell; ``(None, why)`` when the cell is done, at work,
    or claimed by another driver (the protocol in the module docstring). ``tags``: more owner tags of the claim
    (``NODE_TAG``)."""
    cell = cell_key(preset, algo, seed)
    for attempt in range(attempts):
        why = taken(client, experiment_id, preset, algo, seed)
        if why:
            return None, why
        mine = start_run(client, experiment_id, f"claim {cell}",
                         {"kind": CLAIM_KIND, CELL_TAG: cell, "algo": algo, "seed": str(seed), "preset": preset,
                          **owner_tags(), **(tags or {})})
        try:
            others = [r for r in live_claims(client, experiment_id, cell) if r.info.run_id != mine]
            why = None if others else taken(client, experiment_id, preset, algo, seed)  # done between the looks
        except BaseException as e:  # a signal (or a store gone) mid-claim: the claim written ends with it
            end_claim(client, mine, "KILLED", f"its holder stopped while claiming: {type(e).__name__}")
            raise
        if not others and not why:
            return Claim(client, mine, cell), None
        end_claim(client, mine, "FINISHED")  # yielded
        if why:
            return None, why
        if attempt + 1 < attempts:
            time.sleep(random.uniform(*wait_s))
    t = others[0].data.tags
    return None, (f"claimed by another driver (pid {t.get('gspo_bench.pid')} on {t.get('gspo_bench.host')}, "
                  f"claim run {others[0].info.run_id})")


def release_claims(client, experiment_id: str, tag: str, values: set[str], reason: str,
                   cell: str | None = None) -> list[tuple[str, str]]:
    """End KILLED (``reason`` as ``killed_reason``) and delete the claims whose tag ``tag`` is one of ``values``, of
    ``cell`` (``cell_key``) or of every cell, and mark the RUNNING runs of their cells by the same processes (same
    host and pid) KILLED with that reason; returns ``(cell, run id)`` of each run marked. For claims whose holders
    are known dead: a node the scheduler reports dead, a driver's task that ended without releasing its claim."""
    query = f"tags.kind = '{CLAIM_KIND}'" + (f" and tags.{CELL_TAG} = '{cell}'" if cell else "")
    owners: dict[tuple[str, str, str], set] = {}  # (preset, algo, seed) -> {(host, pid)}
    for r in client.search_runs([experiment_id], query, max_results=1000):
        t = r.data.tags
        if t.get(tag) in values:
            owners.setdefault((t.get("preset"), t.get("algo"), t.get("seed")), set()).add(
                (t.get("gspo_bench.host"), t.get("gspo_bench.pid")))
            end_claim(client, r.info.run_id, "KILLED", reason)
    marked = []
    for (preset, algo, seed), held in owners.items():
        for r in cell_runs(client, experiment_id, preset, algo, seed):
            t = r.data.tags
            if r.info.status == "RUNNING" and (t.get("gspo_bench.host"), t.get("gspo_bench.pid")) in held:
                end_run(client, r.info.run_id, "KILLED", tags={"killed_reason": reason})
                marked.append((cell_key(preset, algo, seed), r.info.run_id))
    return marked


def release_dead_claims(client, experiment_id: str, preset: str, algo: str, seed: int, dead_nodes: set[str],
                        reason: str) -> list[str]:
    """``release_claims`` of the cell's claims held on a node of ``dead_nodes`` (tag ``NODE_TAG``); returns the ids
    of the runs marked KILLED."""
    return [run_id for _, run_id in release_claims(client, experiment_id, NODE_TAG, dead_nodes, reason,
                                                   cell_key(preset, algo, seed))]
