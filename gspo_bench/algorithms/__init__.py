"""The algorithms: one LightningModule class per algorithm, found by name.

``base.py`` holds the shared RL step (``PolicyModule``) and the registry;
``evaluation.py`` the held-out evaluation every algorithm shares; every other
module here defines algorithm classes with ``@register_algorithm``. Importing
this package imports each of its modules, so a new algorithm in a new file
shows up in ``run``, ``tune``, ``bench`` and ``list`` without being named
anywhere else.

May import: rollout, tasks, models, tracking, config, core (never train,
callbacks, or anything above).
"""

from __future__ import annotations

import importlib
import pkgutil

from gspo_bench.algorithms.base import ALGORITHMS, PolicyModule, register_algorithm, search_space
from gspo_bench.core.losses import LOSSES

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")


def names() -> list[str]:
    """Every registered algorithm, in the order their losses are registered (the README table's)."""
    order = list(LOSSES)
    return sorted(ALGORITHMS, key=lambda n: (order.index(n), n))


def get(name: str) -> type[PolicyModule]:
    """The algorithm class registered as ``name``; a ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r} (known: {', '.join(names())})")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "PolicyModule", "get", "names", "register_algorithm", "search_space"]
