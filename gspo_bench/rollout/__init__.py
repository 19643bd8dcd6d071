"""Rollouts: generation engines, the fast sampler and packed forward, and the shared datamodule.

``engine.py`` (engine choice, log-probs) -> ``fastlm.py`` (functional Qwen3 forward) ->
``fastgen.py`` (the fast KV-cache sampler) and ``compiled.py`` (its compiled decode step);
``vllm_engine.py`` (vLLM in this process); ``precision.py`` (the sampler's weights in
``rollout.dtype``); ``routing.py`` (MoE expert choices, Routing Replay); ``datamodule.py``
(prompts, rewards, advantages).

May import: tasks, models, tracking, config, core.
"""
