"""Where the suite's cells run (``suite/backends.py``): the ETA spread over a backend's workers, the bar and lines of
``run_cells`` for any backend, the local backend's order, and ``--until-decided`` handing each batch of seeds to
the backend as one wave."""

from __future__ import annotations

import contextlib

import pytest

from gspo_bench.config import load_config
from gspo_bench.suite import run as suite_run
from gspo_bench.suite.backends import CellOutcome, LocalBackend, makespan
from gspo_bench.suite.run import Plan, ScenarioPlan, SuiteRequest, plan_lines, run_cells

TODO = [("grpo", 0), ("gspo", 0), ("grpo", 1), ("gspo", 1)]


def test_makespan_hands_each_cell_to_the_first_free_worker():
    assert makespan([10, 10, 10, 10], 1) == 40
    assert makespan([10, 10, 10, 10], 2) == 20
    assert makespan([30, 10, 10, 10], 2) == 30  # 30 on one worker while the other takes the three 10s
    assert makespan([10, 10, 30], 2) == 40  # in order: the 30 waits for a free worker
    assert makespan([5, 7], 8) == 7  # more workers than cells
    assert makespan([], 3) == 0


def _plan(per_cell_s: float = 10.0) -> Plan:
    sp = ScenarioPlan("smoke", load_config("smoke"), "sqlite:///unused.db", {}, list(TODO),
                      {"grpo": (per_cell_s, "measured"), "gspo": (per_cell_s, "measured")}, {})
    return Plan([sp], ["grpo", "gspo"], [0, 1])


class Recorded:
    """A backend that runs nothing: each cell ends at once with ``outcome``; ``waves`` keeps what it was given."""

    name = "recorded"

    def __init__(self, workers: int, outcome: CellOutcome):
        self.workers, self.outcome, self.waves = workers, outcome, []

    def describe(self) -> str:
        return f"recorded, {self.workers} at a time"

    def run(self, cells, log, on_start=None):
        self.waves.append([(c.scenario, c.algo, c.seed) for c in cells])
        for i in range(len(cells)):
            yield i, self.outcome

    def close(self) -> None:
        pass


@pytest.mark.parametrize("workers, etas, plan_eta", [(1, ["30 s", "20 s", "10 s"], "40 s"),
                                                     (2, ["20 s", "10 s", "10 s"], "20 s")])
def test_the_eta_counts_the_workers(workers, etas, plan_eta):
    plan, lines = _plan(), []
    backend = Recorded(workers, CellOutcome("FINISHED", 0.5, seconds=10.0))
    assert plan_lines(plan, backend)[-1].startswith(f"ETA: ~{plan_eta}" + (" on 2 workers" if workers == 2 else " ("))
    assert run_cells(plan, lines.append, progress=False, backend=backend) == {"smoke": 4}
    ended = [ln for ln in lines if ln.startswith("[")]
    assert [ln.split(": ", 1)[0] for ln in ended] == [f"[{k}/4] smoke / {a} / seed {s}"
                                                      for k, (a, s) in enumerate(TODO, 1)]
    assert [ln.split("ETA ~")[1] for ln in ended[:3]] == etas and "ETA" not in ended[3]
    assert all(": FINISHED in 10 s, final pass@1 0.500" in ln for ln in ended)


def test_an_eta_rescales_by_the_cells_measured_so_far():
    lines = []
    # every cell takes twice its estimate: the three left, 2 x 10 s each, on 2 workers
    run_cells(_plan(), lines.append, progress=False, backend=Recorded(2, CellOutcome("FINISHED", seconds=20.0)))
    assert lines[0].endswith("ETA ~40 s")


def test_a_worker_s_lines_come_first_and_a_cell_left_to_another_driver_is_a_skip():
    lines = []
    backend = Recorded(2, CellOutcome(None, why="claimed by another driver (pid 7 on h)", lines=("== grpo ==",)))
    assert run_cells(_plan(), lines.append, progress=True, backend=backend) == {"smoke": 0}
    assert lines[:2] == ["== grpo ==", "[1/4] skip smoke / grpo / seed 0: claimed by another driver (pid 7 on h)"]


def test_the_local_backend_runs_the_cells_in_order_in_this_process(monkeypatch):
    import gspo_bench.suite.backends as backends

    seen, started = [], []
    monkeypatch.setattr(backends, "run_cell", lambda cell, log: seen.append(cell.label) or CellOutcome("FINISHED"))
    cells = suite_run.plan_cells(_plan())
    assert [c.cfg.algos + c.cfg.seeds for c in cells] == [[a, s] for a, s in TODO]  # each cell's config alone
    got = list(LocalBackend().run(cells, print, on_start=started.append))
    assert [i for i, _ in got] == started == [0, 1, 2, 3]
    assert seen == [f"smoke / {a} / seed {s}" for a, s in TODO]


def test_until_decided_hands_each_batch_of_seeds_to_the_backend_as_one_wave(tmp_path, monkeypatch, mixed_task):
    backend = Recorded(2, CellOutcome("FINISHED", seconds=1.0))

    @contextlib.contextmanager
    def recorded(req, plan):
        yield backend

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(suite_run, "open_backend", recorded)
    req = SuiteRequest(scenarios=("smoke",), algos=["grpo", "gspo"], seeds=[0, 1], progress=False,
                       tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", out=str(tmp_path / "out"),
                       sets=("warmstart.enabled=false", f"task={mixed_task}"), until_decided=True, max_seeds=4,
                       seed_batch=2)
    suite_run.run_suite(req, log=lambda m: None)
    # no cell leaves a result here, so nothing is ever decided: the configured seeds, then one batch up to 4 seeds
    assert backend.waves == [[("smoke", a, s) for s in (0, 1) for a in ("grpo", "gspo")],
                             [("smoke", a, s) for s in (2, 3) for a in ("grpo", "gspo")]]
