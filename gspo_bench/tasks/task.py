"""Tasks: data plus a pure ``verify(completion, answer) -> float``.

A task is declared by a YAML spec file (``tasks/<name>.yaml`` ships the
built-in ones). ``kind`` picks a data generator/loader from ``GENERATORS``
(``generators.py``) and ``verifier`` picks a pure function from ``VERIFIERS``
(``verifiers.py``), called with the spec's ``verifier_params`` as keyword
arguments; adding a task of an existing kind is one spec file, a new kind adds
one entry to a registry.

Every data set has the columns ``prompt``, ``answer`` (what the verifier
compares against) and ``target`` (the supervised completion the warm start
trains on).
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from gspo_bench.config.loading import yaml_file
from gspo_bench.tasks.generators import (
    GENERATORS,
    check_data_file,
    generate_arith,
    generate_countdown,
    load_file,
    load_jsonl,
    register_generator,
)
from gspo_bench.paths import builtin_dir
from gspo_bench.tasks.verifiers import (
    VERIFIER_REQUIRES,
    VERIFIERS,
    Verifier,
    missing_extra_message,
    register_verifier,
    verify_countdown,
    verify_exact,
    verify_gsm8k,
    verify_last_line,
    verify_math,
    verify_scratchpad,
)

__all__ = [
    "GENERATORS", "VERIFIERS", "Task", "TaskSpec", "Verifier", "builtin_tasks", "generate_arith",
    "generate_countdown", "load_file", "load_jsonl", "load_task", "register_generator", "register_verifier",
    "resolve_task_spec", "verify_countdown", "verify_exact", "verify_gsm8k", "verify_last_line", "verify_math",
    "verify_scratchpad",
]


REWARD_PARAMS = {"partial_credit"}  # verifier parameters that are rewards, so must lie in [0, 1]


@dataclass
class TaskSpec:
    """A task declaration, as read from its YAML file."""

    name: str
    kind: str
    verifier: str = "exact"
    description: str = ""
    max_new_tokens: int = 8
    params: dict[str, Any] = field(default_factory=dict)
    verifier_params: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the verifier, e.g. ``{partial_credit: 0.1}`` for ``countdown``."""

    def __post_init__(self):
        self.params = self.params or {}
        self.verifier_params = self.verifier_params or {}
        if self.kind not in GENERATORS:
            raise ValueError(f"task {self.name!r}: unknown kind {self.kind!r} (allowed: {', '.join(GENERATORS)})")
        if self.verifier not in VERIFIERS:
            raise ValueError(
                f"task {self.name!r}: unknown verifier {self.verifier!r} (allowed: {', '.join(VERIFIERS)})"
            )
        try:
            inspect.signature(VERIFIERS[self.verifier]).bind("", "", **self.verifier_params)
        except TypeError as e:
            raise ValueError(f"task {self.name!r}: verifier_params {self.verifier_params} do not fit "
                             f"verifier {self.verifier!r}: {e}") from None
        for key in REWARD_PARAMS & self.verifier_params.keys():
            v = self.verifier_params[key]
            # a reward the verifier hands out must be a reward: a number in [0, 1]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"task {self.name!r}: verifier_params.{key}={v!r} must be a number in [0, 1]")
        if self.verifier in VERIFIER_REQUIRES:
            module, extra = VERIFIER_REQUIRES[self.verifier]
            # fail when the spec is read, not at the first reward after a warm start
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"task {self.name!r}: " + missing_extra_message(module, extra))


@dataclass
class Task:
    spec: TaskSpec
    train: datasets.Dataset
    eval: datasets.Dataset

    @property
    def name(self) -> str:
        return self.spec.name

    def verify(self, completion: str, answer: str) -> float:
        return VERIFIERS[self.spec.verifier](completion, answer, **self.spec.verifier_params)


def builtin_tasks() -> dict[str, Path]:
    return {p.stem: p for p in sorted((builtin_dir("tasks")).glob("*.yaml"))}


def resolve_task_spec(ref: str) -> TaskSpec:
    """A built-in task name or a path to a spec YAML file."""
    known = builtin_tasks()
    if ref in known:
        path = known[ref]
    elif Path(ref).expanduser().is_file():
        path = Path(ref).expanduser()
    else:
        raise ValueError(f"unknown task {ref!r} (allowed: {', '.join(known)}, or a path to a task YAML)")
    raw = yaml_file(path) or {}
    raw.setdefault("name", path.stem)
    params = raw.get("params") or {}
    for key in ("path", "eval_path"):
        # data files named in a spec are found next to the spec first
        if isinstance(params.get(key), str) and not Path(params[key]).expanduser().is_absolute():
            beside = path.parent / params[key]
            if beside.exists():
                params[key] = str(beside)
    try:
        return TaskSpec(**raw)
    except TypeError as e:
        raise ValueError(f"task spec {path}: {e}") from None


def check_task_data(spec: TaskSpec) -> None:
    """A file task's data files, checked cheaply (``generators.check_data_file``) with the generator's own
    defaults for the fields, so nothing here restates them; other kinds generate their data and pass."""
    if GENERATORS[spec.kind] is not load_file:
        return
    args = inspect.signature(load_file).bind(0, **spec.params)
    args.apply_defaults()
    a = args.arguments
    fields = (a["prompt_field"], a["answer_field"], a["target_field"] or a["answer_field"])
    for p in filter(None, (a["path"], a["eval_path"])):
        check_data_file(p, a["format"], fields)


def load_task(ref: str, seed: int) -> Task:
    """The spec and its train / eval data; any failure to read the data is a one-line ValueError naming the
    task (a missing, empty, malformed or non-UTF-8 file is the user's input, not a bug to show a traceback of)."""
    spec = resolve_task_spec(ref)
    try:
        train, eval_ = GENERATORS[spec.kind](seed, **spec.params)
    except ValueError:
        raise
    except Exception as e:  # datasets raises its own types (DatasetGenerationError, ...) for bad files
        cause = e.__cause__ or e  # datasets wraps the parser's error, which says what is wrong and where
        first = (str(cause).strip().splitlines() or [""])[0]
        raise ValueError(f"task {spec.name!r}: cannot load its data: {type(cause).__name__}: {first}") from None
    if len(train) == 0 or len(eval_) == 0:
        raise ValueError(f"task {spec.name!r}: no data ({len(train)} train rows, {len(eval_)} eval rows)")
    return Task(spec, train, eval_)
