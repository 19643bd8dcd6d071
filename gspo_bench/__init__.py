"""gspo_bench: PPO, GRPO, DAPO, GSPO, GSPO-token and CISPO side by side on equal terms.

The math is pinned in docs/algorithms.md; ``gspo_bench.core.losses.policy_loss`` and
``gspo_bench.core.advantages`` are the public, pure-function API.
"""

__version__ = "0.1.0"
