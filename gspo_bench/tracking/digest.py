"""A run's settings digest (``gspo_bench.config``): what makes two runs the same settings, for ``--resume``, the
leaderboard's groups and the reports.

Kept apart from the run's lifecycle, which loads Lightning for its logger: the report, leaderboard and claims
commands read which settings count (``NOT_HASHED``) and start in seconds less without it.
"""

from __future__ import annotations

import hashlib
import json

# settings that do not change what a run computes: a run may be resumed with other values of these
# (and the warm start's folder, which moves with $GSPO_BENCH_CACHE)
MEMORY_SETTINGS = ("train.micro_batch_tokens", "train.logit_chunk_tokens", "train.activation_checkpointing",
                   "rollout.moe_kernel", "resolved.rollout.moe_kernel")
"""How a step is laid out in memory, not what it computes (each is exact against the plain computation, to float
tolerance): a run resumed with other values continues the same run, and runs that differ only in them are one
config group. A run that ran out of memory can be resumed with micro-batches."""
NOT_HASHED = ("tracking.", "train.progress", "train.checkpoint_every", "resolved.warmstart.path", *MEMORY_SETTINGS)


def hashed_settings(resolved: dict) -> dict:
    """A run's resolved settings, flat (``train.lr``), without the ones in ``NOT_HASHED``; a task option left
    at null (the spec's own) and an ``env`` setting at its default stay out, so the digests of runs made before
    those existed still match."""
    from gspo_bench.config import EnvConfig, flatten, to_dict

    # the env section at its defaults stays out too: runs made before it existed keep their digests
    env_defaults = {f"env.{k}": v for k, v in to_dict(EnvConfig()).items()}
    return {k: v for k, v in flatten(resolved).items()
            if not k.startswith(NOT_HASHED) and not (k.startswith("task_options.") and v is None)
            and not (k in env_defaults and v == env_defaults[k])}


def config_digest(resolved: dict) -> str:
    """sha256 (16 hex digits) of ``hashed_settings(resolved)``."""
    flat = hashed_settings(resolved)
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]
