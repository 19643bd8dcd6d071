"""Clip-Cov and KL-Cov (Cui et al. 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models, https://arxiv.org/abs/2505.22617), with verl's parameters and defaults.

Both keep the policy's entropy from collapsing by acting on the few tokens whose centred advantage times centred
log-prob (their covariance) is largest, the tokens that drive the entropy down: Clip-Cov zeroes the clipped
surrogate's term at ``n`` of them drawn at random from a covariance window, KL-Cov adds a ``|log r|`` penalty at
the ``n`` of largest covariance. ``n`` is 2e-4 of the minibatch's response tokens, at least one. Nothing here but
the names: the losses and their parameters are the registrations' (``core/losses.py``, ``core/loss_params.py``).
Both pick tokens from statistics over the whole minibatch, so they run on one process without micro-batches.
"""

from __future__ import annotations

from gspo_bench.algorithms.base import PolicyModule, register_algorithm


@register_algorithm
class ClipCov(PolicyModule):
    """Clip-Cov: PPO's clipped surrogate, zeroed at n random tokens of high covariance, token-mean."""

    name = "clip_cov"


@register_algorithm
class KLCov(PolicyModule):
    """KL-Cov: -A r plus kl_cov_coef |log r| at the n tokens of largest covariance, token-mean."""

    name = "kl_cov"
