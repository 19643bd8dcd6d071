"""``calc``: multi-step arithmetic with a calculator tool.

A problem is an expression of three 2-digit numbers and two of ``+ - *`` (``37*58+21=``), whose answer the
built-in tiny models cannot compute in their heads (a 2-digit product). The model may call the calculator,
``calc(expression)``, as often as ``env.max_turns`` allows: its turn ends with the call, and the environment
appends the result (or an error for an expression it cannot evaluate). A turn that makes no call is the
final answer, scored by the task's verifier (exact match). A trajectory that spends its last turn on a call
ends with ``max_turns`` and reward 0.

The scripted solver (``solver``) works the expression one operation at a time, products first, as a person
with a calculator would: ``[37*58]=2146`` and a newline, ``[2146+21]=2167`` and a newline, then ``2167``. Its
transcripts are the data's ``target`` and what the warm start learns the tool from.
"""

from __future__ import annotations

import random
import re
from typing import Callable

from gspo_bench.tasks.environments.base import Step, register_environment
from gspo_bench.tasks.environments.tools import CompactTools, Tool, ToolEnvironment, ToolFormat
from gspo_bench.tasks.generators import check_sizes, distinct_rows, register_generator, split_rows
from gspo_bench.tasks.verifiers import evaluate, parse_expression

TOOL = Tool("calc", "expression", "Evaluate an arithmetic expression of integers with + - * / and parentheses.")
MAX_RESULT_CHARS = 24  # a result longer than this is an error (a call cannot flood the context)


def calculate(expression: str) -> str:
    """The calculator: the exact value of ``expression`` (integers, + - * /, parentheses; never ``eval``), as an
    integer or a reduced fraction; ValueError when it is not such an expression or divides by zero."""
    tree, _ = parse_expression(expression.replace(" ", ""))
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    text = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    if len(text) > MAX_RESULT_CHARS:
        raise ValueError("result too long")
    return text


def steps(expression: str) -> list[tuple[str, str]]:
    """The solver's calls on ``expression`` (numbers and binary + - *, no parentheses): one operation at a time,
    the leftmost product first, else the leftmost sum or difference; each ``(call, result)``."""
    tokens = expression.replace("*", " * ").replace("+", " + ").replace("-", " - ").split()
    out = []
    while len(tokens) > 1:
        ops = [i for i in range(1, len(tokens), 2)]
        i = next((j for j in ops if tokens[j] == "*"), ops[0])
        call = f"{tokens[i - 1]}{tokens[i]}{tokens[i + 1]}"
        result = calculate(call)
        out.append((call, result))
        tokens[i - 1:i + 2] = [result]
    return out


def transcript(expression: str, tools: ToolFormat) -> list[tuple[str, str]]:
    """The solver's episode on ``expression``, as ``(who, text)`` segments: the model's calls, the environment's
    results, then the model's answer."""
    out = []
    for call, result in steps(expression):
        out += [("model", tools.call(TOOL, call)), ("environment", tools.result(result))]
    return out + [("model", calculate(expression))]


@register_generator("calc")
def generate_calc(seed: int, n_train: int = 20000, n_eval: int = 512, min_value: int = 10,
                  max_value: int = 99, ops: str = "+-*", operands: int = 3):
    """Expressions of ``operands`` numbers in [min_value, max_value] joined by ``ops``, each with at least one
    product when ``*`` is allowed (else a model could add in its head); train and eval expressions are
    disjoint; none whose solver would hand the calculator a negative number. ``target``: the solver's
    transcript in the compact tool format."""
    if not 0 <= min_value <= max_value or operands < 2 or not ops or set(ops) - set("+-*"):
        raise ValueError(f"calc needs 0 <= min_value <= max_value, operands >= 2 and ops from '+-*', got "
                         f"{min_value}, {max_value}, {operands}, {ops!r}")
    check_sizes("calc", n_train, n_eval)
    rng = random.Random(seed)

    def draw():
        while True:
            nums = [rng.randint(min_value, max_value) for _ in range(operands)]
            chosen = [rng.choice(ops) for _ in range(operands - 1)]
            if "*" in ops and "*" not in chosen:
                chosen[rng.randrange(len(chosen))] = "*"
            expr = str(nums[0]) + "".join(f"{o}{n}" for o, n in zip(chosen, nums[1:]))
            try:  # a step that would hand the calculator a negative number (it has no unary minus): draw again
                target = "".join(text for _, text in transcript(expr, CompactTools()))
            except ValueError:
                continue
            return expr, {"prompt": f"{expr}=", "answer": calculate(expr), "target": target}

    return split_rows(distinct_rows(draw, n_eval + n_train), n_eval)


@register_environment("calc")
class Calc(ToolEnvironment):
    """An expression to evaluate, with a calculator; the final answer's correctness is the reward."""

    tool = TOOL
    default_turns = 4

    def step(self, action: str | list[int]) -> Step:
        """One model turn: a call (answered with its result, or an error) or the final answer (scored)."""
        call = self.take_turn(action)
        if call is None:  # no call: the answer
            answer, self.row = self.row["answer"], None
            return Step(None, self.task.verify(action, answer), True, {"finish_reason": "stop"})
        if self.turns >= self.max_turns:  # a call in the last turn: no answer is left to give
            self.row = None
            return Step(None, 0.0, True, {"finish_reason": "max_turns", "tool_call": True,
                                          "tool_error": call.error is not None})
        if call.error is not None:
            return Step(self.tools.error(call.error), 0.0, False, {"tool_call": True, "tool_error": True})
        try:
            result = self.tools.result(calculate(call.arg))
        except ValueError as e:
            return Step(self.tools.error(str(e)), 0.0, False, {"tool_call": True, "tool_error": True})
        return Step(result, 0.0, False, {"tool_call": True, "tool_error": False})

    def solver(self, row: dict) -> Callable[[str | None], str]:
        """The scripted solver's policy on ``row``: the next turn's text, given the last observation."""
        turns = iter([text for who, text in transcript(problem(row["prompt"]), self.tools) if who == "model"])
        return lambda observation: next(turns)


def problem(prompt: str) -> str:
    """The expression a prompt asks for (the last ``...=`` in it: a raw prompt, or one inside a chat template)."""
    found = re.findall(r"(\d+(?:[-+*]\d+)+)=", prompt)
    if not found:
        raise ValueError(f"calc: no expression in the prompt {prompt[-40:]!r}")
    return found[-1]
