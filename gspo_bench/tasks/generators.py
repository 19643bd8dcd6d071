"""Data generators and loaders, by ``kind``: ``seed, **params -> (train, eval)`` datasets.

Every data set has the columns ``prompt``, ``answer`` (what the verifier
compares against) and ``target`` (the supervised completion the warm start
trains on; its verifier score must be 1.0). Generated tasks draw from one
seeded ``random.Random`` stream, so they are deterministic in the seed, and
put the first ``n_eval`` distinct problems in eval, so train and eval are
disjoint. Task text stays inside the character tokenizer's ``CHARSET``.
"""

from __future__ import annotations

import logging
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Hashable

import datasets

from gspo_bench.tasks.verifiers import format_countdown_answer

Generator = Callable[..., tuple[datasets.Dataset, datasets.Dataset]]
GENERATORS: dict[str, Generator] = {}


def register_generator(*names: str):
    """Register ``fn`` under each of ``names`` (the first is its name, the rest aliases)."""

    def deco(fn: Generator) -> Generator:
        for name in names:
            GENERATORS[name] = fn
        return fn

    return deco


def check_sizes(kind: str, n_train: int, n_eval: int) -> None:
    if n_eval < 1 or n_train < 0:
        raise ValueError(f"{kind} needs n_eval >= 1 and n_train >= 0, got n_eval={n_eval}, n_train={n_train}")


def split_rows(rows: list[dict], n_eval: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, eval) data sets of ``rows`` (``prompt``, ``answer``, ``target``): the first ``n_eval`` are the eval
    split, the rest the train split."""

    def table(rs: list[dict]) -> datasets.Dataset:
        return datasets.Dataset.from_dict({k: [r[k] for r in rs] for k in ("prompt", "answer", "target")})

    return table(rows[n_eval:]), table(rows[:n_eval])


def distinct_rows(draw: Callable[[], tuple[Hashable, dict]], n_total: int,
                  max_misses: int | None = None) -> list[dict]:
    """``n_total`` rows from ``draw()``, skipping any whose key was drawn before.

    ``max_misses`` consecutive repeats mean the problem space is (nearly) used
    up and raise; None trusts the caller to have sized ``n_total`` to it.
    """
    seen: set = set()
    rows: list[dict] = []
    misses = 0
    while len(rows) < n_total:
        key, row = draw()
        if key in seen:
            misses += 1
            if max_misses is not None and misses > max_misses:
                raise ValueError(f"only {len(rows)} distinct problems found of the {n_total} asked for; "
                                 "lower n_train/n_eval or widen the ranges")
            continue
        misses = 0
        seen.add(key)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- arith


def column_addition(a: int, b: int) -> str:
    """Column addition worked from the right, one line per column, then ``=`` and the sum.

    Each line is ``x+y+c=s cK``: the column's digits (0 past the end of the
    shorter number), the carry in ``c``, their sum ``s`` and the carry out
    ``K = s // 10``; the answer's digits are the ``s % 10`` read bottom to
    top, after a final carry. ``237+485`` gives::

        7+5+0=12 c1
        3+8+1=12 c1
        2+4+1=7 c0
        =722
    """
    da, db = str(a)[::-1], str(b)[::-1]
    lines, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        lines.append(f"{x}+{y}+{carry}={s} c{s // 10}")
        carry = s // 10
    return "\n".join(lines) + f"\n={a + b}"


@register_generator("arith")
def generate_arith(
    seed: int, min_digits: int = 1, max_digits: int = 2, n_train: int = 20000, n_eval: int = 256,
    scratchpad: bool = False,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Multi-digit addition ``a+b=`` -> ``a+b``; train and eval pairs are disjoint.

    Pairs are drawn without replacement from one seeded stream, the first
    ``n_eval`` go to eval, so no (a, b) appears in both splits. When the space
    of pairs is small the train split is all of the remainder. With
    ``scratchpad`` the target is the column-by-column working of
    ``column_addition()`` ending in ``=<sum>`` (score it with the ``scratchpad``
    verifier); the answer stays the plain sum.
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"arith needs 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    check_sizes("arith", n_train, n_eval)
    lo = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    hi = 10**max_digits - 1
    space = (hi - lo + 1) ** 2
    if n_eval >= space:
        raise ValueError(f"arith: n_eval={n_eval} leaves no training pairs (only {space} pairs exist)")
    rng = random.Random(seed)

    def draw():
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        target = column_addition(a, b) if scratchpad else str(a + b)
        return (a, b), {"prompt": f"{a}+{b}=", "answer": str(a + b), "target": target}

    return split_rows(distinct_rows(draw, min(space, n_eval + n_train)), n_eval)


# ----------------------------------------------------------------------------- countdown

_OPS = "+-*/"
MAX_TRIES = 10_000  # draws before a countdown configuration is declared (nearly) impossible
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def render(tree) -> str:
    """An expression tree ``(op, left, right)`` / int as text with only the parentheses it needs.

    A child is bracketed when it binds more loosely than its parent, and a
    right child also when it binds equally under ``-`` or ``/``
    (``a-(b-c)``, ``a/(b*c)``); ``a+(b-c)`` prints as ``a+b-c``, which has
    the same exact value.
    """
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree

    def side(child, is_right: bool) -> str:
        text = render(child)
        if isinstance(child, int):
            return text
        looser = _PREC[child[0]] < _PREC[op]
        same_non_assoc = is_right and _PREC[child[0]] == _PREC[op] and op in "-/"
        return f"({text})" if looser or same_non_assoc else text

    return side(left, False) + op + side(right, True)


def _countdown_problem(rng: random.Random, k: int, max_number: int, ops: str) -> tuple[list[int], object, int] | None:
    """``k`` numbers and a random expression using each once, built the way the game is played.

    Two of the values in hand are combined with an operator until one is
    left. Intermediate values stay positive integers (the game's rule, so the
    target expressions read naturally): ``-`` takes the larger minus the
    smaller, ``/`` only divides exactly, and a step that cannot keep the rule
    draws again; None when no step keeps it (e.g. ``ops="/"`` with 3 and 2).
    """
    numbers = [rng.randint(1, max_number) for _ in range(k)]
    hand: list[tuple[int, object]] = [(n, n) for n in numbers]  # (value, expression tree)
    for _ in range(100 * k):
        if len(hand) == 1:
            break
        i, j = rng.sample(range(len(hand)), 2)
        (a, ta), (b, tb) = hand[i], hand[j]
        op = rng.choice(ops)
        if op in "-/" and a < b:
            (a, ta), (b, tb) = (b, tb), (a, ta)
        if op == "/":
            if a % b:
                continue
            value = a // b
        else:
            value = a + b if op == "+" else a - b if op == "-" else a * b
        if value <= 0:
            continue
        hand = [h for n, h in enumerate(hand) if n not in (i, j)] + [(value, (op, ta, tb))]
    if len(hand) > 1:
        return None
    return numbers, hand[0][1], hand[0][0]


@register_generator("countdown")
def generate_countdown(
    seed: int, min_numbers: int = 3, max_numbers: int = 4, max_number: int = 25, min_target: int = 10,
    max_target: int = 100, ops: str = "+-*/", n_train: int = 20000, n_eval: int = 256,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Countdown: reach the target with the given numbers and ``+ - * /``.

    Prompt ``"12 5 3 -> 41:"``, target a solution such as ``"12*3+5"`` (the
    expression the problem was generated from, every number used once),
    answer ``"12 5 3|41"`` for the ``countdown`` verifier. Targets lie in
    ``[min_target, max_target]`` and are never one of the numbers (no
    zero-step problems). Problems are distinct as a (multiset of numbers,
    target), so no reordering of an eval problem is in train.
    """
    if not 2 <= min_numbers <= max_numbers:
        raise ValueError(f"countdown needs 2 <= min_numbers <= max_numbers, got {min_numbers}, {max_numbers}")
    if max_number < 1 or not 1 <= min_target <= max_target:
        raise ValueError(f"countdown needs max_number >= 1 and 1 <= min_target <= max_target, got "
                         f"max_number={max_number}, min_target={min_target}, max_target={max_target}")
    if not ops or set(ops) - set(_OPS):
        raise ValueError(f"countdown ops={ops!r} must be a non-empty subset of '+-*/'")
    check_sizes("countdown", n_train, n_eval)
    rng = random.Random(seed)

    def draw():
        for _ in range(MAX_TRIES):
            problem = _countdown_problem(rng, rng.randint(min_numbers, max_numbers), max_number, ops)
            if problem is None:
                continue
            numbers, tree, target = problem
            if min_target <= target <= max_target and target not in numbers:
                break
        else:
            raise ValueError(f"countdown: no target in [{min_target}, {max_target}] after {MAX_TRIES} tries")
        row = {
            "prompt": f"{' '.join(map(str, numbers))} -> {target}:",
            "answer": format_countdown_answer(numbers, target),
            "target": render(tree),
        }
        return (tuple(sorted(numbers)), target), row

    return split_rows(distinct_rows(draw, n_eval + n_train, max_misses=MAX_TRIES), n_eval)


# ----------------------------------------------------------------------------- local files

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
HEAD_BYTES = 1 << 16


def check_data_file(p: str, format: str | None, fields: tuple[str, ...]) -> tuple[Path, str]:
    """(path, format) of a task data file, checked cheaply before any loading: it exists, is not empty, has a
    known format; a JSON file's head is UTF-8, and a ``.jsonl`` file's first row parses and has ``fields``.
    Any failure is a one-line ValueError naming the file."""
    import json

    file = Path(p).expanduser()
    fmt = format or _FORMATS.get(file.suffix.lower())
    if fmt not in ("json", "parquet"):
        raise ValueError(f"{p}: format {fmt!r} is not json or parquet; set format, or use a "
                         f"{'/'.join(_FORMATS)} suffix")
    if not file.is_file():
        raise ValueError(f"{p}: no such file")
    if file.stat().st_size == 0:
        raise ValueError(f"{p}: empty file")
    if fmt == "json":
        with file.open("rb") as f:
            head = f.read(HEAD_BYTES)
        try:  # the head tells a UTF-8 text file from another encoding or a binary
            text = head.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < HEAD_BYTES - 4:  # not merely a multi-byte character cut at the end of the head
                raise ValueError(f"{p}: not UTF-8 text (byte {e.start})") from None
            text = head[:e.start].decode("utf-8")
        first = next((line for line in text.splitlines() if line.strip()), "")
        if file.suffix.lower() == ".jsonl":  # one JSON object per line: the first row must parse
            try:
                row = json.loads(first)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: the first row is not JSON ({e.msg} at column {e.colno})") from None
            missing = sorted(set(fields) - set(row))
            if missing:
                raise ValueError(f"{p}: missing field(s) {missing}; the first row has {sorted(row)}")
    return file, fmt


def non_utf8_at(file: Path) -> int | None:
    """The offset of the first byte of ``file`` that is not UTF-8 text, or None; read in chunks."""
    import codecs

    decoder, done = codecs.getincrementaldecoder("utf-8")(), 0
    with file.open("rb") as f:
        while True:
            chunk = f.read(1 << 20)
            held = len(decoder.getstate()[0])  # the bytes of a character cut at the last chunk's end
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                return done - held + e.start
            if not chunk:
                return None
            done += len(chunk)


@contextmanager
def datasets_muted():
    """The ``datasets`` logger silent for the reads inside: a file it cannot parse it logs at ERROR level
    before raising, and the one line we make of that error (``load_error``) would be the second one printed."""
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)


def load_error(where: str, e: Exception, text: Path | None = None) -> ValueError:
    """A data file's (or folder's) loading failure as one line naming it (``where``): a ``text`` file that is
    not UTF-8 by the offset of its first bad byte, anything else by the parser's own first line."""
    if text is not None and (at := non_utf8_at(text)) is not None:
        return ValueError(f"{where}: not UTF-8 text (byte {at})")
    cause = e.__cause__ or e  # datasets wraps the parser's error, which says what is wrong and where
    first = (str(cause).strip().splitlines() or [""])[0]
    return ValueError(f"{where}: cannot load it: {type(cause).__name__}: {first}")


def count_rows(file: Path, fmt: str) -> int | None:
    """The rows of a data file, counted without loading it: a ``.jsonl`` file's non-blank lines (read in
    chunks, so a huge row costs no memory), a Parquet file's footer; None for a JSON file in another layout."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(file).metadata.num_rows
        except Exception:  # not Parquet after all: loading it says what is wrong
            return None
    if file.suffix.lower() != ".jsonl":
        return None
    rows = 0
    with file.open("rb") as f:
        pending = False  # the current (unfinished) line holds a non-blank byte
        while chunk := f.read(1 << 20):
            parts = chunk.split(b"\n")
            for part in parts[:-1]:
                rows += pending or bool(part.strip())
                pending = False
            pending = pending or bool(parts[-1].strip())
        rows += pending
    return rows


def hold_out(train: datasets.Dataset, path: str, n_eval: int, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A seeded split of ``train`` into train and eval, ``n_eval`` rows held out (half of them at most)."""
    check_split_rows(path, len(train))
    split = train.train_test_split(test_size=min(n_eval, len(train) // 2), seed=seed)
    return split["train"], split["test"]


def check_split_rows(path: str, rows: int) -> None:
    """A file split into train and eval needs a row on each side."""
    if rows < 2:
        raise ValueError(f"{path} has {rows} row(s), too few to hold out an eval split (at least 2 are "
                         "needed: half of them at most go to eval); add rows or name an eval_path")


@register_generator("file", "jsonl")
def load_file(
    seed: int, path: str, eval_path: str | None = None, n_eval: int = 256,
    prompt_field: str = "prompt", answer_field: str = "answer", target_field: str | None = None,
    format: str | None = None,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A local JSONL/JSON or Parquet file with prompt and answer fields, loaded through ``datasets``.

    ``format`` is ``json`` or ``parquet``; by default it follows the file's
    suffix. Without ``eval_path`` a seeded split holds out ``n_eval`` rows (at
    most half). The target defaults to the answer field, which for GSM8K-style
    data (``"...reasoning... #### 72"``) is the worked solution the ``gsm8k``
    verifier reads. ``jsonl`` is the old name of this kind.
    """
    def load(p: str) -> datasets.Dataset:
        file, fmt = check_data_file(p, format, (prompt_field, answer_field, target_field or answer_field))
        text = file if fmt == "json" else None
        try:
            with datasets_muted():
                ds = datasets.load_dataset(fmt, data_files=str(file), split="train")
        except Exception as e:  # a bad row past the first: name the file
            raise load_error(p, e, text) from None
        tgt = target_field or answer_field
        missing = {prompt_field, answer_field, tgt} - set(ds.column_names)
        if missing:
            raise ValueError(f"{p}: missing field(s) {sorted(missing)}; columns are {ds.column_names}")
        try:
            return ds.map(
                lambda r: {"prompt": str(r[prompt_field]), "answer": str(r[answer_field]), "target": str(r[tgt])},
                remove_columns=ds.column_names,
            )
        except UnicodeDecodeError as e:  # bytes that are not UTF-8 past the head, kept by pyarrow, read back here
            raise load_error(p, e, text) from None

    check_sizes("file", 0, n_eval)
    train = load(path)
    if eval_path:
        return train, load(eval_path)
    return hold_out(train, path, n_eval, seed)


load_jsonl = load_file  # the old name
