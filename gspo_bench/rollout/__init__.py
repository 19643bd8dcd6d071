"""Rollouts: the producer, generation engines, the fast sampler and packed forward, the shared datamodule
and the held-out evaluation.

``engine.py`` (the rollout layout, transformers' and the fast sampler's generate, log-probs) ->
``fastlm.py`` (functional Qwen3 forward) -> ``fastgen.py`` (the fast KV-cache sampler) and
``compiled.py`` (its compiled decode step); ``vllm_engine.py`` (vLLM in this process);
``engines/`` (the ``RolloutEngine`` seam, its registry and ``auto``, one file per engine);
``precision.py`` (the sampler's weights in ``rollout.dtype``); ``routing.py`` (MoE expert
choices, Routing Replay); ``recompute.py`` (what activation checkpointing keeps and runs again);
``draws.py`` (where the samplers' randomness comes from); ``producer.py`` (the rollout producer: weights in
with their version, prompts, the engine, rewards, advantages, trajectories, a bounded buffer); ``datamodule.py`` (Lightning's face of the producer);
``evaluation.py`` (the held-out evaluation with the run's engine and verifier); ``trajectory.py``
(a rollout as token ids in and out: the model's and an environment's segments, versions, the layout).

May import: tasks, models, tracking, config, core.
"""
