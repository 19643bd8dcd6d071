"""``suite``: every scenario x algorithm x seed, resumable, then a leaderboard and report per scenario and one
summary ranking the algorithms across scenarios.

A scenario is a preset (``gspo_bench/presets/<name>.yaml``); ``SCENARIOS`` is the default list. Every
scenario's config is ``load_config(scenario, (), overrides)`` with the ``--set`` items, the suite's
algorithms and seeds, its tracking URI and the experiment ``<prefix>-<scenario>``. A *cell* is one
(scenario, algorithm, seed): one ``runner.run`` with that algorithm and seed alone, so a failed cell is a
FAILED run and the suite goes on. Warm starts are cached by the harness per (task, model, seed, warm-start
config), so running cell by cell builds each one once.

Resume: a cell is done when the experiment holds a FINISHED run tagged with its ``algo``, ``seed`` and
``preset`` (= the scenario) that is not a report, study or tuning-trial run; done cells are skipped and
counted, FAILED / KILLED / RUNNING (or deleted) ones run again, so re-running a command runs only what is
missing. A cell that was stopped (a signal, or ``kill -9``: its RUNNING run is an orphan, marked KILLED)
continues as the same MLflow run from its last checkpoint (``runner.run(resume=True)``, ``lifecycle``).
A done cell's logged params must match this invocation's config (every field except algos, seeds,
tracking, train.progress and train.checkpoint_every): a FINISHED run made with other settings (say a ``--set train.steps=2``
smoke check under the same prefix) is a ConfigError naming the fields, before anything runs, rather than a
silently mixed leaderboard; use another ``--experiment-prefix``.

Many drivers, one store: each cell is claimed in the store just before it runs (``tracking.cells``: a claim
run in the cell's experiment), so two ``suite`` commands started on the same plan and store share the cells
between them and never run one twice at the same time; a driver skips a cell another one holds, and each
driver's summary counts what is FINISHED when it ends.

Backends (``backends.py``): ``--backend local`` (the default) runs the cells one at a time in this process;
``--backend ray`` runs each as a Ray task on a cluster (``ray_backend.py``). Both claim and run a cell the same
way (``backends.run_cell``); the plan, the skips, the bar, the lines and the outputs here are the same for both.

ETA, rough: per cell, measured wall times where the experiment has some, else a cost model
(``suite_cost``); spread over the backend's workers (``backends.makespan``).

``--until-decided --max-seeds N``: after the configured cells, rounds of ``--seed-batch`` new seeds for the
baseline and each algorithm whose comparison against it is undecided under the anytime-valid rule
(``until_decided.py``; its planner is pure, the rounds run here through ``run_cells``). ``--dry-run
--target-mde X``: the seeds, cells and hours that X points of final pass@1 would take (``target.py``).

Outputs (after the cells; nothing with ``dry_run``): ``<out>/<scenario>/leaderboard.md`` (the suite's cells:
the leaderboard and the paired table vs grpo, as ``leaderboard --format md``), ``<out>/<scenario>/report.md``
with figures (``write_report`` over the whole experiment; logged to MLflow only when this invocation ran
cells of the scenario), and ``<out>/summary.md`` / ``<out>/suite.json``: the cross-scenario ranking
(``reporting/suite_summary.py``).
``run_suite`` returns 0 when every cell has a FINISHED run, else 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from gspo_bench.config import ConfigError, RunConfig, flatten, load_config, parse_sets, to_dict
from gspo_bench.config.loading import deep_merge
from gspo_bench.config.sections import repeated
from gspo_bench.tracking.redact import redact
from gspo_bench.suite.backends import Backend, Cell, LocalBackend, makespan
from gspo_bench.suite.cost import ALGO_COST, WARMSTART_S, cell_seconds, warmstart_key
from gspo_bench.suite.target import target_lines
from gspo_bench.reporting.claim_specs import sequence_edges
from gspo_bench.suite.until_decided import DEFAULT_SEED_BATCH, Extension, run_until_decided
from gspo_bench.reporting.leaderboard import DEFAULT_BASELINE
from gspo_bench.reporting.frame import FINISHED
from gspo_bench.tracking.ui import benchmark_run

SCENARIOS = ("long", "offpolicy", "stale", "moe-bf16", "hot", "entropy")
DEFAULT_PREFIX = "suite"
DEFAULT_OUT = "results/suite"
DEFAULT_SEEDS = 3
# config fields a cell may differ in from an earlier FINISHED run of it
NOT_COMPARED = ("algos", "seeds", "tracking.", "train.progress", "train.checkpoint_every")


@dataclass
class SuiteRequest:
    scenarios: tuple[str, ...] = SCENARIOS
    algos: list[str] | None = None  # None: every registered algorithm
    seeds: list[int] = field(default_factory=lambda: list(range(DEFAULT_SEEDS)))
    prefix: str = DEFAULT_PREFIX
    tracking_uri: str | None = None
    out: str = DEFAULT_OUT
    sets: tuple[str, ...] = ()
    progress: bool = True
    dry_run: bool = False
    command: str = "python -m gspo_bench suite"
    until_decided: bool = False  # then add seeds to undecided comparisons (``until_decided.py``)
    max_seeds: int | None = None  # with until_decided: the most seeds a scenario gets, configured ones included
    seed_batch: int | None = None  # with until_decided: seeds added per round (None: DEFAULT_SEED_BATCH)
    target_mde: float | None = None  # with dry_run: the seeds and hours to detect this many points (``target.py``)
    backend: str = "local"  # where the cells run: local (this process) | ray (``ray_backend.py``)
    ray_address: str | None = None  # with ray: the cluster (None: $RAY_ADDRESS, else local)
    cpus_per_cell: float | None = None  # with ray: CPUs of a cell's task (None: from the scenario's settings)
    gpus_per_cell: float | None = None  # with ray: GPUs of a cell's task (None: from train.accelerator / devices)


@dataclass
class ScenarioPlan:
    name: str
    cfg: RunConfig
    uri: str
    done: dict[tuple[str, int], str]  # (algo, seed) -> a FINISHED run id
    todo: list[tuple[str, int]]  # (algo, seed), seed-major like ``run``
    per_cell: dict[str, tuple[float, str]]  # algo -> (estimated seconds, where the estimate comes from)
    warmstart_s: dict[int, float]  # seed -> seconds of a warm start still to build (0: cached or disabled)

    @property
    def experiment(self) -> str:
        return self.cfg.tracking.experiment

    def estimates(self) -> list[float]:
        """Seconds per ``todo`` cell; the first cell of a seed carries its warm start."""
        seen, out = set(), []
        for algo, seed in self.todo:
            out.append(self.per_cell[algo][0] + (0.0 if seed in seen else self.warmstart_s.get(seed, 0.0)))
            seen.add(seed)
        return out


@dataclass
class Plan:
    scenarios: list[ScenarioPlan]
    algos: list[str]
    seeds: list[int]

    cells = property(lambda self: len(self.scenarios) * len(self.algos) * len(self.seeds))
    done = property(lambda self: sum(len(s.done) for s in self.scenarios))  # cells FINISHED before this run

    def wall_s(self, workers: int = 1) -> float:
        """The to-do cells' estimates spread over ``workers`` in the plan's order (``backends.makespan``; one
        worker: their sum)."""
        return makespan([e for s in self.scenarios for e in s.estimates()], workers)


def fmt_s(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{int(s // 3600)} h {round(s % 3600 / 60):02d} min"


# -- config, MLflow look-up, estimates --------------------------------------------------------------------------
def scenario_config(name: str, req: SuiteRequest, algos: list[str]) -> RunConfig:
    over = {"algos": algos, "seeds": list(req.seeds), "tracking": {"experiment": f"{req.prefix}-{name}"},
            "train": {"progress": False}}  # the suite's bar is over cells; Lightning's would fight it
    if req.tracking_uri:
        over["tracking"]["tracking_uri"] = req.tracking_uri
    return load_config(name, (), deep_merge(parse_sets(list(req.sets)), over))


def cell_runs(uri: str, experiment: str) -> list:
    """The experiment's MLflow runs that can be cells (no report, study or trial run); none, without creating
    anything, when the sqlite file or the experiment does not exist."""
    from gspo_bench.reporting.frame import quiet_mlflow
    from gspo_bench.tracking.client import client as tracking_client

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).expanduser().is_file():
        return []
    quiet_mlflow()
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    page = client.search_runs([exp.experiment_id], max_results=1000)
    runs = list(page)
    while page.token:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=page.token)
        runs += page
    return [r for r in runs if benchmark_run(r.data.tags)]


def _param_text(v) -> str:  # as runs.open_run + Lightning's MLFlowLogger store a param
    return str("null" if v is None else v)[:250]


def config_differences(cfg: RunConfig, params: dict[str, str]) -> list[str]:
    """``field: run value != this value`` for every compared config field the run logged differently."""
    mine = {k: _param_text(v) for k, v in flatten(to_dict(cfg)).items() if not k.startswith(NOT_COMPARED)}
    return [f"{k}: {params[k]} != {v}" for k, v in sorted(mine.items()) if k in params and params[k] != v]


def plan_scenario(name: str, req: SuiteRequest, algos: list[str]) -> ScenarioPlan:
    from gspo_bench.train.runner import validate

    cfg = scenario_config(name, req, algos)
    uri = validate(cfg, here=req.backend == "local")
    done: dict[tuple[str, int], str] = {}
    walls: dict[str, list[float]] = {}
    cells = {(a, str(s)): (a, s) for a in algos for s in req.seeds}
    for r in cell_runs(uri, cfg.tracking.experiment):
        tags = r.data.tags
        cell = cells.get((tags.get("algo"), tags.get("seed")))
        if r.info.status != FINISHED or tags.get("preset") != name or cell is None:
            continue
        diff = config_differences(cfg, dict(r.data.params))
        if diff:
            raise ConfigError(f"experiment {cfg.tracking.experiment!r} holds a FINISHED run of cell {name}/"
                              f"{cell[0]}/seed {cell[1]} (run {r.info.run_id}) with other settings ("
                              f"{'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''}); use another "
                              "--experiment-prefix, or the same settings to resume")
        done.setdefault(cell, r.info.run_id)
        if "time/wall_s" in r.data.metrics:
            walls.setdefault(cell[0], []).append(r.data.metrics["time/wall_s"])
    # an algorithm not measured yet: the grpo-equivalent mean of the measured ones, x its own ALGO_COST
    every = [w / ALGO_COST.get(b, 1.0) for b, ws in walls.items() for w in ws]
    per_cell = {}
    for a in algos:
        if walls.get(a):
            per_cell[a] = (sum(walls[a]) / len(walls[a]), f"measured, {len(walls[a])} finished {a} run(s)")
        elif every:
            per_cell[a] = (sum(every) / len(every) * ALGO_COST.get(a, 1.0),
                           f"scaled by ALGO_COST from {len(every)} finished run(s) of other algorithms")
        else:
            per_cell[a] = (cell_seconds(cfg, a), "cost model")
    todo = [(a, s) for s in req.seeds for a in algos if (a, s) not in done]
    return ScenarioPlan(name, cfg, uri, done, todo, per_cell, {})


def make_plan(req: SuiteRequest) -> Plan:
    """Every scenario's config (checked like ``run`` checks it) and its done / to-do cells; ConfigError first."""
    from gspo_bench import algorithms

    if not req.scenarios:
        raise ConfigError("--scenarios names no scenario")
    if not req.seeds or any(s < 0 for s in req.seeds):
        raise ConfigError(f"seeds {req.seeds} must be one or more non-negative integers")
    from gspo_bench.config import presets

    for flag, items in (("--scenarios", req.scenarios), ("--algos", req.algos or []), ("--seed", req.seeds)):
        if len(set(items)) != len(items):  # the rule of ``run``: each cell once, never a seed counted twice
            raise ConfigError(f"{flag} names {repeated(list(items))} more than once (each scenario, algorithm and "
                              "seed runs once)")
    unknown = [n for n in dict.fromkeys(req.scenarios) if n not in presets()]
    if unknown:
        raise ConfigError(f"--scenarios: {', '.join(map(repr, unknown))} not a preset (presets: "
                          f"{', '.join(presets())})")
    algos = list(dict.fromkeys(req.algos or algorithms.names()))
    if (req.until_decided or req.target_mde is not None) and DEFAULT_BASELINE not in algos:
        flag = "--until-decided" if req.until_decided else "--target-mde"
        raise ConfigError(f"{flag} compares every algorithm against {DEFAULT_BASELINE}: add {DEFAULT_BASELINE} to "
                          "--algos")
    if (req.until_decided or req.target_mde is not None) and len(algos) < 2:
        raise ConfigError(f"--algos {algos[0]}: one algorithm has no comparison to decide or size")
    plan = Plan([plan_scenario(n, req, algos) for n in dict.fromkeys(req.scenarios)], algos,
                list(dict.fromkeys(req.seeds)))
    charge_warmstarts(plan)
    return plan


def charge_warmstarts(plan: Plan) -> None:
    """Each to-do seed's warm start in ``warmstart_s``: WARMSTART_S for the first cell needing an uncached one."""
    from gspo_bench.train.warmstart import for_model  # here: the parser imports this module, transformers stays unloaded

    charged: set[str] = set()  # scenarios sharing task, model and warm-start config share the checkpoint
    for sp in plan.scenarios:
        for seed in dict.fromkeys(seed for _, seed in sp.todo):
            # a built-in model that is never warm-started (qwen3-0.6b-arch) costs none, whatever the config says
            key = warmstart_key(sp.cfg, seed) if for_model(sp.cfg.warmstart, sp.cfg.model.name).enabled else None
            sp.warmstart_s[seed] = WARMSTART_S if key and key not in charged else 0.0
            charged.add(key or "")


def check_request(req: SuiteRequest) -> None:
    """The options that go together (ConfigError, one line, before any work): ``--until-decided`` needs
    ``--max-seeds`` at or above the configured seeds and a ``--seed-batch`` >= 1, and excludes ``--target-mde``;
    ``--max-seeds`` and ``--seed-batch`` need it; ``--target-mde`` needs ``--dry-run`` and a positive value;
    ``--ray-address``, ``--cpus-per-cell`` and ``--gpus-per-cell`` need ``--backend ray``, and a cell at least some
    CPU and no negative GPUs."""
    if req.backend not in ("local", "ray"):
        raise ConfigError(f"--backend {req.backend!r}: local or ray")
    if req.backend != "ray":
        for flag, value in (("--ray-address", req.ray_address), ("--cpus-per-cell", req.cpus_per_cell),
                            ("--gpus-per-cell", req.gpus_per_cell)):
            if value is not None:
                raise ConfigError(f"{flag} applies only with --backend ray")
    if req.cpus_per_cell is not None and not req.cpus_per_cell > 0:
        raise ConfigError(f"--cpus-per-cell {req.cpus_per_cell:g} must be > 0")
    if req.gpus_per_cell is not None and not req.gpus_per_cell >= 0:
        raise ConfigError(f"--gpus-per-cell {req.gpus_per_cell:g} must be >= 0")
    if req.until_decided:
        if req.max_seeds is None:
            raise ConfigError("--until-decided needs --max-seeds N (the most seeds a scenario may get)")
        if req.target_mde is not None:
            raise ConfigError("--until-decided and --target-mde exclude each other: the first adds seeds until the "
                              "comparisons are decided, the second sizes a fixed number of seeds in advance")
        configured = list(dict.fromkeys(req.seeds))
        if req.max_seeds < len(configured):
            raise ConfigError(f"--max-seeds {req.max_seeds} is below the {len(configured)} configured seed(s) "
                              f"({', '.join(map(str, configured))})")
        if req.seed_batch is not None and req.seed_batch < 1:
            raise ConfigError(f"--seed-batch {req.seed_batch} must be >= 1")
    else:
        for flag, value in (("--max-seeds", req.max_seeds), ("--seed-batch", req.seed_batch)):
            if value is not None:
                raise ConfigError(f"{flag} applies only with --until-decided")
    if req.target_mde is not None:
        if not req.dry_run:
            raise ConfigError("--target-mde plans without running: use it with --dry-run")
        if not req.target_mde > 0:
            raise ConfigError(f"--target-mde {req.target_mde:g}: a difference to detect must be > 0 (points of "
                              "final pass@1)")


def plan_lines(plan: Plan, backend: Backend | None = None) -> list[str]:
    p, workers = plan, backend.workers if backend is not None else 1
    lines = [f"suite: {len(p.scenarios)} scenario(s) x {len(p.algos)} algorithm(s) x {len(p.seeds)} seed(s) = "
             f"{p.cells} cells: {p.done} already done, {p.cells - p.done} to run",
             f"algorithms: {', '.join(p.algos)}; seeds: {', '.join(map(str, p.seeds))}"]
    for s in p.scenarios:
        c, t = s.cfg, s.cfg.train
        sources = sorted({s.per_cell[a][1] for a, _ in s.todo})
        per = sum(s.per_cell[a][0] for a, _ in s.todo) / len(s.todo) if s.todo else 0.0
        builds = sum(v > 0 for v in s.warmstart_s.values())
        lines.append(f"  {s.name} (experiment {s.experiment}): {c.task} / {c.model.name}, {t.steps} steps x "
                     f"{c.rollout.prompts_per_step} prompts x {c.rollout.group_size}; {len(s.done)} done, "
                     f"{len(s.todo)} to run" + (f", ~{fmt_s(per)} per cell ({'; '.join(sources)})"
                                                + (f" + {builds} warm start(s) to build (~{fmt_s(WARMSTART_S)} each)"
                                                   if builds else "") + f" -> ~{fmt_s(sum(s.estimates()))}"
                                                if s.todo else ""))
    if backend is not None and backend.name != "local":
        lines.append(backend.describe())
    lines.append(f"ETA: ~{fmt_s(p.wall_s(workers))}" + (f" on {workers} workers" if workers > 1 else "")
                 + " (rough: measured cells where the experiments have some, else the cost model of "
                 "gspo_bench/suite/run.py)")
    return lines


def worst_case_lines(plan: Plan, req: SuiteRequest) -> list[str]:
    """``--until-decided --dry-run``: what the seed batches may add at most, if no comparison is ever decided."""
    batch = req.seed_batch or DEFAULT_SEED_BATCH
    lines = [f"until decided: then batches of {batch} seed(s) for the baseline ({DEFAULT_BASELINE}) and each "
             f"algorithm whose comparison against it is undecided, up to {req.max_seeds} seeds per scenario"]
    from gspo_bench.train.warmstart import for_model

    total = 0.0
    for s in plan.scenarios:
        more = max(0, req.max_seeds - len(plan.seeds))
        warm = WARMSTART_S if for_model(s.cfg.warmstart, s.cfg.model.name).enabled else 0.0  # per new seed, if uncached
        seconds = more * (sum(s.per_cell[a][0] for a in plan.algos) + warm)
        total += seconds
        lines.append(f"  {s.name}: at most {more} more seed(s), {more * len(plan.algos)} cell(s), "
                     f"~{fmt_s(seconds)}")
    lines.append(f"until decided, worst case (nothing decided): ~{fmt_s(total)} more; a decided comparison's "
                 "algorithm gets no further seed")
    return lines


# -- running -----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def open_backend(req: SuiteRequest, plan: Plan):
    """The request's backend, checked against the plan (a ConfigError before any cell runs), closed after."""
    if req.backend == "local":
        yield LocalBackend()
        return
    from gspo_bench.suite import ray_backend

    backend = ray_backend.connect(ray_backend.RayRequest(req.ray_address, req.cpus_per_cell, req.gpus_per_cell),
                                  [(s.name, s.cfg, s.uri) for s in plan.scenarios])
    try:
        yield backend
    finally:
        backend.close()


def plan_cells(plan: Plan) -> list[Cell]:
    """The plan's to-do cells, each with its scenario's config for that algorithm and seed alone."""
    return [Cell(s.name, dataclasses.replace(s.cfg, algos=[a], seeds=[seed]), s.uri, a, seed, est)
            for s in plan.scenarios for (a, seed), est in zip(s.todo, s.estimates())]


def run_cells(plan: Plan, log, progress: bool, console=None, backend: Backend | None = None) -> dict[str, int]:
    """Run every to-do cell on ``backend`` (default: this process) under one bar; returns {scenario: cells run}.
    Never raises for a failed cell. The ETA after each cell: the cells left, at the estimates scaled by how long
    the ended cells took against theirs, spread over the backend's workers."""
    backend = backend or LocalBackend()
    cells = plan_cells(plan)
    for s in plan.scenarios:
        for (a, seed), run_id in sorted(s.done.items(), key=lambda x: (x[0][1], x[0][0])):
            log(f"skip {s.name} / {a} / seed {seed}: already FINISHED (run {run_id})")
    ran = {s.name: 0 for s in plan.scenarios}
    if not cells:
        return ran
    bar = contextlib.nullcontext()
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("ETA {task.fields[eta]}"), console=console, transient=False)
    n, workers = len(cells), backend.workers
    left_cells = set(range(n))
    spent = planned = 0.0
    with bar:
        what = "suite cells" if workers == 1 else f"suite cells, {workers} at a time"
        task = bar.add_task(what, total=n, eta=f"~{fmt_s(plan.wall_s(workers))}") if progress else None

        def started(i: int) -> None:
            if progress:
                bar.update(task, description=cells[i].label)

        for k, (i, out) in enumerate(backend.run(cells, log, on_start=started), 1):
            c = cells[i]
            left_cells.discard(i)
            for line in out.lines:  # a worker's lines, as it logged them
                log(line)
            if out.status is None:  # another driver on this store has it, or finished it since the plan
                log(f"[{k}/{n}] skip {c.label}: {out.why}")
                if progress:
                    bar.update(task, advance=1)
                continue
            ran[c.scenario] += 1
            spent, planned = spent + out.seconds, planned + c.estimate_s
            scale = spent / planned if planned > 0 else 1.0
            left = makespan([cells[j].estimate_s * scale for j in sorted(left_cells)], workers)
            log(f"[{k}/{n}] {c.label}: {out.status} in {fmt_s(out.seconds)}"
                + (f", final pass@1 {out.final:.3f}" if out.final is not None else "")
                + (f"; ETA ~{fmt_s(left)}" if k < n else ""))
            if progress:
                bar.update(task, advance=1, eta=f"~{fmt_s(left)}")
    return ran


# -- outputs -----------------------------------------------------------------------------------------------------
def scenario_runs(s: ScenarioPlan, algos: list[str], seeds: list[int] | None) -> list:
    """The scenario's cell runs as ``frame.RunData`` (FINISHED ones with their histories); ``seeds`` None: of
    every seed."""
    from gspo_bench.reporting.leaderboard import load_runs

    if not cell_runs(s.uri, s.experiment):
        return []
    keep = None if seeds is None else {str(x) for x in seeds}
    return [r for r in load_runs(s.uri, s.experiment)
            if r.tags.get("preset") == s.name and r.algo in algos and (keep is None or r.seed in keep)]


def run_extension(plan: Plan, req: SuiteRequest, ran: dict[str, int], log, console=None,
                  backend: Backend | None = None) -> Extension:
    """``--until-decided``: after the configured cells, batches of seeds for the undecided comparisons
    (``until_decided.run_until_decided``), each batch run by ``run_cells`` on ``backend`` (on Ray, one wave of
    tasks); ``ran`` counts them in."""
    from gspo_bench.reporting.suite_summary import finals_of

    by_name = {s.name: s for s in plan.scenarios}

    def read_finals(name: str) -> dict:
        return finals_of(scenario_runs(by_name[name], plan.algos, None), plan.algos)

    def run_batch(cells: dict[str, list[tuple[str, int]]]) -> None:
        batch = Plan([dataclasses.replace(by_name[n], done={}, todo=list(c), warmstart_s={}) for n, c in cells.items()],
                     plan.algos, sorted({seed for c in cells.values() for _, seed in c}))
        charge_warmstarts(batch)
        for name, count in run_cells(batch, log, req.progress, console, backend).items():
            ran[name] = ran.get(name, 0) + count

    def edges(name: str) -> dict[str, float]:
        # a comparison a claim registers is decided against its region's edge, as its pages test it
        return sequence_edges(by_name[name].experiment, plan.algos, DEFAULT_BASELINE)

    tried = {(s.name, a, seed) for s in plan.scenarios for a, seed in s.todo}
    return run_until_decided([s.name for s in plan.scenarios], plan.seeds, plan.algos, DEFAULT_BASELINE,
                             req.max_seeds, req.seed_batch or DEFAULT_SEED_BATCH, read_finals, run_batch, tried, log,
                             edges=edges)


def write_outputs(plan: Plan, req: SuiteRequest, ran: dict[str, int], wall_s: float, log,
                  extension: Extension | None = None, workers: int = 1) -> tuple[dict, int]:
    """Per scenario ``leaderboard.md`` and the report, then ``summary.md`` and ``suite.json``; returns the
    summary dict and the exit code (0: every cell FINISHED). ``extension``: the seeds and cells
    ``--until-decided`` added, counted in, and its sequential decisions reported; ``workers``: the cells the
    backend ran at a time."""
    from gspo_bench.reporting.report import write_report
    from gspo_bench.reporting.suite_summary import (collapses_of, finals_of, leaderboard_md, rank_suite,
                                                    sequential_json, summary_markdown)
    from gspo_bench.tracking.provenance import git_commit, machine

    out = Path(req.out)
    per_scenario, collapses, info = {}, {}, {}
    finished_cells, cell_s, n_cells = 0, 0.0, 0
    for s in plan.scenarios:
        seeds = extension.seeds[s.name] if extension else plan.seeds
        cells = {(a, str(x)) for a in plan.algos for x in plan.seeds}
        cells |= {(a, str(x)) for a, x in (extension.cells[s.name] if extension else [])}
        n_cells += len(cells)
        runs = scenario_runs(s, plan.algos, seeds)
        folder = out / s.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "leaderboard.md").write_text(leaderboard_md(runs, s.name, s.experiment, DEFAULT_BASELINE,
                                                              made_by=(req.command, git_commit())))
        outputs = f"`{s.name}/leaderboard.md`"
        if not runs:
            outputs += ", no report (no run)"
        else:
            try:
                write_report(s.uri, s.experiment, folder, command=req.command,
                             log_to_mlflow=ran.get(s.name, 0) > 0)
                outputs += f", `{s.name}/report.md`"
            except Exception as e:  # the cells are tracked already; a report problem must not hide the summary
                log(f"[warning] report for {s.name} not written: {type(e).__name__}: {e}")
                outputs += f", no report ({type(e).__name__})"
        per_scenario[s.name] = finals_of(runs, plan.algos)
        for a, n in collapses_of(runs).items():
            collapses[a] = collapses.get(a, 0) + n
        done = {(r.algo, r.seed) for r in runs if r.status == FINISHED} & cells
        finished_cells += len(done)
        cell_s += sum(r.metrics.get("time/wall_s", 0.0) for r in runs
                      if r.status == FINISHED and (r.algo, r.seed) in cells)
        info[s.name] = {"experiment": s.experiment, "task": s.cfg.task, "model": s.cfg.model.name,
                        "cells": len(cells), "finished": len(done), "ran": ran.get(s.name, 0), "outputs": outputs,
                        "seeds": seeds}
    result = rank_suite(per_scenario, {a: collapses.get(a, 0) for a in plan.algos})
    meta = {"prefix": req.prefix, "command": req.command, "commit": git_commit(), "machine": machine(),
            "tracking_uri": redact(plan.scenarios[0].uri), "algos": plan.algos, "seeds": plan.seeds, "cells": n_cells,
            "finished": finished_cells, "ran": sum(ran.values()), "skipped": plan.done, "wall_s": wall_s,
            "cell_s": cell_s, "scenario_info": info, "backend": req.backend, "workers": workers}
    if extension is not None:
        meta["sequential"] = sequential_json(per_scenario, DEFAULT_BASELINE, req.max_seeds,
                                             req.seed_batch or DEFAULT_SEED_BATCH, extension.rounds,
                                             edges={s.name: sequence_edges(s.experiment, plan.algos, DEFAULT_BASELINE)
                                                    for s in plan.scenarios})
    code = 0 if finished_cells == n_cells else 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(summary_markdown(result, meta) + "\n")
    doc = {**meta, "exit_code": code, "scenarios": list(result["scenarios"]), "ranking": result}
    (out / "suite.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return doc, code


def run_suite(req: SuiteRequest, log=print, console=None) -> int:
    """Plan (ConfigError on bad input, before anything runs), print it, run the missing cells, write the outputs."""
    from gspo_bench.tracking.runs import quiet

    t0 = time.perf_counter()
    quiet()
    check_request(req)
    plan = make_plan(req)
    with open_backend(req, plan) as backend:  # a cluster that cannot run the plan: one line, nothing run
        for line in plan_lines(plan, backend):
            log(line)
        if req.dry_run:
            if req.until_decided:
                for line in worst_case_lines(plan, req):
                    log(line)
            if req.target_mde is not None:
                runs = {s.name: scenario_runs(s, plan.algos, None) for s in plan.scenarios}
                for line in target_lines(plan, req.target_mde, DEFAULT_BASELINE, runs):
                    log(line)
            log("dry run: nothing run, nothing written")
            return 0
        ran = run_cells(plan, log, req.progress, console, backend)
        extension = run_extension(plan, req, ran, log, console, backend) if req.until_decided else None
        workers = backend.workers
    doc, code = write_outputs(plan, req, ran, time.perf_counter() - t0, log, extension, workers)
    log(f"suite: {doc['finished']}/{doc['cells']} cells FINISHED ({doc['ran']} run now, {doc['skipped']} already "
        f"done) in {fmt_s(doc['wall_s'])}; wrote {Path(req.out) / 'summary.md'} and {Path(req.out) / 'suite.json'}")
    return code
