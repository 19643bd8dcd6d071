"""Tasks: data plus a pure ``verify(completion, answer) -> float``.

A task is declared by a YAML spec file (``tasks/<name>.yaml`` ships the
built-in ones). ``kind`` picks a data generator/loader from ``GENERATORS`` and
``verifier`` picks a pure function from ``VERIFIERS``; adding a task of an
existing kind is one spec file, a new kind adds one entry to a registry here.

Every data set has the columns ``prompt``, ``answer`` (what the verifier
compares against) and ``target`` (the supervised completion the warm start
trains on).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import datasets

from gspo_bench.config import load_yaml
from gspo_bench.paths import builtin_dir

Verifier = Callable[[str, str], float]
VERIFIERS: dict[str, Verifier] = {}
GENERATORS: dict[str, Callable[..., tuple[datasets.Dataset, datasets.Dataset]]] = {}


def register_verifier(name: str):
    def deco(fn: Verifier) -> Verifier:
        VERIFIERS[name] = fn
        return fn

    return deco


def register_generator(name: str):
    def deco(fn):
        GENERATORS[name] = fn
        return fn

    return deco


@register_verifier("exact")
def verify_exact(completion: str, answer: str) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, is exactly the answer."""
    return float(completion.strip() == answer.strip())


@register_verifier("last_line")
def verify_last_line(completion: str, answer: str) -> float:
    """1.0 when the last non-empty line of the completion is exactly the answer (scratchpads)."""
    lines = [ln.strip() for ln in completion.strip().splitlines() if ln.strip()]
    return float(bool(lines) and lines[-1] == answer.strip())


@register_generator("arith")
def generate_arith(
    seed: int, min_digits: int = 1, max_digits: int = 2, n_train: int = 20000, n_eval: int = 256
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Multi-digit addition ``a+b=`` -> ``a+b``; train and eval pairs are disjoint.

    Pairs are drawn without replacement from one seeded stream, the first
    ``n_eval`` go to eval, so no (a, b) appears in both splits. When the space
    of pairs is small the train split is all of the remainder.
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"arith needs 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    if n_eval < 1 or n_train < 0:
        raise ValueError(f"arith needs n_eval >= 1 and n_train >= 0, got n_eval={n_eval}, n_train={n_train}")
    lo = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    hi = 10**max_digits - 1
    space = (hi - lo + 1) ** 2
    if n_eval >= space:
        raise ValueError(f"arith: n_eval={n_eval} leaves no training pairs (only {space} pairs exist)")
    rng = random.Random(seed)
    n_total = min(space, n_eval + n_train)
    seen: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int]] = []
    while len(pairs) < n_total:
        p = (rng.randint(lo, hi), rng.randint(lo, hi))
        if p not in seen:
            seen.add(p)
            pairs.append(p)

    def rows(ps):
        return {
            "prompt": [f"{a}+{b}=" for a, b in ps],
            "answer": [str(a + b) for a, b in ps],
            "target": [str(a + b) for a, b in ps],
        }

    return datasets.Dataset.from_dict(rows(pairs[n_eval:])), datasets.Dataset.from_dict(rows(pairs[:n_eval]))


@register_generator("jsonl")
def load_jsonl(
    seed: int, path: str, eval_path: str | None = None, n_eval: int = 256,
    prompt_field: str = "prompt", answer_field: str = "answer", target_field: str | None = None,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A local JSONL/JSON file with prompt and answer fields, loaded through ``datasets``."""
    def load(p: str) -> datasets.Dataset:
        ds = datasets.load_dataset("json", data_files=str(Path(p).expanduser()), split="train")
        missing = {prompt_field, answer_field} - set(ds.column_names)
        if missing:
            raise ValueError(f"{p}: missing field(s) {sorted(missing)}; columns are {ds.column_names}")
        tgt = target_field or answer_field
        return ds.map(
            lambda r: {"prompt": r[prompt_field], "answer": str(r[answer_field]), "target": str(r[tgt])},
            remove_columns=ds.column_names,
        )

    train = load(path)
    if eval_path:
        return train, load(eval_path)
    split = train.train_test_split(test_size=min(n_eval, len(train) // 2), seed=seed)
    return split["train"], split["test"]


@dataclass
class TaskSpec:
    """A task declaration, as read from its YAML file."""

    name: str
    kind: str
    verifier: str = "exact"
    description: str = ""
    max_new_tokens: int = 8
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in GENERATORS:
            raise ValueError(f"task {self.name!r}: unknown kind {self.kind!r} (allowed: {', '.join(GENERATORS)})")
        if self.verifier not in VERIFIERS:
            raise ValueError(
                f"task {self.name!r}: unknown verifier {self.verifier!r} (allowed: {', '.join(VERIFIERS)})"
            )


@dataclass
class Task:
    spec: TaskSpec
    train: datasets.Dataset
    eval: datasets.Dataset

    @property
    def name(self) -> str:
        return self.spec.name

    def verify(self, completion: str, answer: str) -> float:
        return VERIFIERS[self.spec.verifier](completion, answer)


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
    raw = load_yaml(path.read_text()) or {}
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


def load_task(ref: str, seed: int) -> Task:
    spec = resolve_task_spec(ref)
    train, eval_ = GENERATORS[spec.kind](seed, **spec.params)
    return Task(spec, train, eval_)
