"""The staleness grid: how each loss holds its score as its samples grow stale, under each correction.

A cell is (eta, correction, algorithm, seed): the default preset with ``rollout.staleness = eta`` (the
deterministic lag: RL step t trains on samples from the policy of step t - eta, so cells are paired by seed and
exact) and one correction:

- ``naive``: ratios against the stale sampler's own log-probs (``rollout.old_logp_source=rollout``), what an
  asynchronous trainer without a correction does;
- ``tis``: decoupled PPO, the trainer's log-probs before the step's first update as the proximal policy
  (``old_logp_source=recompute``) and the behaviour weight exp(prox - sampler) truncated at 2 per token
  (``rollout.correction=tis``, ``correction_level=token``);
- ``m2po``: the proximal policy recomputed, and the tokens of largest squared log-ratio to the sampler masked
  until the rest's mean is under 0.04 (``rollout.m2_threshold``); token-unit losses only, so not gspo;
- ``is``: the ``rollout_is`` loss, whose ratio is to the sampler and which needs no correction of its own.

Each (eta, correction) is one experiment, ``staleness-e<eta>-<correction>``, so that every algorithm of a cell
shares its seed's warm start and prompt order with every other cell of that seed.
"""

from __future__ import annotations

from dataclasses import dataclass

ETAS = (0, 2, 4, 8)
SEEDS = "0,1,2,3"  # the first round's seeds, fixed before any run


@dataclass(frozen=True)
class Correction:
    name: str
    algos: tuple[str, ...]
    sets: tuple[str, ...]  # the ``--set`` items beside rollout.staleness
    text: str


CORRECTIONS = {c.name: c for c in (
    Correction("naive", ("grpo", "gspo", "cispo"), ("rollout.old_logp_source=rollout",),
               "ratios against the stale sampler's log-probs, no correction"),
    Correction("tis", ("grpo", "gspo", "cispo"),
               ("rollout.old_logp_source=recompute", "rollout.correction=tis", "rollout.correction_level=token"),
               "decoupled PPO: recomputed proximal log-probs, the behaviour weight truncated at 2 per token"),
    Correction("m2po", ("grpo", "cispo"), ("rollout.old_logp_source=recompute", "rollout.m2_threshold=0.04"),
               "recomputed proximal log-probs and M2PO's second-moment mask (threshold 0.04)"),
    Correction("is", ("rollout_is",), (), "the rollout_is loss: the ratio to the sampler, zeroed outside its band"),
)}


def experiment(eta: int, correction: str) -> str:
    return f"staleness-e{eta}-{correction}"


def command(eta: int, correction: str, seeds: str = SEEDS) -> str:
    """The ``run`` command of one (eta, correction) experiment."""
    c = CORRECTIONS[correction]
    sets = "".join(f" --set {s}" for s in (f"rollout.staleness={eta}", *c.sets))
    return f"python -m gspo_bench run --algos {','.join(c.algos)} --experiment {experiment(eta, correction)}{sets} " \
           f"--seed {seeds}"


def cells() -> list[tuple[int, str]]:
    """Every (eta, correction) of the grid, in the page's order."""
    return [(eta, c) for c in CORRECTIONS for eta in ETAS]


def experiments() -> dict[str, tuple[str, tuple[str, ...]]]:
    """experiment -> (what it is, the commands that made its runs): the claims' ``EXPERIMENTS`` entries."""
    return {experiment(eta, c): (
        f"the default preset (tiny-dense on arith, 40 RL steps) trained on samples {eta} RL steps stale "
        f"(`rollout.staleness={eta}`), {CORRECTIONS[c].text}; every cell of a seed from the same warm start",
        (command(eta, c),)) for eta, c in cells()}
