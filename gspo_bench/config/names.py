"""Name lists the config checks and the packages above it use: MoE kernels, Routing Replay modes, precisions.
(``rollout.engine`` is not one: it names an entry of the engine registry, above config, which checks it.)"""

REPLAY_MODES = ("none", "r2", "r3")
"""``moe.routing_replay`` (``rollout/routing.py``)."""
MOE_KERNELS = ("auto", "grouped", "batched", "loop")
"""``rollout.moe_kernel`` (``rollout/fastlm.py``: ``EXPERT_KERNELS``, ``auto`` resolved by ``pick_moe_kernel``)."""
CHECKPOINT_MODES = (False, True, "selective")
"""``train.activation_checkpointing``: off, full (each layer run again whole in the backward), selective (its matrix
products kept, the operators between them run again; ``rollout/recompute.py``)."""
ROLLOUT_DTYPES = ("float32", "bfloat16", "float16")
"""``rollout.dtype`` (``rollout/precision.py``)."""
SEEDINGS = ("stream", "request")
"""``rollout.seeding`` (``rollout/draws.py``)."""
STALE_POLICIES = ("wait", "drop")
"""``rollout.stale_policy`` (``rollout/overlap.py``)."""
PROX_LOGPS = ("recompute", "loglinear")
"""``rollout.prox_logp`` (``core/ratios.py``: ``loglinear_prox_logp``)."""
CHAT_MODES = ("auto", True, False)
"""``task.chat`` and a task spec's ``chat`` (``tasks/prompts.py`` says what each does)."""
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")
"""``train.accelerator``: Lightning's names for the devices the harness runs on (``gpu`` and ``cuda`` are the
same: a CUDA GPU; ``auto`` takes one when torch sees it)."""
LR_SCHEDULES = ("constant", "linear")
"""``train.lr_schedule``: the policy's learning rate over the RL steps (``algorithms/base.py``, ``step_lr``)."""
GPU_ACCELERATORS = ("gpu", "cuda")
"""The ``train.accelerator`` names that ask for a CUDA GPU."""
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
"""``train.precision``, Lightning's names: ``*-mixed`` autocasts the forward and keeps float32 master weights and
optimiser states; ``*-true`` casts the weights themselves."""

TOOL_FORMATS = ("auto", "compact", "chat")
"""``env.tool_format`` (``tasks/environments/tools.py``): auto (chat where the tokenizer's chat template renders
tool calls, else compact)."""
