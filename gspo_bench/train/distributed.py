"""Multi-process training: who this process is, its share of the work, and what ranks must agree on.

Every process of a multi-process ``run`` runs the whole command: Lightning's
own launcher (``--devices 2``) starts the others by re-running the command
line, and ``torchrun`` or SLURM start them all at once. So the rank is read
from the launcher's environment before any process group exists
(``launch_rank_zero``), and from ``torch.distributed`` once the Trainer has made
one (``rank_world``). Only rank 0 talks to MLflow and prints.

The contract's aggregations stay exact across ranks (``local_minibatches``):
rank ``r`` backpropagates ``W * sum_{its units} l / N`` where ``N`` counts the
minibatch's units (tokens for token-mean, non-empty sequences otherwise) on
*every* rank, so the strategy's gradient average over ``W`` ranks is the
gradient of ``sum_{all units} l / N``: a global token mean, not a mean of
per-rank means.

Also here: what a multi-process run asks of its config (``check_processes``),
the FSDP fallback to transformers' own sampling and forward, the Lightning
strategy for ``train.strategy``, and what happens when one rank fails.

A failed rank ends the command (``RankFailed``): the ranks train in lockstep, so
the others cannot go on to the next run without it. A rank other than 0 writes
its error to a report file (``report_failure``) and exits 1. Rank 0 started the
other processes of a ``--devices N`` run itself (``WatchedLauncher``); a thread
watches them, and when one exits with an error it prints that rank's first
error line, marks the current MLflow run FAILED (the whole report as the
artifact ``rank<N>-error.txt``), stops the other processes and exits 1, where
Lightning's own watcher would SIGKILL everything without a word (exit 137).
Under torchrun or SLURM the launcher does the same for the ranks it started.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

from gspo_bench.config import ConfigError, RunConfig
from gspo_bench.config.names import GPU_ACCELERATORS
from gspo_bench.rollout.engines import sharded_engine
from gspo_bench.tracking.client import end_run

# -- what a multi-process run asks of its config, and Lightning's strategy for it ---------------------------
def check_processes(cfg: RunConfig) -> None:
    """A multi-process run splits each step's prompts evenly (whole groups per rank), and FSDP needs GPUs."""
    t = cfg.train
    n = t.devices * t.num_nodes
    if n > 1 and cfg.rollout.prompts_per_step % n:
        raise ConfigError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must divide evenly over "
                          f"{n} processes (devices {t.devices} x num_nodes {t.num_nodes}): each rank samples whole "
                          "groups of its share of the prompts")
    if n > 1 and cfg.train.eval_prompts < n:
        raise ConfigError(f"train.eval_prompts={t.eval_prompts} is fewer than the {n} processes sharing them")
    if n > 1 and cfg.rollout.max_staleness > 0:
        raise ConfigError(f"rollout.max_staleness={cfg.rollout.max_staleness} runs one rollout worker beside one "
                          f"training process for now, not {n}: use rollout.max_staleness=0 with --devices/--num-nodes")
    if t.strategy == "fsdp":
        import torch

        if t.accelerator == "cpu" or not torch.cuda.is_available():
            raise ConfigError("--strategy fsdp needs GPUs (Lightning runs FSDP on CUDA only); on CPU use "
                              "--strategy ddp")


def check_device(cfg: RunConfig) -> None:
    """A run asked onto a GPU (``train.accelerator`` gpu or cuda) runs where torch sees one: checked where the
    run will train, before any work (a suite whose cells run on a Ray cluster leaves it to the cluster)."""
    import torch

    t = cfg.train
    if t.accelerator in GPU_ACCELERATORS and not torch.cuda.is_available():
        raise ConfigError(f"train.accelerator={t.accelerator} but torch {torch.__version__} sees no CUDA GPU; "
                          "use train.accelerator=cpu or auto here")


def fsdp_fallback(cfg: RunConfig, log) -> RunConfig:
    """Under FSDP each rank holds a shard of every parameter, and the fast engine and the packed forward read
    whole ones: sampling and the training forward fall back to transformers' own (``hf``), and say so."""
    from dataclasses import replace

    if cfg.train.strategy != "fsdp":
        return cfg
    engine = sharded_engine(cfg.rollout.engine)
    if engine != cfg.rollout.engine or cfg.train.forward in ("auto", "packed"):
        log("[fsdp] the packed forward and the engines that read whole parameters cannot read what FSDP shards: "
            f"sampling and training use transformers' own (engine {engine}, forward hf)")
    return replace(cfg, rollout=replace(cfg.rollout, engine=engine), train=replace(cfg.train, forward="hf"))


def strategy(t, moe: bool):
    """Lightning's strategy for ``train.strategy``: one process as before; DDP (gloo on CPU, NCCL on GPUs)
    averaging gradients, with unused-parameter detection on MoE models (experts a minibatch never routes
    to), its other processes watched (``WatchedLauncher``); or FSDP."""
    if t.devices * t.num_nodes == 1 and t.strategy == "auto":
        return "auto"
    if t.strategy == "fsdp":
        return "fsdp"
    return WatchedDDP(find_unused_parameters=moe)


# -- when a rank fails ----------------------------------------------------------------------------------------
REPORTS_ENV = "GSPO_BENCH_RANK_REPORTS"  # the folder where ranks other than 0 leave their error reports


class RankFailed(Exception):
    """A run of a multi-process command failed: the command ends (exit 1), since the ranks train in lockstep.
    ``trace``: the traceback of the error that failed it; ``line``: that error's first line."""

    def __init__(self, message: str, trace: str = "", line: str = ""):
        super().__init__(message)
        self.trace, self.line = trace, line or message  # line: the error itself, without the run's name


def report_failure(line: str, trace: str = "") -> None:
    """On a rank other than 0: leave its error where rank 0's watch reads it (``rank<N>.txt``): the first
    line, then the traceback."""
    folder = os.environ.get(REPORTS_ENV)
    if not folder:
        return
    from gspo_bench.tracking.redact import redact

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        (Path(folder) / f"rank{rank}.txt").write_text(redact(line.strip() + "\n" + trace))
    except OSError:
        pass  # the watch then says the rank reported no error


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class RankWatch(threading.Thread):
    """Rank 0's watch over the processes it started: the first to exit with an error ends the command.

    Rank 0's own thread often notices first (its collective fails: "Connection closed by peer"); it then
    ``claim``s the failure and reports the dead rank's error itself (``failed_rank``), so the two never both
    act on it."""

    def __init__(self, procs: list, folder: str, period: float = 1.0):
        super().__init__(daemon=True, name="gspo-bench-rank-watch")
        self.procs, self.folder, self.period = procs, folder, period
        self.echo = lambda line: print(line, file=sys.stderr, flush=True)
        self._claimed = threading.Lock()

    def claim(self) -> bool:
        """True for the first caller only: it handles the failure."""
        return self._claimed.acquire(blocking=False)

    def run(self) -> None:
        while True:
            time.sleep(self.period)
            codes = [p.poll() for p in self.procs]
            if all(c == 0 for c in codes):
                return
            for i, code in enumerate(codes):
                if code:  # not None (running) and not 0
                    if self.claim():
                        self.fail(i + 1, code)
                    return

    def report(self, rank: int, code: int) -> tuple[str, str]:
        """(first error line, whole report) of ``rank``, which exited with ``code``."""
        path = Path(self.folder) / f"rank{rank}.txt"
        text = path.read_text() if path.is_file() else ""
        if text.strip():
            return text.splitlines()[0], text
        how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.Signals._value2member_map_ \
            else f"code {code}"
        return f"exited with {how} and reported no error (its own output is above, if any)", ""

    def failed_rank(self, wait_s: float) -> tuple[int, str, str] | None:
        """(rank, first error line, report) of the first process that exited with an error, waiting up to
        ``wait_s`` for one to do so; None when all still run (the failure is rank 0's own)."""
        deadline = time.monotonic() + wait_s
        while True:
            for i, p in enumerate(self.procs):
                if p.poll():
                    return (i + 1, *self.report(i + 1, p.returncode))
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def fail(self, rank: int, code: int) -> None:
        line, text = self.report(rank, code)
        message = f"rank {rank} failed: {line}"
        self.echo(f"gspo-bench: error: {message}")
        if _CURRENT_RUN is not None:
            try:
                mark_failed(*_CURRENT_RUN, message, text, rank)
            except Exception as e:  # the store is unreachable: say so, the run stays for --resume to find
                self.echo(f"gspo-bench: could not mark run {_CURRENT_RUN[1]} FAILED: {type(e).__name__}")
        stop_processes(self.procs)
        shutil.rmtree(self.folder, ignore_errors=True)
        os._exit(1)  # the main thread may be waiting in a collective for the rank that died


def mark_failed(client, run_id: str, message: str, report: str = "", rank: int = 0) -> None:
    """End ``run_id`` FAILED with the reason as a tag (``failed_reason``) and a rank's report as an artifact."""
    end_run(client, run_id, "FAILED", tags={"failed_reason": message[:5000]},
            text=(report, f"rank{rank}-error.txt") if report else None)


def other_rank_failure(wait_s: float = 15.0) -> tuple[int, str, str] | None:
    """On rank 0 of a ``--devices N`` run whose step just failed: the rank that died first, if one did,
    as ``(rank, first error line, report)``. Its failure is then this thread's to report (the watch stands
    down); when the watch already took it, this thread waits for the watch to end the process."""
    if _WATCH is None:
        return None
    if not _WATCH.claim():
        time.sleep(3600)  # the watch is ending the process
    return _WATCH.failed_rank(wait_s)


def stop_processes(procs: list) -> None:
    """SIGKILL ``procs`` (a rank waiting in a collective ignores SIGTERM) and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=30)
        except Exception:
            pass


_WATCH: RankWatch | None = None  # this process's watch, when it started other ranks (``WatchedLauncher``)
_CURRENT_RUN: tuple | None = None  # (MLflow client, run id) of the run this process is in (``watch_run``)


def watch_run(client, run_id: str | None) -> None:
    """The MLflow run to mark FAILED should another rank die while this process is in it."""
    global _CURRENT_RUN
    _CURRENT_RUN = (client, run_id) if run_id else None


def stop_other_ranks() -> None:
    """Rank 0 of a ``--devices N`` run ending on an error: stop the processes it started."""
    if _WATCH is not None:
        stop_processes(_WATCH.procs)


class WatchedLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher of ``--devices N`` (the command run again with ``LOCAL_RANK=1..N-1``), with
    ``RankWatch`` in place of Lightning's watcher, which SIGKILLs every process, its own included, when a
    child exits with an error (exit 137, no message, the run left RUNNING)."""

    def launch(self, function, *args, trainer=None, **kwargs):
        global _WATCH
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:  # the first Trainer of rank 0 only
            folder = tempfile.mkdtemp(prefix="gspo-bench-ranks-")
            atexit.register(shutil.rmtree, folder, True)
            os.environ[REPORTS_ENV] = folder  # the children inherit it
            self._call_children_scripts()
            _WATCH = RankWatch(self.procs, folder)
            _WATCH.start()
        if "OMP_NUM_THREADS" not in os.environ:  # as Lightning's launcher: share the cores among the processes
            from lightning.fabric.utilities.distributed import _suggested_max_num_threads

            threads = _suggested_max_num_threads(self.num_processes)
            torch.set_num_threads(threads)
            os.environ["OMP_NUM_THREADS"] = str(threads)
        return function(*args, **kwargs)


class WatchedDDP(DDPStrategy):
    """DDP whose launcher watches the processes it starts (``WatchedLauncher``)."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _SubprocessScriptLauncher:
            self._launcher = WatchedLauncher(self.cluster_environment, self.num_processes, self.num_nodes)
