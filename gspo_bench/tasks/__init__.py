"""Tasks: data plus a pure ``verify(completion, answer) -> float``.

``task.py`` reads a task spec (YAML) and builds its train/eval splits;
``generators.py`` makes or loads the data by ``kind`` (``hub.py``: kind ``hf``,
Hugging Face data sets read offline); ``prompts.py`` renders prompts raw or
through the tokenizer's chat template; ``verifiers.py`` holds
the pure reward functions; ``sandbox.py`` runs them under a time limit. Both
registries take a new kind or verifier as one decorated function.
``environments/`` holds the ``reset``/``step`` protocol a rollout meets a
task through and its registry (``base.py``), and one file per environment:
``single_turn`` (one prompt, one completion, the verifier's reward), ``calc`` and ``guess`` (multi-turn, with
a tool).

May import: models, tracking, config, core, paths.
"""

from gspo_bench.tasks.environments import (ENVIRONMENTS, BatchEnvironment, Environment, Observation, SingleTurn,
                                           Step, environment_name, is_multi_turn, make_environment,
                                           register_environment, scripted, uses_tool)
from gspo_bench.tasks.generators import GENERATORS, generate_arith, load_jsonl, register_generator
from gspo_bench.tasks.task import Task, TaskSpec, builtin_tasks, load_task, resolve_task_spec
from gspo_bench.tasks.verifiers import VERIFIERS, register_verifier, verify_exact, verify_last_line

__all__ = ["ENVIRONMENTS", "GENERATORS", "VERIFIERS", "BatchEnvironment", "Environment", "Observation", "SingleTurn",
           "Step", "Task", "TaskSpec", "builtin_tasks", "environment_name", "generate_arith", "is_multi_turn",
           "load_jsonl", "load_task", "scripted", "uses_tool",
           "make_environment", "register_environment", "register_generator", "register_verifier",
           "resolve_task_spec", "verify_exact", "verify_last_line"]
