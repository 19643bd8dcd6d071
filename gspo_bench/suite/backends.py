"""Where the suite's cells run: a backend takes the cells to run and hands back each one's outcome as it ends.

- ``Cell``: one (scenario, algorithm, seed) to run: the config of that cell alone, the store it logs to, and the
  plan's estimate of its seconds.
- ``run_cell``: what running a cell is, wherever it runs. The cell is claimed in the tracking store first
  (``tracking.cells``: a claim run in its experiment, so drivers sharing a store never run a cell twice at the
  same time), then ``runner.run(resume=True)``: a cell stopped earlier (a signal, a killed process) continues
  from its last checkpoint as the same MLflow run. A failed cell is an outcome, never an exception.
- ``LocalBackend``: one cell at a time in this process (``--backend local``, the default).
- ``ray_backend.RayBackend``: each cell a Ray task on a cluster (``--backend ray``).
- ``makespan``: the ETA of cells spread over a backend's workers.

Both backends share everything else in ``run.py``: the plan, the skip of FINISHED cells, the bar, the lines
and the outputs.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from gspo_bench.config import RunConfig


@dataclass(frozen=True)
class Cell:
    """One cell to run: ``cfg`` is its scenario's config with this algorithm and seed alone."""

    scenario: str
    cfg: RunConfig
    uri: str  # the tracking store the cell logs to
    algo: str
    seed: int
    estimate_s: float  # the plan's seconds for it (warm start included where it builds one)

    @property
    def experiment(self) -> str:
        return self.cfg.tracking.experiment

    @property
    def label(self) -> str:
        return f"{self.scenario} / {self.algo} / seed {self.seed}"


@dataclass(frozen=True)
class CellOutcome:
    """How a cell ended: ``status`` FINISHED / FAILED / KILLED, or None when this driver left it alone (``why``:
    done meanwhile, or another driver holds it). ``lines``: what it logged, where it ran elsewhere."""

    status: str | None
    final: float | None = None  # final eval pass@1
    seconds: float = 0.0  # claim and run, as the cell's worker measured them
    why: str | None = None
    lines: tuple[str, ...] = ()


def run_cell(cell: Cell, log: Callable[[str], None], owner: dict[str, str] | None = None) -> CellOutcome:
    """Claim the cell in its store, then run it (module docstring); an error inside the run is a FAILED cell.
    ``owner``: more tags of the claim (a Ray worker's node)."""
    from gspo_bench.tracking import cells, stores
    from gspo_bench.tracking.client import client as tracking_client
    from gspo_bench.train import runner

    t0 = time.perf_counter()
    exp_id = stores.ensure_experiment(cell.uri, cell.experiment, cell.cfg.tracking.artifact_location)
    claim, why = cells.claim_cell(tracking_client(cell.uri), exp_id, cell.scenario, cell.algo, cell.seed,
                                  tags=owner)
    if claim is None:  # another driver on this store has it, or finished it since the plan
        return CellOutcome(None, seconds=time.perf_counter() - t0, why=why)
    with claim:
        try:
            # a KILLED cell (a signal, or an orphan of a killed process) continues from its checkpoint
            res = runner.run(cell.cfg, log=log, resume=True)[0]
            status, final = res.status, res.eval_end
        except Exception as e:  # e.g. a warm start that raised: this cell fails, the suite goes on
            status, final = "FAILED", None
            log(f"[error] {cell.label}: {type(e).__name__}: {e}")
    return CellOutcome(status, final, time.perf_counter() - t0)


class Backend(Protocol):
    """Runs cells; ``run`` yields ``(index into cells, outcome)`` in the order the cells end."""

    name: str
    workers: int  # cells it runs at a time (the ETA divides the work among them)

    def describe(self) -> str: ...

    def run(self, cells: list[Cell], log: Callable[[str], None],
            on_start: Callable[[int], None] | None = None) -> Iterator[tuple[int, CellOutcome]]: ...

    def close(self) -> None: ...


class LocalBackend:
    """One cell at a time, in this process, in the plan's order; each cell's lines printed as they come."""

    name = "local"
    workers = 1

    def describe(self) -> str:
        return "cells run one at a time in this process (--backend local)"

    def run(self, cells: list[Cell], log: Callable[[str], None],
            on_start: Callable[[int], None] | None = None) -> Iterator[tuple[int, CellOutcome]]:
        for i, cell in enumerate(cells):
            if on_start is not None:
                on_start(i)
            yield i, run_cell(cell, log)

    def close(self) -> None:
        pass


def makespan(seconds: list[float], workers: int) -> float:
    """Wall seconds of running cells of ``seconds`` in this order on ``workers`` workers, each cell going to the
    first worker free (as a queue of tasks is served); the sum for one worker."""
    free = [0.0] * max(1, min(workers, len(seconds)))
    for s in seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)
