"""``guess``: find a hidden number in a range, told "higher" or "lower" after each guess.

The prompt names the range (``guess 1-16:``); each model turn is a guess, a call of the ``guess`` tool
(``[8]`` in the compact format). The environment answers ``higher`` or ``lower``, and ends the episode when the
guess is right. The reward falls with the turns used: a right guess on turn ``t`` of at most ``T``
(``env.max_turns``) earns ``1 - (t - 1) / T``; no right guess in ``T`` turns, or a turn that guesses nothing,
earns 0. Only a first-turn hit earns a full 1, so on this task ``eval/pass1`` (greedy) is the mean reward and
``eval/pass1_sampled`` (reward >= 1) counts first-turn hits.

The scripted solver bisects: it guesses the middle of what is left (rounding down), which finds any number
of 1..16 within 5 turns.
"""

from __future__ import annotations

import random
import re
from typing import Callable

from gspo_bench.tasks.environments.base import Step, register_environment
from gspo_bench.tasks.environments.tools import CompactTools, Tool, ToolEnvironment
from gspo_bench.tasks.generators import check_sizes, register_generator, split_rows

TOOL = Tool("guess", "number", "Guess the hidden number; the answer says whether it is higher or lower.")
HIGHER, LOWER = "higher", "lower"


def bisect(low: int, high: int, secret: int) -> list[tuple[int, str | None]]:
    """The solver's guesses on ``secret`` in [low, high], each with the answer it gets (None: right)."""
    out = []
    while True:
        mid = (low + high) // 2
        if mid == secret:
            return out + [(mid, None)]
        out.append((mid, HIGHER if secret > mid else LOWER))
        low, high = (mid + 1, high) if secret > mid else (low, mid - 1)


def reward(turn: int, max_turns: int) -> float:
    # r = 1 - (t - 1) / T for a right guess on turn t of at most T
    return 1.0 - (turn - 1) / max_turns


@register_generator("guess")
def generate_guess(seed: int, n_train: int = 20000, n_eval: int = 512, low: int = 1, high: int = 16):
    """Episodes ``guess low-high:`` with a secret drawn uniformly from the range (train and eval rows are drawn
    independently: with only ``high - low + 1`` secrets they cannot be disjoint). ``target``: the solver's
    transcript in the compact format; ``answer``: the secret."""
    if not low < high:
        raise ValueError(f"guess needs low < high, got {low}, {high}")
    check_sizes("guess", n_train, n_eval)
    rng = random.Random(seed)
    tools = CompactTools()
    rows = []
    for _ in range(n_eval + n_train):
        secret = rng.randint(low, high)
        target = "".join(tools.call(TOOL, str(g)) + ("" if said is None else tools.result(said))
                         for g, said in bisect(low, high, secret))
        rows.append({"prompt": f"guess {low}-{high}:", "answer": str(secret), "target": target})
    return split_rows(rows, n_eval)


@register_environment("guess")
class Guess(ToolEnvironment):
    """A hidden number (the row's answer) in the prompt's range; "higher" / "lower" after each wrong guess."""

    tool = TOOL
    default_turns = 6

    def step(self, action: str | list[int]) -> Step:
        """One guess: right (done, rewarded by the turns used), wrong (higher / lower), or none (done, 0)."""
        call = self.take_turn(action)
        secret = int(self.row["answer"])
        if call is None:  # the model stopped without guessing
            self.row = None
            return Step(None, 0.0, True, {"finish_reason": "stop"})
        number = None if call.error is not None or not re.fullmatch(r"-?\d{1,9}", call.arg) else int(call.arg)
        if number == secret:
            self.row = None
            return Step(None, reward(self.turns, self.max_turns), True,
                        {"finish_reason": "solved", "tool_call": True, "tool_error": False})
        if self.turns >= self.max_turns:
            self.row = None
            return Step(None, 0.0, True, {"finish_reason": "max_turns", "tool_call": True,
                                          "tool_error": number is None})
        if number is None:
            return Step(self.tools.error(call.error or "not a number"), 0.0, False,
                        {"tool_call": True, "tool_error": True})
        said = HIGHER if secret > number else LOWER
        return Step(self.tools.result(said), 0.0, False, {"tool_call": True, "tool_error": False})

    def solver(self, row: dict) -> Callable[[str | None], str]:
        """The bisecting solver's policy on ``row``: its next guess, given the last answer."""
        low, high = map(int, re.findall(r"guess (-?\d+)-(-?\d+):", row["prompt"])[-1])
        guesses = iter([g for g, _ in bisect(low, high, int(row["answer"]))])
        return lambda observation: self.tools.call(self.tool, str(next(guesses)))
