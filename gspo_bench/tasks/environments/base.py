"""The environment seam: the ``Environment`` protocol, ``Step``, and the registry of environments.

A task is data plus a verifier; an environment is how a rollout meets it. ``reset(row)`` starts an episode
on one data row and returns the first observation, the prompt; ``step(action)`` takes the model's turn and
returns a ``Step``: what the environment appends before the model's next turn (``observation``), the
reward, whether the episode is over, and anything else it wants to record (``info``). An observation is text
or token ids. Token ids are what the rollout records (``rollout/trajectory.py``: an environment's tokens are
kept out of the loss); text is for an environment that thinks in words, and whoever drives the episode
tokenises it once, on its way in, never again.

The built-in environment, ``single_turn``, is today's single-turn rollout: the row's prompt, one
completion, the task's verifier as the reward, done after one step. Rollouts score many episodes at once:
an environment whose episodes are one turn may also offer ``score`` (``BatchEnvironment``), the whole
batch in one call; ``single_turn``'s is ``Task.score``, the verifier in its sandbox under a time limit per
completion, so rewards through the environment are the verifier's, value for value.

``ENVIRONMENTS`` maps names to factories, ``factory(task, **params) -> Environment``; a new environment is
one class with ``@register_environment(name)`` above it, in a file of its own in this package, and
``make_environment`` builds one by name. One
object plays one episode at a time: a caller running several at once makes one per episode.
(TRL's ``environment_factory`` and SkyRL-gym's ``step`` are the models; here an action is one completion,
not a message list, and the conversation's tokens are the caller's.)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Union, runtime_checkable

from gspo_bench.tasks.prompts import TOOL_SCHEMAS
from gspo_bench.tasks.task import Task

Observation = Union[str, list[int]]
"""What an environment shows the model: text, or the token ids it appends."""


@dataclass(frozen=True)
class Step:
    """The outcome of one ``Environment.step``."""

    observation: Observation | None
    """What the environment appends before the model's next turn; None: nothing (a done episode)."""
    reward: float
    """The reward for this step (an episode's return is the sum over its steps)."""
    done: bool
    """True when the episode is over: no further ``step`` until the next ``reset``."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else to keep with the trajectory (an end reason under ``finish_reason``, counters)."""


@runtime_checkable
class Environment(Protocol):
    """An episode over one data row: ``reset`` it, then ``step`` with the model's turns until ``done``."""

    def reset(self, row: dict) -> Observation:
        """Start an episode on ``row`` (its ``prompt`` and ``answer``, at least); returns the first observation."""
        ...

    def step(self, action: str | list[int]) -> Step:
        """Take the model's turn, its text or its token ids."""
        ...


@runtime_checkable
class BatchEnvironment(Environment, Protocol):
    """An environment whose episodes are one turn, which also scores a whole batch of them in one call."""

    def score(self, completions: list[str], answers: list[str], timeout: float) -> tuple[list[float], int]:
        """The reward of each completion against its row's answer, each under ``timeout`` seconds (0 past it),
        and how many ran past it."""
        ...


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}
"""Environment factories by name, ``factory(task, **params)``: filled by ``register_environment``."""


def register_environment(name: str):
    """Decorator: add the class (or factory) below to ``ENVIRONMENTS`` under ``name``; a class with a ``tool``
    has its schema put in ``prompts.TOOL_SCHEMAS``, for the prompts a chat template renders. A name is
    registered once."""

    def add(factory):
        if name in ENVIRONMENTS:
            raise ValueError(f"environment {name!r} is registered already")
        ENVIRONMENTS[name] = factory
        if getattr(factory, "tool", None) is not None:  # a chat template lists it in the prompts
            TOOL_SCHEMAS[name] = [factory.tool.schema()]
        return factory

    return add


def make_environment(name: str, task: Task, **params) -> Environment:
    """The environment ``name`` over ``task``, built with ``params``; an unknown name is a one-line ValueError."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r} (allowed: {', '.join(ENVIRONMENTS)})")
    return ENVIRONMENTS[name](task, **params)


def environment_name(task: Task, name: str | None = None) -> str:
    """The environment a task is played in: ``name`` (``env.name``) when given, else the task spec's own; an
    unknown one is a one-line ValueError."""
    chosen = name or task.spec.environment
    if chosen not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {chosen!r} (allowed: {', '.join(ENVIRONMENTS)})")
    return chosen


def is_multi_turn(name: str) -> bool:
    """Whether environment ``name`` plays episodes turn by turn: every environment but one that scores a whole
    batch of one-turn episodes at once (``BatchEnvironment``: ``single_turn``)."""
    return not hasattr(ENVIRONMENTS[name], "score")


def uses_tool(name: str) -> bool:
    """Whether environment ``name`` has a tool the model calls (its class declares ``tool``): its turns end at a
    call as well as at an eos, and it is built with the run's tool format."""
    return getattr(ENVIRONMENTS[name], "tool", None) is not None


def build_kwargs(name: str, **offered) -> dict:
    """The keywords of ``offered`` (``tools``, ``max_turns``) that environment ``name``'s factory takes."""
    try:
        params = inspect.signature(ENVIRONMENTS[name]).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return offered
    return {k: v for k, v in offered.items() if k in params}


def scripted(env: Environment, row: dict) -> tuple[list[tuple[str, str]], float]:
    """The scripted solver's episode on ``row`` (``env.solver``): its segments as ``(who, text)``, ``who``
    ``model`` or ``environment``, and its return."""
    env.reset(row)
    policy = env.solver(row)
    out, total, last = [], 0.0, None
    while True:
        action = policy(last)
        out.append(("model", action))
        step = env.step(action)
        total += step.reward
        if step.done:
            return out, total
        out.append(("environment", step.observation))
        last = step.observation
