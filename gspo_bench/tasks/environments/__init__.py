"""Environments: what a policy acts in, one ``reset``/``step`` episode at a time, behind the tasks.

``base.py`` holds the seam (``Environment``, ``Step``, ``BatchEnvironment``) and the registry
(``ENVIRONMENTS``, ``register_environment``, ``make_environment``); every other module here is one
environment that registers itself, and importing this package imports each of them, so a new environment
is one more file here (docs/environments.md shows one). ``single_turn.py`` is the built-in one the rollouts
score through; ``calc.py`` and ``guess.py`` are multi-turn, each with its data generator and scripted solver;
``tools.py`` writes and reads tool calls (compact, or through a chat template).

May import: the rest of tasks, config, core (never rollout or anything above).
"""

import importlib
import pkgutil

from gspo_bench.tasks.environments.base import (ENVIRONMENTS, BatchEnvironment, Environment, Observation, Step,
                                                build_kwargs, environment_name, is_multi_turn, make_environment,
                                                register_environment, scripted, uses_tool)

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
from gspo_bench.tasks.environments.single_turn import SingleTurn  # noqa: E402

__all__ = ["ENVIRONMENTS", "BatchEnvironment", "Environment", "Observation", "SingleTurn", "Step",
           "build_kwargs", "environment_name", "is_multi_turn", "make_environment", "register_environment",
           "scripted", "uses_tool"]
