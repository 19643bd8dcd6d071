"""Tasks: data plus a pure ``verify(completion, answer) -> float``.

A task is declared by a YAML spec file (``tasks/<name>.yaml`` ships the
built-in ones). ``kind`` picks a data generator/loader from ``GENERATORS``
(``generators.py``) and ``verifier`` picks a pure function from ``VERIFIERS``
(``verifiers.py``), called with the spec's ``verifier_params`` as keyword
arguments; adding a task of an existing kind is one spec file, a new kind adds
one entry to a registry.

Every data set has the columns ``prompt``, ``answer`` (what the verifier
compares against) and ``target`` (the supervised completion the warm start
trains on). Given the model, ``load_task`` renders the prompts as the model
will see them (raw, or through its chat template: ``prompts.py``) and drops
the rows it cannot take (``fit_to_model``); every later reader of a prompt
(warm start, rollouts, evaluation) reads that one rendering.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import datasets

from gspo_bench.config import TaskOptions
from gspo_bench.config.loading import yaml_file
from gspo_bench.tasks.hub import load_hf
from gspo_bench.tasks.generators import (
    GENERATORS,
    check_data_file,
    check_split_rows,
    count_rows,
    generate_arith,
    generate_countdown,
    load_file,
    load_jsonl,
    register_generator,
)
from gspo_bench.paths import builtin_dir
from gspo_bench.tasks.prompts import TOOL_SCHEMAS, render_prompts, rendering_key, uses_chat
from gspo_bench.tasks.sandbox import DEFAULT_TIMEOUT, VerifierSandbox
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
    max_prompt_tokens: int | None = None
    """Rows whose prompt is longer are dropped (``fit_to_model``); null = the model's context minus the
    response cap. The model's context bounds it either way."""
    chat: Union[bool, str] = "auto"
    """Prompts through the tokenizer's chat template: auto (when it has one) | true (it must) | false (raw);
    ``prompts.py`` has the rules."""
    system: str | None = None
    """System message before each prompt when the chat template renders it; with ``chat: false`` (raw prompts,
    no template) it could never be seen, so that is an error."""
    environment: str = "single_turn"
    """The environment an episode is played in (``tasks/environments``): single_turn (one completion, the
    verifier's reward) or a multi-turn one (calc, guess); ``env.name`` overrides it."""

    def __post_init__(self):
        self.params = self.params or {}
        self.verifier_params = self.verifier_params or {}
        if not (isinstance(self.chat, bool) or self.chat == "auto"):
            raise ValueError(f"task {self.name!r}: chat={self.chat!r} is not allowed (allowed: auto, true, false)")
        if self.system is not None and not isinstance(self.system, str):
            raise ValueError(f"task {self.name!r}: system={self.system!r} must be text")
        if self.system and self.chat is False:  # the message itself is not echoed: it may span lines
            raise ValueError(f"task {self.name!r}: a system message needs chat: auto or true (with chat: false the "
                             "prompts are raw text and it would never be seen); set task.chat=auto, or drop system")
        m = self.max_prompt_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"task {self.name!r}: max_prompt_tokens={m!r} must be a positive int or null")
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
        try:
            inspect.signature(GENERATORS[self.kind]).bind(0, **self.params)
        except TypeError as e:
            raise ValueError(f"task {self.name!r}: params {self.params} do not fit kind {self.kind!r}: {e}") from None


@dataclass
class Task:
    spec: TaskSpec
    train: datasets.Dataset
    eval: datasets.Dataset
    prompt_format: str | None = None
    """None: the prompts are the data's own text; else a digest of the chat template (and system message)
    they were rendered with (``prompts.rendering_key``), which the warm-start cache key carries."""

    @property
    def name(self) -> str:
        return self.spec.name

    _sandboxes: dict = field(default_factory=dict, repr=False, compare=False)

    def verify(self, completion: str, answer: str) -> float:
        """One call in this process, without a time limit (scoring during runs goes through ``score``)."""
        return VERIFIERS[self.spec.verifier](completion, answer, **self.spec.verifier_params)

    def score(self, completions: list[str], answers: list[str],
              timeout: float = DEFAULT_TIMEOUT) -> tuple[list[float], int]:
        """Rewards under a time limit per completion (``sandbox.VerifierSandbox``) and how many timed out."""
        box = self._sandboxes.get(timeout)
        if box is None:
            box = self._sandboxes[timeout] = VerifierSandbox(self.spec.verifier, self.spec.verifier_params, timeout)
        return box.score(completions, answers)

    def __getstate__(self) -> dict:
        # another process gets the spec and the data, and starts verifier workers of its own
        return {**self.__dict__, "_sandboxes": {}}


def builtin_tasks() -> dict[str, Path]:
    return {p.stem: p for p in sorted((builtin_dir("tasks")).glob("*.yaml"))}


def resolve_task_spec(ref: str, options: TaskOptions | None = None) -> TaskSpec:
    """A built-in task name or a path to a spec YAML file, with ``options`` (``--set task.FIELD=...``) over
    its own values."""
    known = builtin_tasks()
    if ref in known:
        path = known[ref]
    elif Path(ref).expanduser().is_file():
        path = Path(ref).expanduser()
    else:
        raise ValueError(f"unknown task {ref!r} (allowed: {', '.join(known)}, or a path to a task YAML)")
    raw = yaml_file(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):  # a list, a bare string (``--task /etc/passwd``), a number
        raise ValueError(f"task spec {path}: must be a YAML mapping (name, kind, verifier, params, ...), got "
                         f"{type(raw).__name__}")
    raw.setdefault("name", path.stem)
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"task spec {path}: params must be a mapping, got {type(params).__name__}")
    for key in ("path", "eval_path"):
        # data files named in a spec are found next to the spec first
        if isinstance(params.get(key), str) and not Path(params[key]).expanduser().is_absolute():
            beside = path.parent / params[key]
            if beside.exists():
                params[key] = str(beside)
    try:
        spec = TaskSpec(**raw)
    except TypeError as e:
        raise ValueError(f"task spec {path}: {e}") from None
    return with_options(spec, options) if options is not None else spec


def with_options(spec: TaskSpec, options: TaskOptions) -> TaskSpec:
    """The spec with the run's task options over its own values (a relative ``path`` is the caller's, from
    the working directory); checked again like any spec."""
    params = {**spec.params, **(options.params or {})}
    if options.path is not None:
        params["path"] = options.path
    return dataclasses.replace(spec, params=params,
                               chat=spec.chat if options.chat is None else options.chat,
                               system=spec.system if options.system is None else options.system)


def check_task_data(spec: TaskSpec) -> None:
    """A task that reads data (kinds ``file`` and ``hf``) has its rows read once here, before any work, so a bad
    row anywhere, a file that is not UTF-8 or a folder in another layout is a one-line ValueError then. A file
    task's files are first checked cheaply (``generators.check_data_file``, with the loader's own defaults for
    the fields, so nothing here restates them); then the rows are read through the task's loader
    (``read_data``, seed 0), and ``datasets`` keeps them in its cache, which the load of each seed reads. Other
    kinds generate their data and pass."""
    if GENERATORS[spec.kind] is load_file:
        args = inspect.signature(load_file).bind(0, **spec.params)
        args.apply_defaults()
        a = args.arguments
        fields = (a["prompt_field"], a["answer_field"], a["target_field"] or a["answer_field"])
        for p in filter(None, (a["path"], a["eval_path"])):
            file, fmt = check_data_file(p, a["format"], fields)
            rows = count_rows(file, fmt) if p == a["path"] and not a["eval_path"] else None
            if rows is not None:  # too few rows to split: said before reading them, as loading would say it
                try:
                    check_split_rows(p, rows)
                except ValueError as e:
                    raise ValueError(f"task {spec.name!r}: {e}") from None
    if GENERATORS[spec.kind] in (load_file, load_hf):
        read_data(spec, 0)


def read_data(spec: TaskSpec, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The spec's train and eval rows from its generator; any failure to make or read them is a one-line
    ValueError naming the task (a missing, empty, malformed or non-UTF-8 file is the user's input, not a bug to
    show a traceback of)."""
    try:
        train, eval_ = GENERATORS[spec.kind](seed, **spec.params)
    except ValueError as e:  # the generator's own check: say which task it is about
        text = str(e)
        raise ValueError(text if text.startswith("task ") else f"task {spec.name!r}: {text}") from None
    except Exception as e:  # datasets raises its own types (DatasetGenerationError, ...) for bad files
        cause = e.__cause__ or e  # datasets wraps the parser's error, which says what is wrong and where
        first = (str(cause).strip().splitlines() or [""])[0]
        raise ValueError(f"task {spec.name!r}: cannot load its data: {type(cause).__name__}: {first}") from None
    if len(train) == 0 or len(eval_) == 0:
        raise ValueError(f"task {spec.name!r}: no data ({len(train)} train rows, {len(eval_)} eval rows)")
    return train, eval_


def check_chat(spec: TaskSpec, model) -> None:
    """``chat: true`` asks for a chat template: the model's tokenizer (``model``, a ``ModelConfig``) must have
    one, checked before any work; ``auto`` and ``false`` always work and need no tokenizer here."""
    if spec.chat is not True:
        return
    from gspo_bench.models import tokenizer_and_context

    tok, _ = tokenizer_and_context(model.name, model.trust_remote_code)
    try:
        uses_chat(True, tok)
    except ValueError as e:
        raise ValueError(f"task {spec.name!r}: {e} (model {model.name!r})") from None


def load_task(ref: str, seed: int, model=None, max_new_tokens: int | None = None, log=print,
              options: TaskOptions | None = None) -> Task:
    """The spec (with ``options`` over it) and its train / eval data (``read_data``: a failure is a one-line
    ValueError naming the task). With ``model`` (a ``ModelConfig``), the prompts are rendered for that model's
    tokenizer (``render_for``) and the rows it cannot take are dropped (``fit_to_model``)."""
    spec = resolve_task_spec(ref, options)
    task = Task(spec, *read_data(spec, seed))
    if model is None:
        return task
    from gspo_bench.models import tokenizer_and_context

    tok, context = tokenizer_and_context(model.name, model.trust_remote_code)
    return fit_to_model(render_for(task, tok), tok, context, max_new_tokens or spec.max_new_tokens, log)


def render_for(task: Task, tok) -> Task:
    """The task with its prompts as ``tok``'s model sees them (``prompts.render_prompts``: raw, or through the
    chat template per ``spec.chat``, with its environment's tool where it has one); a bad ``chat`` / template is
    a one-line ValueError naming the task."""
    tools = TOOL_SCHEMAS.get(task.spec.environment)
    try:
        key = rendering_key(tok, task.spec.chat, task.spec.system, tools)
        if key is None:
            return task
        splits = [split.remove_columns("prompt").add_column(
            "prompt", render_prompts(list(split["prompt"]), tok, task.spec.chat, task.spec.system, tools))
            for split in (task.train, task.eval)]
    except ValueError as e:
        raise ValueError(f"task {task.name!r}: {e}") from None
    return Task(task.spec, *splits, prompt_format=key)


def fit_to_model(task: Task, tok, context: int, max_new_tokens: int, log=print) -> Task:
    """Drop the rows a model cannot take, so no batch is ever padded to an unbounded width.

    The rule: a row stays when its prompt has at most ``P = min(max_prompt_tokens, context - max_new_tokens)``
    tokens and prompt + target + eos at most ``context`` tokens (the warm start trains on prompt + target,
    the supervised answer;
    a rollout holds prompt + ``max_new_tokens``). Counting is cheap and bounded: a text of ``b`` UTF-8
    bytes has at most ``b + 2`` tokens, so a row short enough in bytes is kept untokenized, and one with more
    characters than the limit times the longest vocabulary entry is dropped untokenized (a 10 MB prompt is
    never tokenized; a tokenizer that normalises text away, e.g. collapses runs of spaces, may see such a
    row dropped that would have fit); only rows in between are tokenized. Drops are logged with their count; a task left with no
    train or no eval row is a ValueError.
    """
    P = min(task.spec.max_prompt_tokens or context, context - max_new_tokens)
    if P < 1:
        raise ValueError(f"task {task.name!r}: max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                         f"model's context of {context} tokens")
    longest = max(1, max((len(t) for t in tok.get_vocab()), default=1))

    def exact(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    def upper(text: str) -> int:  # no token is shorter than a byte; 2 for a tokenizer's leading piece
        return len(text.encode("utf-8", "replace")) + 2

    def keep(split) -> list[int]:
        ok = []
        # the answer as the warm start trains on it: ``target`` (e.g. the worked solution), else ``answer``
        for i, (p, a) in enumerate(zip(split["prompt"], split["target" if "target" in split.column_names
                                                           else "answer"])):
            if len(p) > longest * P or len(p) + len(a) > longest * context:
                continue  # surely too long: more characters than that many tokens can hold
            if upper(p) <= P and upper(p) + upper(a) + 1 <= context:
                ok.append(i)  # surely fits
            elif (n_p := exact(p)) <= P and n_p + exact(a) + 1 <= context:
                ok.append(i)
        return ok

    kept = {name: keep(split) for name, split in (("train", task.train), ("eval", task.eval))}
    dropped = {name: len(split) - len(kept[name]) for name, split in (("train", task.train), ("eval", task.eval))}
    if not any(dropped.values()):
        return task
    log(f"[data] task {task.name!r}: dropped {dropped['train']} of {len(task.train)} train rows and {dropped['eval']} "
        f"of {len(task.eval)} eval rows longer than the model takes (prompt > {P} tokens, or prompt + answer > "
        f"{context})")
    if not kept["train"] or not kept["eval"]:
        raise ValueError(f"task {task.name!r}: no {'train' if not kept['train'] else 'eval'} row fits the model "
                         f"(prompt <= {P} tokens, prompt + answer <= {context})")
    return Task(task.spec, task.train.select(kept["train"]), task.eval.select(kept["eval"]),
                task.prompt_format)
