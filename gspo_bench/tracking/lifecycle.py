"""Runs that outlive their process: who owns a RUNNING run, which run ``--resume`` continues, and the logger
of a continued run.

Every run is tagged at its start with its owner (``gspo_bench.host``, ``gspo_bench.pid``, the process's start
time ``gspo_bench.pid_start``) and a digest of its settings (``gspo_bench.config``); a heartbeat tag
(``gspo_bench.heartbeat``, unix seconds) is refreshed at every RL step.

A RUNNING run is *orphaned* when its process is gone: on this host, no process has its pid and start time;
on another host (a pre-empted node), its heartbeat is older than ``ORPHAN_AFTER_S``. Without ``--resume``,
``run`` marks the orphans of the experiment KILLED (tag ``killed_reason``) before it starts; the
leaderboard, report and suite count FINISHED runs only, so such a run is never averaged in.

``--resume`` skips each (algorithm, seed) of which the experiment holds a FINISHED run with the same settings
digest (``find_finished``: its numbers are read back, nothing is trained again), and continues, for each other
(algorithm, seed), the newest run of the experiment with the same settings
digest that is KILLED, FAILED or orphaned and has a checkpoint: the same MLflow run, from that checkpoint.
Metrics logged between the checkpoint and the crash are logged again by the resumed run at the same steps
with the same values; ``ResumedLogger`` skips them, so each (metric, step) appears once.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from lightning.pytorch.loggers import MLFlowLogger

from gspo_bench.tracking.client import end_run
from gspo_bench.tracking.ui import CLAIM_KIND

ORPHAN_AFTER_S = 3600.0  # a RUNNING run of another host with no step for this long is taken as dead
UNFINISHED = ("KILLED", "FAILED", "RUNNING")
def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux ``/proc``), '' where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_tags() -> dict[str, str]:
    pid = os.getpid()
    return {"gspo_bench.host": socket.gethostname(), "gspo_bench.pid": str(pid),
            "gspo_bench.pid_start": _start_time(pid), "gspo_bench.heartbeat": f"{time.time():.0f}"}


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the pid: not ours, unless the start time matches
        pass
    return not start or _start_time(pid) == start


def orphan_reason(run, now: float | None = None) -> str | None:
    """Why a RUNNING run is orphaned, or None when its process may still be at work."""
    if run.info.status != "RUNNING":
        return None
    tags = run.data.tags
    host, pid = tags.get("gspo_bench.host"), tags.get("gspo_bench.pid", "")
    if host is None or not pid.isdigit():
        return None  # not started by gspo_bench (or by a version without owner tags): leave it alone
    if host == socket.gethostname():
        if _alive(int(pid), tags.get("gspo_bench.pid_start", "")):
            return None
        return f"orphaned: its process (pid {pid} on {host}) is gone"
    beat = float(tags.get("gspo_bench.heartbeat", "0") or 0)
    idle = (now or time.time()) - beat
    if idle < ORPHAN_AFTER_S:
        return None
    return f"orphaned: no step from host {host} for {idle / 60:.0f} min"


def mark_orphans(client, experiment_id: str, log=print) -> list[str]:
    """Mark the experiment's orphaned RUNNING runs KILLED, with a ``killed_reason`` tag; returns their ids."""
    marked = []
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        if run.data.tags.get("kind") == CLAIM_KIND:  # a suite driver's claim on a cell: ``cells`` tidies those
            continue
        reason = orphan_reason(run)
        if reason:
            end_run(client, run.info.run_id, "KILLED", tags={"killed_reason": reason})
            log(f"[resume] run {run.info.run_id} ({run.data.tags.get('algo')} seed {run.data.tags.get('seed')}) "
                f"was RUNNING with no process: marked KILLED ({reason}); resume it with --resume")
            marked.append(run.info.run_id)
    return marked


def _same_settings(algo: str, seed: int, digest: str) -> str:
    return f"tags.algo = '{algo}' and tags.seed = '{seed}' and tags.`gspo_bench.config` = '{digest}'"


def find_finished(client, experiment_id: str, algo: str, seed: int, digest: str):
    """The newest FINISHED run of (algo, seed) with settings ``digest``, or None: the work ``--resume`` does not
    repeat."""
    query = _same_settings(algo, seed, digest) + " and attributes.status = 'FINISHED'"
    found = client.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
    return found[0] if found else None


def find_resumable(client, experiment_id: str, algo: str, seed: int, digest: str):
    """The newest unfinished run of (algo, seed) with settings ``digest`` that is not alive, or None."""
    for run in client.search_runs([experiment_id], _same_settings(algo, seed, digest),
                                  order_by=["attributes.start_time DESC"], max_results=50):
        if run.info.status in ("KILLED", "FAILED") or orphan_reason(run):
            return run
    return None


class RunLogger(MLFlowLogger):
    """Lightning's MLflow logger, silent on the way out of a run the tracking server dropped: Lightning
    finalizes the logger of a failed fit (``set_terminated(FAILED)``) while the error is being handled, and
    against a dead server that is another round of retries before the run can stop."""

    def finalize(self, status: str = "success") -> None:
        from gspo_bench.tracking.stores import unreachable

        if unreachable(sys.exc_info()[1]):  # inside Lightning's ``except``: the error that ended the fit
            return
        super().finalize(status)


class ResumedLogger(RunLogger):
    """The MLflow logger of a continued run: logs only the (metric, step) pairs the run does not hold yet."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        client = self.experiment
        run = client.get_run(self.run_id)
        self.seen = {(key, m.step) for key in run.data.metrics for m in client.get_metric_history(self.run_id, key)}

    def log_metrics(self, metrics, step=None):
        fresh = {k: v for k, v in metrics.items() if (k, step) not in self.seen}
        if fresh:
            super().log_metrics(fresh, step)
