"""Several runs of one (algorithm, seed): the one rule by which every paired view counts them.

A seed is the unit of pairing (``paired.py``): seed s of two algorithms, or of two splits of one, shares its
warm start and prompt order. A view can still hold several FINISHED runs of one algorithm and seed in one of
its cells. The paired table, the split table, the suite's ranking and the claims count them alike:

1. Runs of the same settings (the ``gspo_bench.config`` digest, ``frame.settings_key``): the newest counts.
   Each older one is set aside as ``SUPERSEDED`` when the runs are read (``frame.newest_counts``), shown like
   a failed run and never averaged.
2. Runs of different settings that one cell still holds (a group read without ``--by`` mixing
   ``routing_replay=none`` and ``r3``, say): the seed counts once, with the mean of its runs' values. A value
   that one of them lacks (steps to +10 pts not reached, no eval logged) is missing for the seed, so that
   seed is not paired on that metric.

Only FINISHED runs with a ``seed`` tag take part (``run_table``). ``per_seed`` is step 2, grouped with
pandas, with ``runs`` = the number of runs behind each seed. The claims read the same counts but refuse a
seed with more than one run (``claims.select``): a claim's term names one setting, and a mean over settings
it does not name would test something the claim does not say.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import pandas as pd

from gspo_bench.reporting.frame import FINISHED, RunData

SEED = "seed"
RUNS = "runs"  # the column of ``per_seed`` counting the runs behind a seed


def run_table(runs: list[RunData], columns: Callable[[RunData], dict] = lambda r: {}) -> pd.DataFrame:
    """One row per FINISHED run of ``runs`` with a seed tag, in their order: ``seed``, then the run's
    ``columns(run)`` (name -> value)."""
    return pd.DataFrame.from_records([{SEED: r.seed, **columns(r)} for r in runs
                                      if r.status == FINISHED and r.seed != "?"])


def _mean_of_all(values: pd.Series) -> float:
    """The mean of ``values`` when every one is a finite number, else NaN (one run lacks it: the seed does)."""
    xs = values.tolist()
    if not all(x is not None and math.isfinite(x) for x in xs):
        return math.nan
    # the value of a seed = (1/k) sum_i value(run_i), over its k runs
    return statistics.fmean(xs)


def per_seed(table: pd.DataFrame, keys: list[str], values: list[str] | None = None) -> pd.DataFrame:
    """Step 2 of the rule (see the module docstring) over ``table`` (``run_table``'s): one row per (*keys,
    seed), index in that order and sorted; per column of ``values`` (default: every column but the keys and
    the seed) the mean of the seed's runs, NaN when any of them lacks it; ``runs``: how many runs."""
    if values is None:
        values = [c for c in table.columns if c not in (*keys, SEED)]
    index = [*keys, SEED]
    if table.empty:
        return pd.DataFrame(columns=[*values, RUNS], index=pd.MultiIndex.from_arrays([[]] * len(index),
                                                                                   names=index))
    grouped = table.groupby(index, sort=True)
    out = grouped[values].agg(_mean_of_all) if values else pd.DataFrame(index=grouped.size().index)
    out[RUNS] = grouped.size()
    return out
