"""``staleness --run``: the staleness grid's cells (``reporting/staleness_grid.py``) trained in one command, each
(eta, correction) an experiment ``staleness-e<eta>-<correction>`` of its correction's algorithms on the given
seeds, seed by seed so that a stop leaves whole seeds; FINISHED runs are skipped and stopped ones continued
(``run --resume``'s rule), so the same command picks up where it stopped, and more seeds are more ``--seeds``.

Every cell's config is built and checked before the first one trains: a bad ``--set`` or seed is one line,
exit 2, before any work.
"""

from __future__ import annotations

from dataclasses import dataclass

from gspo_bench.config import RunConfig, load_config
from gspo_bench.config.loading import deep_merge
from gspo_bench.reporting.staleness_grid import CORRECTIONS, ETAS, experiment

DEFAULT_PRESET = "default"


@dataclass
class GridCell:
    eta: int
    correction: str
    cfg: RunConfig


def _sets(eta: int, correction: str) -> dict:
    """The cell's settings as nested overrides: the lag and its correction's ``--set`` items."""
    from gspo_bench.config import parse_sets

    return parse_sets([f"rollout.staleness={eta}", *CORRECTIONS[correction].sets])


def grid_cells(seeds: list[int], uri: str, preset: str = DEFAULT_PRESET, overrides: dict | None = None,
               etas: tuple[int, ...] = ETAS, corrections: tuple[str, ...] = tuple(CORRECTIONS)) -> list[GridCell]:
    """One checked config per (eta, correction) asked for: ``preset`` under ``overrides`` (the command's
    ``--set``), the cell's own settings over them, its correction's algorithms, ``seeds``, the store ``uri``.
    Overrides of what the grid sets per cell (the lag, the corrections' fields) are a ConfigError: a cell would
    silently not have them."""
    from gspo_bench.config import ConfigError

    owned = sorted({f"rollout.{k}" for c in CORRECTIONS for eta in ETAS for k in _sets(eta, c)["rollout"]})
    clash = [k for k in owned if k.split(".", 1)[1] in (overrides or {}).get("rollout", {})]
    if clash:
        raise ConfigError(f"--set {clash[0]}: the staleness grid sets it in each cell (it sets "
                          f"{', '.join(owned)}); run a cell with `run` to change it")
    cells = []
    for c in corrections:
        for eta in etas:
            over = deep_merge(overrides or {}, _sets(eta, c))
            over = deep_merge(over, {"algos": list(CORRECTIONS[c].algos), "seeds": list(seeds),
                                     "tracking": {"tracking_uri": uri, "experiment": experiment(eta, c)}})
            cells.append(GridCell(eta, c, load_config(preset, (), over)))
    return cells


def run_grid(cells: list[GridCell], log=print) -> dict[str, int]:
    """Train every cell, seed-major (all cells of a seed before the next seed); returns counts of the runs'
    statuses (a FINISHED run from before counts as FINISHED)."""
    from dataclasses import replace

    from gspo_bench.train.runner import run

    seeds = list(dict.fromkeys(s for cell in cells for s in cell.cfg.seeds))
    counts: dict[str, int] = {}
    for seed in seeds:
        for cell in cells:
            if seed not in cell.cfg.seeds:
                continue
            log(f"== staleness: eta {cell.eta}, {cell.correction}, seed {seed} "
                f"({', '.join(cell.cfg.algos)}) -> {cell.cfg.tracking.experiment}")
            for res in run(replace(cell.cfg, seeds=[seed]), log=log, resume=True):
                counts[res.status] = counts.get(res.status, 0) + 1
    return counts
