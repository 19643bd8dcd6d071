"""Verifiers: pure ``verify(completion, answer, **params) -> float`` functions, by name.

A verifier reads only its arguments and returns a reward in [0, 1]; it never
raises on anything a model can write (malformed, hostile or huge
completions score 0.0). It may raise on a malformed *answer*, which is a
data bug. Keyword-only parameters after ``answer`` are set per task by the
spec's ``verifier_params`` (e.g. countdown's ``partial_credit``).

Outcome rewards only: ``scratchpad`` and ``gsm8k`` score the final answer and
ignore the working before it, like the GSM8K / DeepSeek-R1 style rule rewards.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from fractions import Fraction
from typing import Callable

Verifier = Callable[..., float]
VERIFIERS: dict[str, Verifier] = {}
# verifier name -> the importable module it needs (optional extras); checked when a spec names it
VERIFIER_REQUIRES: dict[str, tuple[str, str]] = {}


def register_verifier(name: str, requires: str | None = None, extra: str | None = None):
    """Register ``fn`` under ``name``; ``requires`` names a module from the optional extra ``extra``."""

    def deco(fn: Verifier) -> Verifier:
        VERIFIERS[name] = fn
        if requires:
            VERIFIER_REQUIRES[name] = (requires, extra or requires)
        return fn

    return deco


def missing_extra_message(module: str, extra: str) -> str:
    return f"this verifier needs the {module!r} package: pip install 'gspo-bench[{extra}]'"


def _last_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


@register_verifier("exact")
def verify_exact(completion: str, answer: str) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, is exactly the answer."""
    return float(completion.strip() == answer.strip())


@register_verifier("last_line")
def verify_last_line(completion: str, answer: str) -> float:
    """1.0 when the last non-empty line of the completion is exactly the answer (scratchpads)."""
    last = _last_line(completion)
    return float(last is not None and last == answer.strip())


@register_verifier("scratchpad")
def verify_scratchpad(completion: str, answer: str) -> float:
    """1.0 when the last non-empty line is ``=`` followed by the answer (``...\\n=632``).

    The working lines above it are not checked: the reward is the outcome.
    """
    last = _last_line(completion)
    if last is None or not last.startswith("="):
        return 0.0
    got = last[1:].strip()
    return float(bool(got) and got == answer.strip())


# ----------------------------------------------------------------------------- countdown

# A countdown answer is "<numbers separated by spaces>|<target>", e.g. "12 5 3|41".
COUNTDOWN_SEP = "|"
MAX_EXPR_CHARS = 256  # longer completions score 0 without being parsed
MAX_DEPTH = 32  # parenthesis nesting; bounds the parser's recursion
_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")  # [0-9]: \d would take any Unicode digit


def format_countdown_answer(numbers: list[int], target: int) -> str:
    return " ".join(map(str, numbers)) + COUNTDOWN_SEP + str(target)


def parse_countdown_answer(answer: str) -> tuple[list[int], int]:
    """``"12 5 3|41"`` -> ``([12, 5, 3], 41)``; a malformed answer is a data bug and raises."""
    nums, sep, target = answer.strip().partition(COUNTDOWN_SEP)
    if not sep:
        raise ValueError(f"countdown answer {answer!r} is not 'numbers{COUNTDOWN_SEP}target'")
    return [int(n) for n in nums.split()], int(target)


class _Reject(Exception):
    """The completion is not an expression of the countdown grammar."""


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise _Reject(text[pos:pos + 10])
        num, op = m.groups()
        # integers exactly as given: no leading zeros, so "05" is not the 5 on offer
        if num is not None and num != str(int(num[:7])):
            raise _Reject(num)
        tokens.append(num if num is not None else op)
        pos = m.end()
    return tokens


def parse_expression(text: str) -> tuple[object, list[int]]:
    """Parse ``text`` into a tree of ``(op, left, right)`` / int leaves, and the integers it uses.

    Recursive descent over a whitelist, never ``eval``: integers, binary
    ``+ - * /`` and parentheses; no unary minus, powers, names, calls or
    floats. Grammar (usual precedence, left-associative)::

        expr   := term (("+" | "-") term)*
        term   := factor (("*" | "/") factor)*
        factor := INT | "(" expr ")"

    Raises ``ValueError`` when the text is not such an expression.
    """
    if len(text) > MAX_EXPR_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tokens = _tokenize(text)
    except _Reject as e:
        raise ValueError(f"unexpected {str(e)!r}") from None
    pos = 0
    used: list[int] = []

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("unexpected end of expression")
        pos += 1
        return tokens[pos - 1]

    def binary(sub, ops: str, depth: int):
        node = sub(depth)
        while peek() is not None and peek() in ops:
            op = take()
            node = (op, node, sub(depth))
        return node

    def expr(depth: int):
        return binary(term, "+-", depth)

    def term(depth: int):
        return binary(factor, "*/", depth)

    def factor(depth: int):
        tok = take()
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise ValueError(f"parentheses nested deeper than {MAX_DEPTH}")
            node = expr(depth + 1)
            if take() != ")":
                raise ValueError("missing ')'")
            return node
        if tok[0] in "0123456789":
            used.append(int(tok))
            return int(tok)
        raise ValueError(f"unexpected {tok!r}")

    tree = expr(0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return tree, used


def evaluate(tree) -> Fraction:
    """Exact value of a parsed tree; ``ZeroDivisionError`` on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


@register_verifier("countdown")
def verify_countdown(completion: str, answer: str, *, partial_credit: float = 0.0) -> float:
    """1.0 when the completion is an expression over the given numbers whose value is the target.

    ``answer`` is ``"12 5 3|41"``. Each number may be used at most as often as
    it is given (not every number must be used). Arithmetic is exact
    (``Fraction``), so ``7/2*2`` is 7. A well-formed expression over allowed
    numbers with the wrong value earns ``partial_credit`` (0 unless the spec
    sets ``verifier_params: {partial_credit: 0.1}``, the format reward of
    TinyZero-style countdown); anything else, division by zero included, 0.
    """
    numbers, target = parse_countdown_answer(answer)
    try:
        tree, used = parse_expression(completion.strip())
    except (ValueError, RecursionError):
        return 0.0
    if Counter(used) - Counter(numbers):  # some number used more often than given (or not given)
        return 0.0
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return 0.0
    return 1.0 if value == target else float(partial_credit)


# ----------------------------------------------------------------------------- GSM8K-style answers

# A number as written in prose: "1,000", "$72", "-3", "0.5"; a minus only when not glued to a word or
# digit ("5-3" holds 5 and 3, not -3).
_NUMBER = re.compile(r"(?:(?<![\w.])-)?\$?[0-9](?:[0-9,]*[0-9])?(?:\.[0-9]+)?")  # ASCII digits, as in countdown


def _normalise(text: str) -> str:
    """Strip commas, ``$``, surrounding space and a trailing period: ``"$1,000."`` -> ``"1000"``."""
    return text.replace(",", "").replace("$", "").strip().rstrip(".").strip()


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_answer(text: str) -> str | None:
    """The final answer of a GSM8K-style text, normalised.

    After the last ``####``: the first number there (or the rest of that line
    when it holds none). Without ``####``: the last number in the text. None
    when there is nothing to take.
    """
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        line = tail.splitlines()[0] if tail else ""
        m = _NUMBER.search(line)
        found = _normalise(m.group() if m else line)
        return found or None
    nums = _NUMBER.findall(text)
    return _normalise(nums[-1]) if nums else None


def _reference(answer: str) -> str:
    # a GSM8K reference ("...reasoning... #### 72") is read like a completion; a bare answer is normalised
    return (extract_final_answer(answer) or "") if "####" in answer else _normalise(answer)


@register_verifier("gsm8k")
def verify_gsm8k(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer equals the reference's, numerically when both are numbers.

    ``"1,000"``, ``"1000"``, ``"$1000."`` and ``"1000.0"`` are all equal;
    non-numeric answers compare as normalised strings.
    """
    got, want = extract_final_answer(completion), _reference(answer)
    if got is None or not want:
        return 0.0
    a, b = _as_number(got), _as_number(want)
    if a is not None and b is not None:
        return float(a == b)
    return float(got == want)


@register_verifier("math_verify", requires="math_verify", extra="math")
def verify_math(completion: str, answer: str) -> float:
    """1.0 when ``math-verify`` finds the completion's answer equivalent to the reference.

    Needs the optional extra: ``pip install 'gspo-bench[math]'``. A GSM8K-style
    reference is cut to what follows its last ``####`` first; a reference with no
    ``$``, ``\\(``, ``\\[`` or ``\\boxed`` is wrapped in ``$...$``. Runs call it
    in the verifier worker (``sandbox.py``), whose time limit (1 s by
    default) holds even where math-verify's own SIGALRM timeout (5 s, main
    thread only) cannot, e.g. inside one huge ``9**9**9**9``.
    """
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ImportError(missing_extra_message("math_verify", "math")) from e
    on_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if on_main else None
    ref = answer.rsplit("####", 1)[1].strip() if "####" in answer else answer
    if not any(mark in ref for mark in ("$", "\\boxed", "\\(", "\\[")):
        # a bare reference (MATH-500's answer column: "\left( 3, \frac{\pi}{2} \right)") is read as math: bare,
        # math-verify would take that tuple for its first number, 3
        ref = f"${ref}$"
    try:
        gold = parse(ref, parsing_timeout=timeout)
        pred = parse(completion, parsing_timeout=timeout)
        return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify raises its own errors (timeouts, sympy) on odd input: no reward
        return 0.0
