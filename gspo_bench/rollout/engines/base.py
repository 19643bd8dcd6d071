"""What a rollout engine is (``RolloutEngine``, ``Capabilities``), the registry of them, and ``auto``.

An engine samples completions of already-repeated prompts, given as token ids
(token in, token out: a history is never encoded again), from a policy and
returns them in the rollout layout (``rollout.engine.Generation``), drawing
its randomness from the ``rollout.draws.Draws`` each call is handed, never
from torch's global generator. It may hold state of its own (vLLM: an engine
fed the policy's weights), so a run builds one object (``build_engine``) and
keeps it: ``sync_weights(state, version)`` hands it the weights the next
samples use (a no-op for an engine that samples the module itself), ``sample``
every rollout and evaluation, ``close`` at the end.

An engine class registers under its name with ``@register_engine`` and
declares what it can do (``Capabilities``); ``supports`` says why it cannot
sample a given model, ``missing_reason`` why it cannot run in this
environment. ``resolve_engine`` turns ``auto`` into a name by reading those,
in the registry's ``auto_order``, instead of a chain of cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, ClassVar, Protocol, runtime_checkable

from gspo_bench.config import ConfigError, RolloutConfig, RunConfig
from gspo_bench.rollout.engine import Generation


@dataclass(frozen=True)
class Capabilities:
    """What an engine declares about itself (``list``, ``bench --engines`` and the run's checks read these)."""

    free_logp: bool
    """Gives the sampler's log-probs at no extra cost (a run keeps them whenever it samples with it)."""
    records_routes: bool
    """Can record the experts its MoE router chose (Rollout Routing Replay, ``moe/routing_mismatch``), where
    its ``routes_reason`` allows."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    """Where it samples."""
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    """``rollout.dtype`` values it samples in."""
    needs_model_dir: bool = False
    """Builds its own copy of the model from a folder in Hugging Face format: a caller that does not hold the
    engine for a whole run (``generate``) cannot use it, and ``auto`` picks it only for one that does."""
    one_process: bool = False
    """Runs in one training process only (not with ``--devices``/``--num-nodes`` > 1)."""
    auto_order: int | None = None
    """Where ``auto`` tries it (lowest first); None: only when named."""
    fallback: str | None = None
    """The engine a run samples with instead when this one does not support the model (None: an error)."""
    whole_parameters: bool = False
    """Samples the live model by reading its whole parameters, so not where FSDP shards them (``sharded_engine``)."""
    continues: bool = False
    """Can load new weights between two decode steps and continue the responses under way under them
    (``rollout.partial``): its ``sample`` takes ``swap`` and ``version``."""


@dataclass(frozen=True)
class EngineSetup:
    """What building an engine may read: the run's rollout settings and what only some engines need."""

    settings: RolloutConfig = field(default_factory=RolloutConfig)
    """The run's rollout section (``moe_kernel``, ``dtype``, ``max_new_tokens``, ``engine_options``)."""
    seed: int = 0
    """The run's seed (an engine with its own generator seeds it from this)."""
    model_dir: str | None = None
    """The policy's starting weights in Hugging Face format (an engine that ``needs_model_dir``); None: it
    saves a copy of the model it first samples."""
    record_routes: bool = False
    """The run records the sampler's MoE experts."""
    prompts: Callable[[], list[str]] = list
    """Every prompt the run may sample (an engine that sizes its context by the longest)."""
    max_prompt_tokens: int | None = None
    """The task's cap on a prompt's tokens, when it has one."""


@runtime_checkable
class RolloutEngine(Protocol):
    """The seam every rollout engine fills (see the module docstring)."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def sample(self, model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
               greedy: bool = False, return_logp: bool = True, record_routes: bool = False,
               draws=None) -> Generation:
        """Completions of ``prompts`` (each prompt's token ids, repeats side by side; text from a one-off caller,
        which ``engine.encode_prompts`` encodes) from ``model``'s current weights, with
        the random draws of ``draws`` (``rollout.draws``; None: torch's global generator, for a one-off call
        outside a run)."""
        ...

    def sync_weights(self, state: dict, version: int) -> float:
        """The weights the next samples use (a state dict), after ``version`` RL steps; seconds spent."""
        ...

    def take_sync_time(self) -> float | None:
        """Seconds spent in ``sync_weights`` since the last call (``time/weight_sync``); None for an engine
        that never copies weights."""
        ...

    def close(self) -> None:
        """Free what the engine holds; a later ``sample`` builds it again."""
        ...


class InProcessEngine:
    """The defaults of an engine that samples the policy module itself: nothing to sync, nothing to close."""

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities]

    def __init__(self, setup: EngineSetup):
        self.setup = setup

    @classmethod
    def supports(cls, model) -> str | None:
        """Why this engine cannot sample ``model`` (a line for the user), or None when it can."""
        return None

    @classmethod
    def missing_reason(cls) -> str | None:
        """Why this engine cannot run in this environment (a line for the user), or None when it can."""
        return None

    @classmethod
    def routes_reason(cls) -> str | None:
        """Why this engine cannot record MoE routes here, or None when it can."""
        return None if cls.capabilities.records_routes else f"engine {cls.name} does not record MoE routes"

    @classmethod
    def prefers(cls, model, device: str | None = None) -> bool:
        """Whether ``auto`` should pick this engine for ``model`` when it supports it, ``model`` sampling on
        ``device`` (``cpu``, ``cuda``; None: where its weights are now)."""
        return True

    version: int = 0  # the version of the weights it was last handed

    def sync_weights(self, state: dict, version: int) -> float:
        # the module it samples holds these weights already (the producer loaded them): nothing to copy
        self.version = version
        return 0.0

    def take_sync_time(self) -> float | None:
        return None

    def close(self) -> None:
        pass


ENGINES: dict[str, type] = {}
"""Engine name -> its class (``register_engine``)."""


def register_engine(name: str):
    """Decorator: add the engine class below to ``ENGINES`` under ``name``."""

    def deco(cls: type) -> type:
        if name in ENGINES:
            raise ValueError(f"engine {name!r} is registered already")
        cls.name = name
        ENGINES[name] = cls
        return cls

    return deco


def unregister_engine(name: str) -> None:
    """Take ``name`` out of the registry (a test's toy engine)."""
    ENGINES.pop(name, None)


def engine_names() -> list[str]:
    """Every registered engine, in registration order (``auto`` is not one: it resolves to one of them)."""
    return list(ENGINES)


def engine_class(name: str) -> type:
    """The class registered under ``name``; ValueError listing the allowed names otherwise."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} (allowed: {', '.join(['auto', *ENGINES])})")
    return ENGINES[name]


def auto_ranked() -> list[str]:
    """The engines ``auto`` may pick, lowest ``auto_order`` first."""
    return [n for _, n in sorted((c.capabilities.auto_order, n) for n, c in ENGINES.items()
                                 if c.capabilities.auto_order is not None)]


def resolve_engine(engine: str, model, held: bool = False, device: str | None = None) -> str:
    """The engine that samples ``model`` for ``rollout.engine = engine``.

    ``auto``: the first engine in ``auto_order`` that supports the model and ``prefers`` it on ``device``
    (where the model will sample: ``cpu`` or ``cuda``; None: where its weights are now), skipping those that
    need a model folder unless the caller ``held`` its engine for the run (the runner builds one).
    A named engine that does not support the model resolves to its ``fallback`` where it declares one.
    """
    if engine == "auto":
        for name in auto_ranked():
            cls = ENGINES[name]
            usable = held or not cls.capabilities.needs_model_dir
            if usable and cls.supports(model) is None and cls.prefers(model, device):
                return name
        raise ValueError("no registered engine supports this model")
    cls = engine_class(engine)
    if cls.capabilities.fallback is not None and cls.supports(model) is not None:
        return resolve_engine(cls.capabilities.fallback, model, held, device)
    return engine


def sharded_engine(engine: str) -> str:
    """The engine that samples for ``rollout.engine = engine`` when FSDP shards the policy over the processes:
    ``engine`` itself unless it reads whole parameters (``Capabilities.whole_parameters``) or is ``auto`` (which
    may pick one that does); else the first in ``auto`` order that samples the live model through its own
    forward (neither reads whole parameters nor builds its own copy)."""
    if engine != "auto" and not engine_class(engine).capabilities.whole_parameters:
        return engine
    for name in auto_ranked():
        c = ENGINES[name].capabilities
        if not (c.whole_parameters or c.needs_model_dir):
            return name
    raise ValueError("no registered engine samples a model whose parameters FSDP shards")


def route_recorders() -> list[str]:
    """The engines that can record the experts their MoE router chose (``Capabilities.records_routes``), in
    registration order; each may still refuse where it runs (its ``routes_reason``)."""
    return [n for n, c in ENGINES.items() if c.capabilities.records_routes]


def check_engine(cfg: RunConfig) -> None:
    """``rollout.engine`` names a registered engine (``ENGINES``) that runs in this environment; with
    Rollout Routing Replay (r3), one that records the experts it routed each token to here; and, for an engine
    that runs in one process only (vLLM: each rank would hold an engine, and its shutdown ends the process group
    the ranks share), one process."""
    check_engine_options(cfg.rollout)
    name = cfg.rollout.engine
    if name == "auto":
        return
    try:
        cls = engine_class(name)
    except ValueError as e:
        raise ConfigError(f"rollout.engine: {e}") from None
    reason = cls.missing_reason()
    if reason:
        raise ConfigError(reason)
    reason = cls.routes_reason() if cfg.moe.routing_replay == "r3" else None
    if reason:
        recording = [n for n in engine_names() if ENGINES[n].capabilities.records_routes and n != name]
        raise ConfigError(f"moe.routing_replay=r3 with --engine {name} needs the experts the engine routed each "
                          f"token to ({reason}): use moe.routing_replay=r2 (the trainer's own choices), or r3 with "
                          f"--engine {' or '.join(recording)}")
    partial_check(name, cfg.rollout.partial)
    if cls.capabilities.one_process and cfg.train.devices * cfg.train.num_nodes > 1:
        others = [n for n in engine_names() if not ENGINES[n].capabilities.one_process]
        raise ConfigError(f"--engine {name} runs in one process for now: use --engine {' or '.join(others)} with "
                          "--devices/--num-nodes")


def engine_options(name: str, settings: RolloutConfig):
    """Engine ``name``'s settings: its class's ``Options`` dataclass built from ``rollout.engine_options[name]``
    (its defaults where that is absent); None for an engine that declares none. A key it does not declare or a
    value its ``Options`` refuses is a ConfigError naming the key."""
    given = settings.engine_options.get(name, {})
    options = getattr(engine_class(name), "Options", None)
    if options is None:
        if given:
            raise ConfigError(f"rollout.engine_options.{name}: engine {name} takes no options")
        return None
    known = [f.name for f in fields(options)]
    unknown = [k for k in given if k not in known]
    if unknown:
        raise ConfigError(f"rollout.engine_options.{name}: unknown option {unknown[0]!r} (engine {name} takes "
                          f"{', '.join(known)})")
    return options(**given)


def check_engine_options(settings: RolloutConfig) -> None:
    """Every engine named in ``rollout.engine_options`` is registered and takes the options given it."""
    for name in settings.engine_options:
        if name not in ENGINES:
            raise ConfigError(f"rollout.engine_options: no engine {name!r} (engines: {', '.join(engine_names())})")
        engine_options(name, settings)


def partial_check(name: str, partial: bool) -> None:
    """``rollout.partial`` with an engine (resolved, or named) that cannot continue a response under new weights
    is a ConfigError naming the ones that can."""
    if partial and not engine_class(name).capabilities.continues:
        able = [n for n in engine_names() if ENGINES[n].capabilities.continues]
        raise ConfigError(f"rollout.partial=true: engine {name} cannot continue a response under new weights; use "
                          f"--engine {' or '.join(able)}, or rollout.partial=false")


def build_engine(name: str, setup: EngineSetup | None = None):
    """An engine object of the registered class ``name`` (already resolved: not ``auto``)."""
    return engine_class(name)(EngineSetup() if setup is None else setup)


def generate(engine: str, model, tokenizer, prompts: list[str], *, moe_kernel: str = "auto",
             **kwargs) -> Generation:
    """One sampling call with ``engine`` (resolved for ``model``), for a caller that holds no engine (the warm
    start, the benchmarks). An engine that needs a model folder (vLLM) is built once and held by its caller
    (the rollout datamodule). ``moe_kernel``: the fast engine's (``rollout.moe_kernel``)."""
    name = resolve_engine(engine, model)
    if engine_class(name).capabilities.needs_model_dir:
        raise ValueError(f"engine {name!r} builds its own copy of the model and samples through an engine object "
                         "its caller holds (build_engine; the rollout datamodule holds one)")
    return build_engine(name, EngineSetup(settings=RolloutConfig(moe_kernel=moe_kernel))).sample(
        model, tokenizer, prompts, **kwargs)
