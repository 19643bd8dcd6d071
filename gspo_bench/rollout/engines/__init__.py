"""Rollout engines: the ``RolloutEngine`` seam and its registry (``base.py``), and one file per engine:
``fast.py`` (the package's KV-cache sampler), ``compiled.py`` (the same, decode steps compiled), ``hf.py``
(transformers' ``generate``), ``vllm.py`` (vLLM in this process). A new engine is one more file that
registers with ``@register_engine`` (docs/engines.md), imported below.

May import: the rest of rollout, tasks, models, tracking, config, core.
"""

from gspo_bench.rollout.engines.base import (ENGINES, Capabilities, EngineSetup, InProcessEngine, RolloutEngine,
                                             build_engine, engine_class, engine_names, generate, register_engine,
                                             resolve_engine, unregister_engine)
from gspo_bench.rollout.engines import fast, compiled, hf, vllm  # noqa: F401  (each registers its engine)
from gspo_bench.rollout.engines.vllm import VLLM_AUTO_MIN_PARAMS, prefers_vllm

__all__ = ["ENGINES", "Capabilities", "EngineSetup", "InProcessEngine", "RolloutEngine", "VLLM_AUTO_MIN_PARAMS",
           "build_engine", "engine_class", "engine_names", "generate", "prefers_vllm", "register_engine",
           "resolve_engine", "unregister_engine"]
