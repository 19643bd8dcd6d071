"""Rollouts: generation engines, the fast sampler and packed forward, and the shared datamodule.

``engine.py`` (engine choice, log-probs) -> ``fastlm.py`` (functional Qwen3 forward) ->
``fastgen.py`` (the fast KV-cache sampler) -> ``datamodule.py`` (prompts, rewards, advantages).
"""
