"""Policy-gradient losses of every registered algorithm (minimise the result).

The contract is the "Losses" section of ``docs/algorithms.md``. Each loss is registered by ``@register_loss`` directly
above its function, with its ratio unit, aggregation, parameters (``loss_params.py``: defaults, ranges,
search ranges) and paper;
``policy_loss`` is the one entry point. The statistics each call returns
(clip fractions, ratio spread, ``kl/old``) come from ``ratios.py``.

Mismatch corrections (docs/algorithms.md, "Mismatch corrections"): given the
sampler's ``rollout_logp`` and ``correction="tis"`` or ``"mis"`` (cap ``C =
correction_cap``, default 2.0), each unit's policy-gradient loss term is
weighted before aggregation by the detached ``rho = exp(old_logp -
rollout_logp)`` taken at the loss's ratio unit: ``w_t = rho_t`` per token
(ppo, grpo, dapo, cispo, gspo_token), ``w_i = exp(mean_t log rho_it)`` per
sequence (gspo). ``tis`` multiplies the term by ``min(w, C)``; ``mis`` zeroes
the terms with ``w`` outside ``[1/C, C]`` (they stay in the denominator) and
leaves the others unweighted. The KL term is never weighted. Two stats are
added, weighted like the other stats (token units: mask-weighted over response
tokens; gspo: each non-empty sequence once):
``mismatch/is_weight_mean`` = mean of the raw (untruncated) ``w``;
``mismatch/corrected_frac`` = fraction of units truncated (tis: ``w > C``) or
masked (mis: ``w < 1/C`` or ``w > C``; a NaN ``w`` counts as outside).
``correction="none"`` (the default) or ``rollout_logp=None`` leaves the loss
and stats bit-identical to no correction.

Conventions
-----------
- ``logp_BT`` / ``old_logp_BT``: log-probs of the sampled tokens under the
  policy being trained / the rollout policy, ``B`` responses padded to ``T``.
  ``old_logp`` (and ``ref_logp``, and the advantages) are detached here: they
  are targets, and a caller must not be able to leak gradient into them.
- ``mask_BT``: 1 on response tokens, 0 on prompt and padding (bool or float).
  ``|y_i| = mask[i].sum()``. A response with ``|y_i| = 0`` adds nothing and is
  left out of every sequence mean. An all-padding batch gives a zero loss that
  is still attached to the graph, so ``backward()`` works and grads are zero.
- ``delta = logp - old_logp``, token ratio ``r = exp(delta)``.
- One clip convention: ``clip(x) = clamp(x, 1 - eps_low, 1 + eps_high)``,
  ``eps_low=None`` means no lower bound (CISPO's "cap 5.0" is ``eps_high=4.0``).
- Clip conditions use strict inequalities, so a ratio exactly on the band edge
  is not counted as clipped.
- Everything is computed in at least float32 (bf16/fp16 inputs are cast up).
- Padding positions are zeroed with ``torch.where`` *before* ``exp``: padding
  often holds garbage (``-inf``), and ``0 * inf`` in a backward pass is NaN.

Choices the papers leave open
-----------------------------
- PPO's KL-to-reference lives in the reward (``advantages.token_rewards``), so
  the loss-level ``kl_coef`` defaults to 0 for every algorithm, ppo included.
  When it is on, the per-token KL is reduced with the algorithm's own
  aggregation (gspo: seq-mean of per-sequence token means) and ``loss/kl`` is
  the ``kl_coef``-scaled term, so ``loss = loss/policy + loss/kl``.
- Dual clip (Ye et al. 2020, https://arxiv.org/abs/1912.09729) is allowed for
  every clipped-surrogate algorithm (ppo, grpo, dapo, gspo, gspo_token), off by
  default, and needs ``c > 1``. CISPO has no clipped surrogate to bound, so a
  non-None ``dual_clip_c`` is an error there.
- ``clip/seq_frac`` is the fraction of non-empty sequences with at least one
  clipped token. For gspo that is exactly the fraction of clipped sequences;
  token-level algorithms use the same "any token" definition.
- Stats are mask-weighted; for a 0/1 mask that is a plain count of tokens.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

import torch

from gspo_bench.core.loss_params import (CLIP_COV_LB, CLIP_COV_RATIO, CLIP_COV_UB, DELTA_CLIP, DRO_BETA, DUAL_CLIP_C,
                                         EPS_HIGH,
                                         EPS_LOW, ENTROPY_COEF, K_NEG, K_POS, KL_COV_COEF, KL_COV_RATIO, LAM_NEG,
                                         LAM_POS, PARAMS, TAU_NEG, TAU_POS, TOP_ENTROPY_QUANTILE, TRUNC_C, LossParam,
                                         clip_band)
from gspo_bench.core.metrics import Total, Whole, mean_of, values
from gspo_bench.core.names import KL_ESTIMATORS
from gspo_bench.core.ratios import (apply_correction, check_correction, compute_dtype, correction_stats, is_weights,
                                   m2po_mask, masked_delta, masked_mean, off_policy_sequences, ratio_partials,
                                   seq_logratio)

Tensor = torch.Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean", "seq-mean-token-sum-norm", "bnpo")
# What ``loss.aggregation`` may choose instead of a token-unit loss's own: bnpo, the token mean of this process's
# minibatch rows (its divisor is never the count over every process).
AGGREGATION_CHOICES = ("bnpo",)
# The ratio a loss is built on; it is also where a mismatch correction's weight is taken at level "unit":
# token -> per token, sequence (geometric mean of the token ratios) -> per sequence, length-normalised,
# sequence-token (gspo_token) -> per token, sequence-product (vespo) -> per sequence, the product.
RATIO_UNITS = ("token", "sequence", "sequence-token", "sequence-product")
UNIT_LEVELS = {"token": "token", "sequence": "geometric", "sequence-token": "token", "sequence-product": "sequence"}
# Keywords every loss takes (the KL to a reference), and their defaults; a loss's own are its ``params``.
SHARED_HPARAMS = ("kl_coef", "ref_logp", "kl_estimator")
BASE_DEFAULTS = {"kl_coef": 0.0, "kl_estimator": "k3"}
# The clip band's parameters: the README table's band column, the rest of ``params`` its "own" ones.
CLIP_PARAMS = ("eps_low", "eps_high", "dual_clip_c", "delta_clip")
# Parameters of the aggregation rather than the per-unit loss: dr_grpo's T_max, the rollout's length cap, given
# to every loss whose aggregation needs it.
AGG_PARAMS = {"seq-mean-token-sum-norm": ("max_new_tokens",)}


@dataclass(frozen=True)
class LossSpec:
    """One registered loss: its function, its parameters and the facts the README table and ``list`` show."""

    name: str  # registry key, also the algorithm's name
    fn: Callable  # (logp, old_logp, adv, mask, **its params) -> (loss, high_BT, low_BT)
    ratio: str  # one of RATIO_UNITS
    loss: str  # human formula for the README table
    aggregation: str  # one of AGGREGATIONS
    paper: str  # title + URL
    params: tuple[LossParam, ...]  # the parameters it takes beside SHARED_HPARAMS, each with this loss's default
    band: str | None = "ratio"  # what eps_low / eps_high bound: the ratio, the log-ratio, a probability gap, or None
    inputs: tuple[str, ...] = ()  # run-time inputs its function takes beside the tensors ("generator")
    minibatch_wide: bool = False  # it picks tokens by statistics over the whole minibatch (no part of one alone)

    @property
    def token_unit(self) -> bool:
        """One ratio per token: it may mask single tokens (top-entropy tokens) and take the bnpo aggregation."""
        return self.ratio == "token"

    @property
    def controls(self) -> tuple[LossParam, ...]:
        """The controls it takes beside its own parameters: the entropy bonus (every loss) and, for a token-unit
        loss, the top-entropy mask (docs/algorithms.md, "Controls")."""
        return (ENTROPY_COEF,) + ((TOP_ENTROPY_QUANTILE,) if self.token_unit else ())

    @property
    def keywords(self) -> tuple[str, ...]:
        """Every ``policy_loss`` keyword it takes beside the KL ones: its parameters, its aggregation's, then its
        controls."""
        return (tuple(p.name for p in self.params) + AGG_PARAMS.get(self.aggregation, ())
                + tuple(p.name for p in self.controls))

    @property
    def eps_low(self) -> float | None:
        """Default lower offset/threshold; None = no lower bound, or no band at all."""
        return dict(self.param_defaults()).get("eps_low")

    @property
    def eps_high(self) -> float | None:
        """Default upper offset/threshold; None for a loss without a band."""
        return dict(self.param_defaults()).get("eps_high")

    @property
    def defaults(self) -> tuple[tuple[str, object], ...]:
        """Its own parameters' defaults, beyond the band and the dual clip (tau_pos, k_pos, trunc_c, ...)."""
        return tuple((p.name, p.default) for p in self.params if p.name not in CLIP_PARAMS)

    def param_defaults(self) -> tuple[tuple[str, object], ...]:
        """(name, default) of every parameter it takes: what the config's ``auto`` resolves to."""
        return tuple((p.name, p.default) for p in self.params)

    def search_ranges(self) -> dict[str, tuple[float, float, bool]]:
        """(low, high, log scale) of each parameter ``tune`` can search, in the order it samples them: its own,
        then its controls'."""
        return {p.name: p.search for p in self.params + self.controls if p.search is not None}

    def searched_by_default(self) -> tuple[str, ...]:
        """The parameters ``tune`` searches when ``--params`` does not say (never a control)."""
        return tuple(p.name for p in self.params if p.search is not None and p.searched)

    def ratio_band(self, eps_low: float | None, eps_high: float | None) -> tuple[float | None, float | None]:
        """The trust band as offsets of the ratio r from 1 (what a ratio histogram draws): the offsets
        themselves for a ratio band; exp of the bounds for a log-ratio band, (1 - e^-eps_low, e^eps_high - 1);
        (None, None) when the loss bounds no ratio (a soft gate, a probability gap)."""
        if self.band == "ratio":
            return eps_low, eps_high
        if self.band == "log-ratio":
            # delta in [-eps_low, eps_high]  <=>  r in [exp(-eps_low), exp(eps_high)]
            return (None if eps_low is None else 1 - math.exp(-eps_low),
                    None if eps_high is None else math.exp(eps_high) - 1)
        return None, None

    def defaults_text(self) -> str:
        """The defaults column of the README table and ``list``: the band (eps_low / eps_high), then its own."""
        parts = [f"{self.eps_low} / {self.eps_high}"] if "eps_high" in self.keywords else []
        return "; ".join(parts + [f"{k} {v:g}" for k, v in self.defaults])


LOSSES: dict[str, LossSpec] = {}


def _declared(param: LossParam) -> bool:
    """``param`` is a declared parameter, or a loss's copy of one: the default and the search range may be its
    own, the range, the doc and the config's handling are the declaration's."""
    decl = PARAMS.get(param.name)
    return decl is not None and param.at(decl.default, search=decl.search, searched=decl.searched) == decl


def register_loss(name: str, *, ratio: str, loss: str, aggregation: str, paper: str,
                  params: tuple[LossParam, ...], band: str | None = "ratio", inputs: tuple[str, ...] = (),
                  minibatch_wide: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: add the function below to ``LOSSES`` under ``name`` with its table facts.

    ``params``: the parameters it takes (declared in ``loss_params.PARAMS``, specialised with ``LossParam.at``
    or ``clip_band`` for this loss's defaults and search ranges; the KL ones are every loss's). ``band``: what
    its eps bound (``LossSpec.band``). ``inputs``: run-time inputs of ``policy_loss`` it takes (``generator``).
    ``minibatch_wide``: its terms depend on statistics over the whole minibatch, so it refuses a part of one. A
    duplicate name, or an undeclared parameter, is an error.
    """
    if name in LOSSES:
        raise ValueError(f"loss {name!r} is already registered")
    if aggregation not in AGGREGATIONS or aggregation in AGGREGATION_CHOICES:
        raise ValueError(f"aggregation {aggregation!r} not in {AGGREGATIONS}")
    if ratio not in RATIO_UNITS:
        raise ValueError(f"ratio {ratio!r} not in {RATIO_UNITS}")
    unknown = [p.name for p in params if not _declared(p)]
    if unknown:
        raise ValueError(f"loss {name!r}: parameters {unknown} are not declared (declare them in "
                         f"core/loss_params.py; declared: {', '.join(PARAMS)})")
    bad = [f"{p.name}={p.default!r}" for p in params if not p.valid(p.default)]
    if bad:
        raise ValueError(f"loss {name!r}: defaults {', '.join(bad)} are outside their declared ranges")

    def add(fn: Callable) -> Callable:
        LOSSES[name] = LossSpec(name, fn, ratio, loss, aggregation, paper, tuple(params), band, tuple(inputs),
                                minibatch_wide)
        return fn

    return add


# ----------------------------------------------------------------------------- helpers


def _adv_BT(advantages: Tensor, mask_BT: Tensor) -> Tensor:
    # token-level algorithms: one advantage per sequence is broadcast over its tokens
    adv = advantages.detach()
    adv_BT = adv[:, None].expand_as(mask_BT) if adv.dim() == 1 else adv
    return torch.where(mask_BT > 0, adv_BT, 0.0)  # (B, T)


def _clip(x: Tensor, eps_low: float | None, eps_high: float) -> Tensor:
    # clip(x) = clamp(x, 1 - eps_low, 1 + eps_high); eps_low None -> no floor
    return torch.clamp(x, min=None if eps_low is None else 1.0 - eps_low, max=1.0 + eps_high)


def _surrogate(adv: Tensor, ratio: Tensor, eps_low, eps_high, dual_clip_c, delta_clip=None):
    """Pessimistic clipped surrogate per unit, plus where the clip binds."""
    clipped = _clip(ratio, eps_low, eps_high)
    # two-sided clip (d = delta_clip): the unclipped branch is min(ratio, d)
    unclipped = ratio if delta_clip is None else torch.clamp(ratio, max=delta_clip)
    # L = max(-A * ratio, -A * clip(ratio))
    loss = torch.maximum(-adv * unclipped, -adv * clipped)
    if dual_clip_c is not None:
        # dual clip: for A < 0, L = min(L, -A * c), bounding the loss when ratio >> 1
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip_c), loss)
    # binding side: the clipped branch is the max and carries no gradient
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    low = (ratio < 1.0 - eps_low) & (adv < 0) if eps_low is not None else torch.zeros_like(high)
    return loss, high, low


# ----------------------------------------------------------------------------- losses


_GSPO_PAPER = "Group Sequence Policy Optimization, https://arxiv.org/abs/2507.18071"


def clipped_token_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, delta_clip=None):
    """The clipped surrogate on the token ratio (PPO, GRPO, DAPO differ only in aggregation and clip).

    ``delta_clip`` (INTELLECT-2's two-sided clip, TRL's ``delta``): the unclipped branch is ``min(r, d)`` for both
    signs of the advantage, so a token whose ratio passed ``d`` keeps no gradient; ``clip/frac`` still counts the
    band's two binding sides only. Returns (loss_BT, high_BT, low_BT).
    """
    if delta_clip is not None and not delta_clip > 1.0 + eps_high:
        raise ValueError(f"delta_clip={delta_clip!r} must be above 1 + eps_high = {1.0 + eps_high:g}")
    delta_BT = masked_delta(logp, old_logp, mask)
    # r = exp(delta)
    ratio_BT = torch.exp(delta_BT)
    loss_BT, high_BT, low_BT = _surrogate(_adv_BT(advantages, mask), ratio_BT, eps_low, eps_high, dual_clip_c,
                                          delta_clip)
    valid_BT = mask > 0
    return loss_BT, high_BT & valid_BT, low_BT & valid_BT


# The two-sided clip, which the clipped token losses (ppo, grpo, dapo, dr_grpo) alone take
_TOKEN_CLIP = (DELTA_CLIP,)


@register_loss("ppo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="token-mean",
               params=clip_band(0.2, 0.2) + _TOKEN_CLIP,
               paper="Proximal Policy Optimization Algorithms, https://arxiv.org/abs/1707.06347")
def ppo_loss(logp, old_logp, advantages, mask, **clip):
    """PPO: the token clipped surrogate, token-mean (advantages from GAE, per token)."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_loss("grpo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="seq-mean-token-mean",
               params=clip_band(0.2, 0.2) + _TOKEN_CLIP,
               paper="DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models, "
               "https://arxiv.org/abs/2402.03300")
def grpo_loss(logp, old_logp, advantages, mask, **clip):
    """GRPO: the token clipped surrogate, each sequence's token mean, then the mean over sequences."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_loss("dapo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="token-mean",
               params=clip_band(0.2, 0.28) + _TOKEN_CLIP,
               paper="DAPO: An Open-Source LLM Reinforcement Learning System at Scale, "
               "https://arxiv.org/abs/2503.14476")
def dapo_loss(logp, old_logp, advantages, mask, **clip):
    """DAPO: the token clipped surrogate with clip-higher (0.28 above), token-mean over the minibatch."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


# Sequence ratios sit within ~1e-3 of 1, so tune searches both offsets log-uniformly over 1e-5 .. 1e-2 (the
# published 3e-4 / 4e-4 in the middle), independently; gspo_token and luspo share the ratio, the band and the range.
_GSPO_BAND = clip_band(3e-4, 4e-4, search_low=(1e-5, 1e-2, True), search_high=(1e-5, 1e-2, True))


@register_loss("gspo", ratio="sequence", loss="max(-A_i s_i, -A_i clip(s_i))", aggregation="seq-mean",
               params=_GSPO_BAND, paper=_GSPO_PAPER)
def gspo_sequence_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """GSPO: clipped surrogate on the length-normalised sequence ratio. Returns (loss_B, high_BT, low_BT)."""
    if advantages.dim() != 1:
        raise ValueError(
            "gspo clips one ratio per sequence and needs one advantage per sequence, shape [B]; "
            f"got {tuple(advantages.shape)}. Use 'gspo_token' for per-token advantages."
        )
    delta_BT = masked_delta(logp, old_logp, mask)
    # s_i = exp(sum_t(delta * mask) / |y_i|); the gradient flows through the mean
    s_B = torch.exp(seq_logratio(delta_BT, mask))
    loss_B, high_B, low_B = _surrogate(advantages.detach(), s_B, eps_low, eps_high, dual_clip_c)
    # a clipped sequence clips every one of its tokens
    valid_BT = mask > 0
    return loss_B, high_B[:, None] & valid_BT, low_B[:, None] & valid_BT


@register_loss("gspo_token", ratio="sequence-token", loss="max(-A_it s_it, -A_it clip(s_it))",
               aggregation="seq-mean-token-mean", params=_GSPO_BAND, paper=_GSPO_PAPER + " (section 4.3)")
def gspo_token_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """GSPO-token (GSPO paper, section 4.3). Returns (loss_BT, high_BT, low_BT)."""
    delta_BT = masked_delta(logp, old_logp, mask)
    s_B = torch.exp(seq_logratio(delta_BT, mask))
    # s_it = sg(s_i) * exp(logp - sg(logp)); logp - sg(logp) == delta - sg(delta) since old_logp
    # is constant, and delta is finite at padding. Value s_i, gradient s_i * grad logp_it.
    s_BT = s_B.detach()[:, None] * torch.exp(delta_BT - delta_BT.detach())  # (B, T)
    loss_BT, high_BT, low_BT = _surrogate(_adv_BT(advantages, mask), s_BT, eps_low, eps_high, dual_clip_c)
    valid_BT = mask > 0
    return loss_BT, high_BT & valid_BT, low_BT & valid_BT


# The weight cap 1 + eps_high: tune searches eps_high log-uniformly over 0.5 .. 10 (published 4.0). The lower bound
# is off as published and searched (uniformly over 0.1 .. 0.9) only when --params names it; eps_high comes first,
# the order tune samples them in.
@register_loss("cispo", ratio="token", loss="-sg(clip(r)) A log p", aggregation="token-mean",
               params=(EPS_HIGH.at(4.0, search=(0.5, 10.0, True)),
                       EPS_LOW.at(None, search=(0.1, 0.9, False), searched=False), DUAL_CLIP_C),
               paper="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention, "
               "https://arxiv.org/abs/2506.13585")
def cispo_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """CISPO (MiniMax-M1): REINFORCE with a truncated, stop-gradient IS weight. Returns (loss_BT, high_BT, low_BT)."""
    if dual_clip_c is not None:
        raise ValueError("dual_clip_c applies to clipped surrogates; cispo has none (pass None)")
    valid_BT = mask > 0
    ratio_BT = torch.exp(masked_delta(logp, old_logp, mask))
    # w = sg(clip(r)): the weight is truncated but never zeroed, and carries no gradient
    w_BT = _clip(ratio_BT, eps_low, eps_high).detach()
    # L = -sg(clip(r)) * A * logp, so every token keeps its w * A * grad logp term
    loss_BT = -w_BT * _adv_BT(advantages, mask) * torch.where(valid_BT, logp, 0.0)
    # truncated on either side, whatever the sign of A (the gradient survives)
    high_BT = (ratio_BT > 1.0 + eps_high) & valid_BT
    low_BT = (ratio_BT < 1.0 - eps_low) & valid_BT if eps_low is not None else torch.zeros_like(high_BT)
    return loss_BT, high_BT, low_BT


# ----------------------------------------------------------------------------- the field's other losses


def _by_sign(cond: Tensor, pos: float, neg: float, like: Tensor) -> Tensor:
    # pos where cond else neg, in like's dtype and device (bare python floats would give float32)
    return torch.where(cond, like.new_full((), pos), like.new_full((), neg))


@register_loss("sapo", ratio="token", loss="-A (4 / tau) sigmoid(tau (r - 1))", aggregation="seq-mean-token-mean",
               params=(TAU_POS, TAU_NEG), band=None,
               paper="Soft Adaptive Policy Optimization, https://arxiv.org/abs/2511.20347")
def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos, tau_neg):
    """SAPO: a sigmoid gate on the token ratio instead of a hard clip. Returns (loss_BT, high_BT, low_BT).

    The gate's slope ``4 sig (1 - sig)`` is 1 on policy and decays smoothly away from it, so a token is
    damped rather than cut; ``clip/frac`` counts the tokens damped by more than half (slope < 0.5), on the
    side of 1 their ratio lies.
    """
    valid_BT = mask > 0
    ratio_BT = torch.exp(masked_delta(logp, old_logp, mask))  # (B, T)
    adv_BT = _adv_BT(advantages, mask)
    # tau = tau_pos if A > 0 else tau_neg
    tau_BT = _by_sign(adv_BT > 0, tau_pos, tau_neg, ratio_BT)
    sig_BT = torch.sigmoid(tau_BT * (ratio_BT - 1.0))
    # L = -A * g(r), g(r) = (4 / tau) * sigmoid(tau * (r - 1))
    loss_BT = -adv_BT * (4.0 / tau_BT) * sig_BT
    # gate slope dg/dr = 4 sig (1 - sig): damped by more than half below 0.5
    slope_BT = 4.0 * sig_BT.detach() * (1.0 - sig_BT.detach())
    damped_BT = (slope_BT < 0.5) & valid_BT
    return loss_BT, damped_BT & (ratio_BT > 1.0), damped_BT & (ratio_BT < 1.0)


@register_loss("gmpo", ratio="sequence", loss="-A_i exp(mean_t sign(A_i) min(sign(A_i) delta, sign(A_i) "
               "clamp(delta)))", aggregation="seq-mean", band="log-ratio",
               # log-ratio offsets, each uniform over 0.1 .. 0.9 around the published 0.4, independently
               params=clip_band(0.4, 0.4, search_low=(0.1, 0.9, False), search_high=(0.1, 0.9, False),
                                dual_clip=False),
               paper="Geometric-Mean Policy Optimization, https://arxiv.org/abs/2507.20673")
def gmpo_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high):
    """GMPO: the geometric mean of the clipped token ratios, clipped on the log-ratio ``[-eps_low, eps_high]``.

    Returns (loss_B, high_BT, low_BT). A token's clamp binds in the direction that counts: above
    ``eps_high`` when ``A > 0``, below ``-eps_low`` when ``A < 0``; only those tokens lose their gradient.
    """
    if advantages.dim() != 1:
        raise ValueError(f"gmpo takes one advantage per sequence, shape [B]; got {tuple(advantages.shape)}")
    valid_BT = mask > 0
    delta_BT = masked_delta(logp, old_logp, mask)
    adv_B = advantages.detach()
    sgn_B1 = torch.sign(adv_B)[:, None]
    clamped_BT = torch.clamp(delta_BT, min=None if eps_low is None else -eps_low, max=eps_high)
    # dc_t = sign(A_i) * min(sign(A_i) * delta_t, sign(A_i) * clamp(delta_t, -eps_low, eps_high))
    dc_BT = sgn_B1 * torch.minimum(sgn_B1 * delta_BT, sgn_B1 * clamped_BT)
    # L_i = -A_i * exp(sum_t(dc_t * mask) / |y_i|)
    loss_B = -adv_B * torch.exp(seq_logratio(dc_BT, mask))
    high_BT = (delta_BT > eps_high) & (adv_B > 0)[:, None] & valid_BT
    low_BT = ((delta_BT < -eps_low) & (adv_B < 0)[:, None] & valid_BT if eps_low is not None
              else torch.zeros_like(high_BT))
    return loss_B, high_BT, low_BT


@register_loss("dr_grpo", ratio="token", loss="max(-A r, -A clip(r))", aggregation="seq-mean-token-sum-norm",
               params=clip_band(0.2, 0.2) + _TOKEN_CLIP,
               paper="Understanding R1-Zero-Like Training: A Critical Perspective, https://arxiv.org/abs/2503.20783")
def dr_grpo_loss(logp, old_logp, advantages, mask, **clip):
    """Dr. GRPO: the token clipped surrogate summed and divided by B * max_new_tokens (no length bias), with
    advantages that are not divided by the group std (its recipe)."""
    return clipped_token_loss(logp, old_logp, advantages, mask, **clip)


@register_loss("luspo", ratio="sequence", loss="abs(y_i) max(-A_i s_i, -A_i clip(s_i))", aggregation="seq-mean",
               params=_GSPO_BAND,
               paper="Length-Unbiased Sequence Policy Optimization, https://arxiv.org/abs/2602.05261")
def luspo_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None):
    """LUSPO: GSPO's clipped sequence surrogate scaled by the response length. Returns (loss_B, high_BT, low_BT)."""
    if advantages.dim() != 1:
        raise ValueError(f"luspo takes one advantage per sequence, shape [B]; got {tuple(advantages.shape)}")
    loss_B, high_BT, low_BT = gspo_sequence_loss(logp, old_logp, advantages, mask, eps_low=eps_low,
                                                 eps_high=eps_high, dual_clip_c=dual_clip_c)
    # L_i = |y_i| * max(-A_i s_i, -A_i clip(s_i))
    return mask.sum(-1) * loss_B, high_BT, low_BT


@register_loss("vespo", ratio="sequence-product", loss="-sg(phi_i) A log p", aggregation="token-mean",
               params=(K_POS, LAM_POS, K_NEG, LAM_NEG), band=None,
               paper="Variational Sequence-Level Soft Policy Optimization, https://arxiv.org/abs/2602.10693")
def vespo_loss(logp, old_logp, advantages, mask, *, k_pos, lam_pos, k_neg, lam_neg):
    """VESPO: REINFORCE weighted by a gamma-shaped function of the sequence's product ratio, without gradient.

    ``phi(w) = e^lam w^k e^(-lam w)`` is 1 at ``w = 1`` and falls off on both sides. Returns
    (loss_BT, high_BT, low_BT); ``clip/frac`` counts the tokens of sequences with ``phi < 0.5``.
    """
    valid_BT = mask > 0
    delta_BT = masked_delta(logp, old_logp, mask)
    # lw_i = clamp(sum_t(clamp(delta, -20, 20) * mask), ln 1e-8, 20): the log of the product of token ratios
    lw_B = torch.clamp((torch.clamp(delta_BT, -20.0, 20.0) * mask).sum(-1), math.log(1e-8), 20.0).detach()
    adv_BT = _adv_BT(advantages, mask)
    # (k, lam) = (k_pos, lam_pos) if A >= 0 else (k_neg, lam_neg)
    k_BT = _by_sign(adv_BT >= 0, k_pos, k_neg, delta_BT)
    lam_BT = _by_sign(adv_BT >= 0, lam_pos, lam_neg, delta_BT)
    lw_B1 = lw_B[:, None]
    # phi_i = exp(lam + k * lw_i - lam * exp(lw_i)), 1 at w = 1, no gradient
    phi_BT = torch.exp(lam_BT + k_BT * lw_B1 - lam_BT * torch.exp(lw_B1)).detach()
    # L = -sg(phi_i) * A * logp
    loss_BT = -phi_BT * adv_BT * torch.where(valid_BT, logp, 0.0)
    damped_BT = (phi_BT < 0.5) & valid_BT
    return loss_BT, damped_BT & (lw_B1 > 0), damped_BT & (lw_B1 < 0)


_DPPO_PAPER = "Rethinking the Trust Region in LLM Reinforcement Learning, https://arxiv.org/abs/2602.04879"


def _dppo_loss(logp, old_logp, advantages, mask, keep_pos_BT, keep_neg_BT, trunc_c):
    """The DPPO policy gradient given where the divergence test keeps a token; returns (loss_BT, high_BT, low_BT)."""
    valid_BT = mask > 0
    # r = exp(clamp(delta, -20, 20))
    ratio_BT = torch.exp(torch.clamp(masked_delta(logp, old_logp, mask), -20.0, 20.0))
    adv_BT = _adv_BT(advantages, mask)
    pos_BT = adv_BT > 0
    # v = the A > 0 test where A > 0, the other one elsewhere; no gradient
    v_BT = torch.where(pos_BT, keep_pos_BT, keep_neg_BT) & valid_BT
    # L = -A * sg(min(r, c)) * logp * v
    loss_BT = torch.where(v_BT, -adv_BT * torch.clamp(ratio_BT, max=trunc_c).detach() * logp, 0.0)
    cut_BT = ~v_BT & valid_BT
    return loss_BT, cut_BT & pos_BT, cut_BT & ~pos_BT


def _probs(logp, old_logp, mask):
    # p = exp(logp), p_old = exp(old_logp), both detached and 1 at padding (garbage there is never exponentiated)
    valid_BT = mask > 0
    return (torch.exp(torch.where(valid_BT, logp.detach(), 0.0)),
            torch.exp(torch.where(valid_BT, old_logp.detach(), 0.0)))


# The two thresholds on p - p_old, each log-uniform over 0.02 .. 0.5 (published 0.15)
@register_loss("dppo_tv", ratio="token", loss="-A sg(min(r, c)) v log p, v: p - p_old within eps",
               aggregation="token-mean", band="probability",
               params=(*clip_band(0.15, 0.15, search_low=(0.02, 0.5, True), search_high=(0.02, 0.5, True),
                                  dual_clip=False), TRUNC_C), paper=_DPPO_PAPER + " (DPPO, total variation)")
def dppo_tv_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, trunc_c):
    """DPPO-TV: a token keeps its truncated-IS gradient unless its probability moved more than the band allows
    in the direction the advantage pushes it. Returns (loss_BT, high_BT, low_BT)."""
    p_BT, p_old_BT = _probs(logp, old_logp, mask)
    # v = (p - p_old <= eps_high) if A > 0 else (p - p_old >= -eps_low)
    keep_pos_BT = (p_BT - p_old_BT) <= eps_high
    keep_neg_BT = (p_BT - p_old_BT) >= -eps_low if eps_low is not None else torch.ones_like(keep_pos_BT)
    return _dppo_loss(logp, old_logp, advantages, mask, keep_pos_BT, keep_neg_BT, trunc_c)


# The two thresholds on the binary KL, each log-uniform over 0.005 .. 0.5 (published 0.05)
@register_loss("dppo_kl", ratio="token", loss="-A sg(min(r, c)) v log p, v: binary KL within eps",
               aggregation="token-mean", band="probability",
               params=(*clip_band(0.05, 0.05, search_low=(0.005, 0.5, True), search_high=(0.005, 0.5, True),
                                  dual_clip=False), TRUNC_C), paper=_DPPO_PAPER + " (DPPO, binary KL)")
def dppo_kl_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, trunc_c):
    """DPPO-KL: as DPPO-TV with the binary KL between Bernoulli(p_old) and Bernoulli(p) as the divergence.
    Returns (loss_BT, high_BT, low_BT)."""
    p_BT, p_old_BT = _probs(logp, old_logp, mask)
    valid_BT = mask > 0
    log_ratio_BT = torch.where(valid_BT, old_logp - logp.detach(), 0.0)
    # b = p_old * (old_logp - logp) + (1 - p_old) * ln((1 - p_old + 1e-8) / (1 - p + 1e-8))
    b_BT = p_old_BT * log_ratio_BT + (1.0 - p_old_BT) * torch.log((1.0 - p_old_BT + 1e-8) / (1.0 - p_BT + 1e-8))
    # v = (b <= eps_high) or (p <= p_old) if A > 0 else (b <= eps_low) or (p >= p_old)
    keep_pos_BT = (b_BT <= eps_high) | (p_BT <= p_old_BT)
    keep_neg_BT = (b_BT <= eps_low) | (p_BT >= p_old_BT) if eps_low is not None else torch.ones_like(keep_pos_BT)
    return _dppo_loss(logp, old_logp, advantages, mask, keep_pos_BT, keep_neg_BT, trunc_c)


# ----------------------------------------------------------------------------- Clip-Cov and KL-Cov

_COV_PAPER = ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models, "
              "https://arxiv.org/abs/2505.22617")


def token_covariance(logp: Tensor, adv_BT: Tensor, mask: Tensor) -> Tensor:
    """``cov_t = (A_t - mean(A)) * (logp_t - mean(sg(logp)))`` per token, the means masked over the minibatch's
    response tokens; no gradient (it only selects tokens). 0 at padding. (B, T)"""
    valid_BT = mask > 0
    lp_BT = torch.where(valid_BT, logp.detach(), 0.0)
    # cov_t = (A_t - mean(A)) * (logp_t - mean(sg(logp)))
    cov_BT = (adv_BT - masked_mean(adv_BT, mask)) * (lp_BT - masked_mean(lp_BT, mask))
    return torch.where(valid_BT, cov_BT, 0.0)


def _cov_count(ratio: float, mask: Tensor) -> int:
    # n = max(1, floor(ratio * sum(mask)))
    return max(1, int(ratio * float(mask.sum())))


# The band as PPO's, searched as the clipped token losses' are; the selected share only when --params names it
@register_loss("clip_cov", ratio="token", loss="max(-A r, -A clip(r)), zeroed at n random tokens of high covariance",
               aggregation="token-mean", inputs=("generator",), minibatch_wide=True,
               params=(*clip_band(0.2, 0.2, dual_clip=False), CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB),
               paper=_COV_PAPER + " (Clip-Cov)")
def clip_cov_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, clip_cov_ratio, clip_cov_lb, clip_cov_ub,
                  generator=None):
    """Clip-Cov: PPO's clipped surrogate with the terms of ``n`` tokens zeroed, drawn at random among the tokens
    whose clipped branch is not active and whose covariance lies strictly inside ``(clip_cov_lb, clip_cov_ub)``.

    The draw follows verl's: the candidates in row-major order, a ``randperm`` of them from ``generator`` (the
    run's; None: a generator seeded 0, so that the function stays a function of its inputs), the first ``n``.
    Returns (loss_BT, high_BT, low_BT); the zeroed tokens are ``clip/frac``, on the side of 1 their ratio lies.
    """
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov_lb={clip_cov_lb!r} must be below clip_cov_ub={clip_cov_ub!r}")
    valid_BT = mask > 0
    ratio_BT = torch.exp(masked_delta(logp, old_logp, mask))
    adv_BT = _adv_BT(advantages, mask)
    # L = max(-A r, -A clip(r))
    loss1_BT, loss2_BT = -adv_BT * ratio_BT, -adv_BT * _clip(ratio_BT, eps_low, eps_high)
    cov_BT = token_covariance(logp, adv_BT, mask)
    # candidates: the clipped branch is not the max (-A clip(r) <= -A r) and lb < cov < ub
    cand_BT = valid_BT & ~(loss2_BT.detach() > loss1_BT.detach()) & (cov_BT > clip_cov_lb) & (cov_BT < clip_cov_ub)
    idx_K2 = torch.nonzero(cand_BT)
    chosen_BT = torch.zeros_like(valid_BT)
    if len(idx_K2):
        g = torch.Generator().manual_seed(0) if generator is None else generator
        pick = torch.randperm(len(idx_K2), generator=g)[:_cov_count(clip_cov_ratio, mask)]
        idx_K2 = idx_K2[pick.to(idx_K2.device)]
        chosen_BT[idx_K2[:, 0], idx_K2[:, 1]] = True
    # the chosen tokens' terms are 0 (they stay in the denominator)
    loss_BT = torch.where(chosen_BT, 0.0, torch.maximum(loss1_BT, loss2_BT))
    up_BT = ratio_BT.detach() >= 1.0
    return loss_BT, chosen_BT & up_BT, chosen_BT & ~up_BT


@register_loss("kl_cov", ratio="token", loss="-A r + kl_cov_coef abs(delta) at the n tokens of largest covariance",
               aggregation="token-mean", band=None, params=(KL_COV_RATIO, KL_COV_COEF), minibatch_wide=True,
               paper=_COV_PAPER + " (KL-Cov)")
def kl_cov_loss(logp, old_logp, advantages, mask, *, kl_cov_ratio, kl_cov_coef):
    """KL-Cov: the unclipped ``-A r`` at every token, plus ``kl_cov_coef * |delta|`` at the ``n`` tokens of largest
    covariance (``torch.topk`` over the response tokens in row-major order, as verl). Returns (loss_BT, high_BT,
    low_BT); the penalised tokens are ``clip/frac``, on the side of 1 their ratio lies."""
    valid_BT = mask > 0
    delta_BT = masked_delta(logp, old_logp, mask)
    ratio_BT = torch.exp(delta_BT)
    adv_BT = _adv_BT(advantages, mask)
    cov_BT = token_covariance(logp, adv_BT, mask)
    chosen_BT = torch.zeros_like(valid_BT)
    flat_K = torch.nonzero(valid_BT.reshape(-1))[:, 0]
    if len(flat_K):
        top = torch.topk(cov_BT.reshape(-1)[flat_K], _cov_count(kl_cov_ratio, mask), largest=True).indices
        chosen_BT.view(-1)[flat_K[top]] = True
    # L = -A r, and -A r + kl_cov_coef * |delta| at the chosen tokens
    loss_BT = -adv_BT * ratio_BT + torch.where(chosen_BT, kl_cov_coef * delta_BT.abs(), 0.0)
    up_BT = ratio_BT.detach() >= 1.0
    return loss_BT, chosen_BT & up_BT, chosen_BT & ~up_BT


# ----------------------------------------------------------------------------- losses for stale samples


@register_loss("rollout_is", ratio="token", loss="-sg(r 1[1 - eps_low < r < 1 + eps_high]) A log p, r vs the sampler",
               aggregation="token-mean", params=clip_band(0.2, 0.2, dual_clip=False), inputs=("rollout_logp",),
               paper="GLM-5 technical report; SkyRL's rollout_is policy loss, "
               "https://github.com/NovaSky-AI/SkyRL")
def rollout_is_loss(logp, old_logp, advantages, mask, *, eps_low, eps_high, rollout_logp=None):
    """Rollout importance sampling: REINFORCE weighted by the ratio to the *sampler* (no old policy needed),
    zeroed outside the band. ``old_logp`` stands in for a missing ``rollout_logp`` (a direct call: a run always
    hands it the sampler's). Returns (loss_BT, high_BT, low_BT)."""
    rollout_logp = old_logp if rollout_logp is None else rollout_logp
    valid_BT = mask > 0
    # r_t = exp(clamp(logp - roll_logp, -20, 20))
    ratio_BT = torch.exp(torch.where(valid_BT, logp - rollout_logp.detach().to(logp.dtype), 0.0).clamp(-20.0, 20.0))
    floor = 1.0 - eps_low if eps_low is not None else 0.0  # eps_low null: no lower bound
    inside_BT = (ratio_BT > floor) & (ratio_BT < 1.0 + eps_high)
    # L_t = -sg(r_t 1[1 - eps_low < r_t < 1 + eps_high]) A_t log p_t
    w_BT = (ratio_BT * inside_BT).detach()
    loss_BT = -w_BT * _adv_BT(advantages, mask) * torch.where(valid_BT, logp, 0.0)
    # clip/frac: the tokens outside the band, whatever the sign of A
    return loss_BT, (ratio_BT >= 1.0 + eps_high) & valid_BT, (ratio_BT <= floor) & valid_BT


@register_loss("dro", ratio="token", loss="-(A log p - (beta / 2) (log p - log p_old)^2)", aggregation="token-mean",
               params=(DRO_BETA,), band=None,
               paper="Kimi k1.5: Scaling Reinforcement Learning with LLMs (eq. 3), https://arxiv.org/abs/2501.12599")
def dro_loss(logp, old_logp, advantages, mask, *, dro_beta):
    """DRO (verl's ``dro``): the policy gradient with a squared log-ratio penalty instead of a clip. Returns
    (loss_BT, high_BT, low_BT); nothing is clipped."""
    valid_BT = mask > 0
    delta_BT = masked_delta(logp, old_logp, mask)
    # L_t = -(A_t log p_t - (beta / 2) (log p_t - log p_old_t)^2)
    loss_BT = -(_adv_BT(advantages, mask) * torch.where(valid_BT, logp, 0.0) - 0.5 * dro_beta * delta_BT.square())
    none_BT = torch.zeros_like(valid_BT)
    return loss_BT, none_BT, none_BT


# ----------------------------------------------------------------------------- controls


def top_entropy_mask(entropy_BT: Tensor, mask_BT: Tensor, quantile: float) -> Tensor:
    """Bool (B, T): the response tokens whose entropy is at least ``tau``, the ``(1 - quantile)``-quantile
    (torch's linear interpolation) of the entropies of every response token given; on ``sg(entropy)``. A
    ``quantile`` of 1 keeps every response token."""
    valid_BT = mask_BT > 0
    ent_BT = entropy_BT.detach()
    if quantile >= 1.0 or not bool(valid_BT.any()):
        return valid_BT
    # tau = quantile_{1 - q}(H over the response tokens); keep H_t >= tau
    tau = torch.quantile(ent_BT[valid_BT].to(compute_dtype(ent_BT.dtype)), 1.0 - quantile)
    return (ent_BT >= tau) & valid_BT


# ----------------------------------------------------------------------------- aggregation, KL


def agg_loss(loss: Tensor, mask: Tensor, mode: str, units: float | None = None, t_max: int | None = None
             ) -> Tensor:
    """Reduce a per-token ``(B, T)`` or per-sequence ``(B,)`` loss to a scalar.

    "bnpo" is token-mean whose ``units`` are this process's own token count (the caller's choice).
    "seq-mean-token-sum-norm" (Dr. GRPO) needs ``t_max``, the rollout's
    ``max_new_tokens``: ``sum(l * mask) / (B * t_max)``, ``B`` counting the
    non-empty sequences (an empty one is left out, as from every sequence mean).

    ``mask`` is ``(B, T)``; for "seq-mean" it may also be ``(B,)`` (sequence
    lengths or validity). Empty sequences are left out of sequence means, and
    an all-empty batch gives 0 still attached to ``loss``'s graph.

    ``units`` (W > 1 ranks): the minibatch's unit count (tokens for token-mean,
    else non-empty sequences) over all ranks / W, the divisor of this rank's sum,
    so the ranks' terms average to the whole minibatch's mean (``distributed``).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; allowed: {AGGREGATIONS}")
    mask = mask.to(loss.dtype)

    def mean(x: Tensor, w: Tensor) -> Tensor:
        if units is None:
            return masked_mean(x, w)
        # this rank's term: sum over its units / (N / W), N counted over every rank's units
        return torch.where(w > 0, x * w, 0.0).sum() / (float(units) if units > 0 else 1.0)

    if mode == "seq-mean":
        if loss.dim() != 1 or mask.shape[0] != loss.shape[0] or mask.dim() not in (1, 2):
            raise ValueError(f"seq-mean needs loss (B,) and mask (B, T) or (B,); got {tuple(loss.shape)}, "
                             f"{tuple(mask.shape)}")
        len_B = mask.sum(-1) if mask.dim() == 2 else mask
        # seq-mean: mean over non-empty sequences
        return mean(loss, (len_B > 0).to(loss.dtype))
    if loss.shape != mask.shape or loss.dim() != 2:
        raise ValueError(f"{mode} needs loss and mask of the same (B, T) shape; got {tuple(loss.shape)}, "
                         f"{tuple(mask.shape)}")
    if mode in ("token-mean", "bnpo"):
        # token-mean: sum(l * mask) / sum(mask) over the whole minibatch; bnpo: the same over this process's rows
        # (the caller gives ``units`` as their own count, never the count over every process)
        return mean(loss, mask)
    len_B = mask.sum(-1)
    if mode == "seq-mean-token-sum-norm":
        if not isinstance(t_max, int) or isinstance(t_max, bool) or t_max < 1:
            raise ValueError(f"{mode} needs t_max (max_new_tokens), a positive int; got {t_max!r}")
        # sum(l * mask) / (B * T_max): each sequence's token sum / T_max, then the mean over sequences
        seq_B = torch.where(mask > 0, loss * mask, 0.0).sum(-1) / t_max
        return mean(seq_B, (len_B > 0).to(loss.dtype))
    # per sequence: sum_t(l * mask) / |y_i|
    seq_B = torch.where(mask > 0, loss * mask, 0.0).sum(-1) / torch.where(len_B > 0, len_B, 1.0)
    # seq-mean-token-mean: mean over non-empty sequences of their token means
    return mean(seq_B, (len_B > 0).to(loss.dtype))


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate, (B, T); http://joschu.net/blog/kl-approx.html."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; allowed: {KL_ESTIMATORS}")
    dtype = compute_dtype(logp.dtype)
    # delta_ref = ref_logp - logp (the reference model is frozen)
    delta_ref = ref_logp.detach().to(dtype) - logp.to(dtype)
    if estimator == "k1":
        # k1 = -delta_ref
        return -delta_ref
    if estimator == "k2":
        # k2 = delta_ref^2 / 2
        return 0.5 * delta_ref.square()
    # k3 = exp(delta_ref) - delta_ref - 1, via expm1 to keep precision near 0
    return torch.expm1(delta_ref) - delta_ref


# ----------------------------------------------------------------------------- entry point


def loss_keywords(spec: LossSpec, hparams: dict, max_new_tokens: int) -> dict:
    """The keywords of ``spec``'s loss a run passes from its loss settings ``hparams`` (``loss.*`` resolved): its
    own parameters (clip range, dual clip, ...), the KL estimator and, for a loss that takes it, the rollout's
    length cap ``max_new_tokens`` (dr_grpo's T_max). The controls (the entropy bonus, the top-entropy mask) are not
    among them: the run passes each only while it is on."""
    controls = {p.name for p in spec.controls}
    kw = {k: v for k, v in hparams.items() if (k in spec.keywords and k not in controls) or k == "kl_estimator"}
    if "max_new_tokens" in spec.keywords:
        kw["max_new_tokens"] = max_new_tokens
    return kw


@dataclass(frozen=True)
class Controls:
    """The shared controls of one run, passed to ``policy_loss`` beside its loss's own parameters
    (docs/algorithms.md, "Controls"), each off at its default, where the loss is bit-identical to one without
    it: the entropy bonus's coefficient at this optimiser step and the top-entropy mask (``loss.*``), another
    aggregation (bnpo), the sampler/trainer correction and off-policy sequence masking (``rollout.*``). The
    two-sided clip (``loss.delta_clip``) is a parameter of the losses that take it, and the loss's mask
    (truncation, rejection) is the mask the loss is given."""

    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    aggregation: str | None = None
    correction: str = "none"
    correction_cap: float = 2.0
    correction_min: float | None = None
    correction_level: str = "unit"
    opsm_threshold: float | None = None
    m2_threshold: float | None = None

    @classmethod
    def of(cls, loss, rollout, entropy_coef: float | None = None) -> "Controls":
        """From a run's resolved ``loss`` and ``rollout`` settings; ``entropy_coef``: this optimiser step's
        coefficient (an adaptive control's, ``EntropyControl.applied``), default ``loss.entropy_coef``. The
        correction applies only to recomputed old log-probs (with the sampler's own, its weight is 1)."""
        return cls(loss.entropy_coef if entropy_coef is None else entropy_coef, loss.top_entropy_quantile,
                   loss.aggregation, rollout.correction if rollout.old_logp_source == "recompute" else "none",
                   rollout.correction_cap, rollout.correction_min, rollout.correction_level, rollout.opsm_threshold,
                   rollout.m2_threshold)

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef > 0 or self.top_entropy_quantile < 1.0

    def keywords(self, rollout_logp: Tensor | None = None, entropy: Tensor | None = None) -> dict:
        """``policy_loss``'s keywords for the controls that are on, and nothing for those that are off. Their
        inputs: ``rollout_logp`` (the sampler's log-probs of these rows, None where the engine gave none: then no
        correction, and sequence masking compares with the old log-probs) and ``entropy`` (with its gradient)."""
        kw: dict = {}
        if self.correction != "none" and rollout_logp is not None:
            # the sampler/trainer correction: weights exp(old_logp - rollout_logp) at correction_level
            kw.update(rollout_logp=rollout_logp, correction=self.correction, correction_cap=self.correction_cap,
                      correction_min=self.correction_min, correction_level=self.correction_level)
        if self.opsm_threshold is not None:
            kw["opsm_threshold"] = self.opsm_threshold
            if rollout_logp is not None:
                kw["rollout_logp"] = rollout_logp
        if self.m2_threshold is not None:
            # M2PO: the second moment of the sampler's log-probs against the old (proximal) ones
            kw.update(m2_threshold=self.m2_threshold, rollout_logp=rollout_logp)
        if self.entropy_coef > 0:
            kw["entropy_coef"] = self.entropy_coef
        if self.top_entropy_quantile < 1.0:
            kw["top_entropy_quantile"] = self.top_entropy_quantile
        if self.needs_entropy:
            kw["entropy"] = entropy
        if self.aggregation is not None:
            kw["aggregation"] = self.aggregation
        return kw

    def units_key(self, spec: LossSpec) -> str:
        """Which of a minibatch's counts its means divide by when these rows are a part of it: its tokens
        (token-mean), this process's own tokens (bnpo) or its non-empty sequences."""
        return {"token-mean": "token", "bnpo": "local_token"}.get(self.aggregation or spec.aggregation, "sequence")

    def check(self, spec: LossSpec, *, delta_clip: float | None = None, eps_high: float | None = None) -> None:
        """What ``spec`` cannot take (``check_controls``), with the two-sided clip's cap and clip range."""
        check_controls(spec, aggregation=self.aggregation, top_entropy_quantile=self.top_entropy_quantile,
                       delta_clip=delta_clip, eps_high=eps_high, m2_threshold=self.m2_threshold)


def check_controls(spec: LossSpec, *, aggregation: str | None = None, top_entropy_quantile: float | None = None,
                   delta_clip: float | None = None, eps_high: float | None = None,
                   m2_threshold: float | None = None) -> None:
    """The controls ``spec`` cannot take, as one ValueError line that starts with the keyword (the run's check
    calls this before any work): bnpo, the top-entropy mask and M2PO's token mask need a token-unit loss, the
    two-sided clip a clipped token loss and a cap above ``1 + eps_high``."""
    unit = f"{spec.name}'s ratio unit is {spec.ratio}"
    if aggregation is not None and aggregation != spec.aggregation:
        if aggregation not in AGGREGATION_CHOICES:
            raise ValueError(f"aggregation={aggregation!r} is not allowed (allowed: "
                             f"{', '.join(AGGREGATION_CHOICES)})")
        if not spec.token_unit:
            raise ValueError(f"aggregation={aggregation} needs a token-unit loss; {unit}")
    if top_entropy_quantile is not None and top_entropy_quantile < 1.0 and not spec.token_unit:
        raise ValueError(f"top_entropy_quantile={top_entropy_quantile!r} needs a token-unit loss (it keeps single "
                         f"tokens); {unit}")
    if m2_threshold is not None and not spec.token_unit:
        raise ValueError(f"m2_threshold={m2_threshold!r} needs a token-unit loss (M2PO masks single tokens); {unit}")
    if delta_clip is not None and "delta_clip" not in spec.keywords:
        takers = ", ".join(n for n, s in LOSSES.items() if "delta_clip" in s.keywords)
        raise ValueError(f"delta_clip={delta_clip!r} is for the clipped token losses ({takers}), not {spec.name}")
    if delta_clip is not None and eps_high is not None and not delta_clip > 1.0 + eps_high:
        raise ValueError(f"delta_clip={delta_clip!r} must be above 1 + eps_high = {1.0 + eps_high:g} ({spec.name})")


def _check(spec: LossSpec, hp: dict, logp, old_logp, advantages, mask, entropy) -> None:
    for p in spec.params:
        if not p.valid(hp[p.name]):
            raise ValueError(f"{spec.name}: {p.name}={hp[p.name]!r} must be {p.range_text()}")
    if "max_new_tokens" in spec.keywords:
        t_max = hp.get("max_new_tokens")
        if not isinstance(t_max, int) or isinstance(t_max, bool) or t_max < 1:
            raise ValueError(f"{spec.name} needs max_new_tokens (the rollout's length cap, T_max), a positive int; "
                             f"got {t_max!r}")
    if not hp["kl_coef"] >= 0:
        raise ValueError(f"kl_coef must be >= 0, got {hp['kl_coef']!r}")
    if hp["kl_estimator"] not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {hp['kl_estimator']!r}; allowed: {KL_ESTIMATORS}")
    if hp["kl_coef"] > 0 and hp["ref_logp"] is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    needs_entropy = hp.get("entropy_coef", 0.0) > 0 or hp.get("top_entropy_quantile", 1.0) < 1.0
    if needs_entropy and entropy is None:
        raise ValueError("entropy_coef > 0 and top_entropy_quantile < 1 need the entropy, (B, T)")
    if logp.dim() != 2 or logp.numel() == 0:
        raise ValueError(f"logp must be a non-empty (B, T) tensor, got shape {tuple(logp.shape)}")
    for key, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", hp["ref_logp"]), ("entropy", entropy)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{key} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"advantages must be [B]={list(logp.shape[:1])} or [B, T]={list(logp.shape)}, "
                         f"got {list(advantages.shape)}")


def policy_loss(name: str, *, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                rollout_logp: Tensor | None = None, correction: str = "none", correction_cap: float = 2.0,
                correction_min: float | None = None, correction_level: str = "unit",
                opsm_threshold: float | None = None, m2_threshold: float | None = None, units: float | None = None,
                entropy: Tensor | None = None, aggregation: str | None = None,
                generator: torch.Generator | None = None, token_units: float | None = None,
                partials: bool = False, **hparams) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of algorithm ``name`` (a key of ``LOSSES``) and its detached 0-dim stats.

    ``partials``: the stats as the rows' sufficient statistics instead (``core/metrics.py``: ``Mean``,
    ``Total``...), which merge over the parts of a minibatch (micro-batches, given ``units``) into the whole
    minibatch's; ``metrics.values`` of them are the stats.

    ``hparams``: the keywords the loss takes (its ``params``, declared in
    ``loss_params.py``, e.g. ``eps_low``, ``eps_high``, ``dual_clip_c``;
    ``tau_pos``, ``tau_neg`` for sapo; ``max_new_tokens`` for dr_grpo's
    aggregation, required) and the KL ones
    (``kl_coef``, ``ref_logp``, ``kl_estimator``); missing ones take the
    loss's defaults. A keyword another loss takes may be passed as None; with
    a value it is an error.

    ``correction`` (one of ``CORRECTIONS``) with ``rollout_logp`` (the
    sampler's log-probs, (B, T)) weights the policy-gradient term per unit by
    ``w = sg(exp(old_logp - rollout_logp))`` taken at ``correction_level``
    ("unit": the loss's ratio unit, see ``UNIT_LEVELS``): tis by
    ``clamp(w, C_min, C_max)``, mis by ``w`` if ``C_min <= w <= C_max`` else 0,
    with ``C_max = correction_cap`` (a finite float > 1) and ``C_min =
    correction_min`` (default: none for tis, ``1 / C_max`` for mis). It then
    adds ``mismatch/is_weight_mean`` (the raw ``w`` averaged over its units,
    tokens mask-weighted, sequences: over non-empty ones) and
    ``mismatch/corrected_frac`` (the same average of truncated or masked).
    ``rollout_logp=None`` or ``correction="none"``: no weight, no new stats, a
    bit-identical loss.

    ``opsm_threshold`` (off-policy sequence masking): the terms of a sequence
    with ``A < 0`` and ``mean_t(rollout_logp - sg(logp)) > threshold`` are
    zeroed (it stays in the denominator; ``old_logp`` stands in for a missing
    ``rollout_logp``), and ``mismatch/opsm_frac`` is the fraction of
    non-empty sequences dropped. With per-token advantages, the tokens with
    ``A < 0`` of such a sequence.

    ``m2_threshold = tau`` (M2PO, token-unit losses, the whole minibatch): with ``m2_t = (rollout_logp_t -
    old_logp_t)^2`` over the response tokens, the terms of the fewest tokens of largest ``m2`` whose removal
    brings the mean ``m2`` of the rest below ``tau`` are zeroed (they stay in the denominator), at least one
    token kept (``ratios.m2po_mask``); ``mismatch/m2`` is the mean before, ``mismatch/m2_masked_frac`` the share
    of response tokens masked.

    ``units``: ``agg_loss``'s divisor on W > 1 ranks; ``None`` on one process.

    The controls (docs/algorithms.md, "Controls"), each off by default and then bit-identical:
    ``entropy`` (B, T), the policy's entropy at each token, carrying its gradient; ``entropy_coef = c``:
    ``L = L_policy - c * Hbar``, ``Hbar = sum(H * m) / sum(m)`` over the minibatch whatever the aggregation
    (``token_units``: its token count when these rows are a part of it), logged as ``loss/entropy_bonus``
    (``c * Hbar``, so ``loss = loss/policy + loss/kl - loss/entropy_bonus``); ``top_entropy_quantile = q``
    (token-unit losses): only tokens with ``H >= tau``, the ``(1 - q)``-quantile over the rows given, keep
    their policy term (the others stay in the denominators; ``m`` of the bonus is the kept tokens),
    ``loss/entropy_mask_frac`` the share kept;
    ``delta_clip`` (its own parameter of the clipped token losses); ``aggregation`` ("bnpo" for a token-unit
    loss; None: its own); ``generator``: the run's random generator, for a loss that draws tokens (clip_cov).
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(LOSSES)}")
    allowed = (*PARAMS, *sorted({k for ks in AGG_PARAMS.values() for k in ks}), *SHARED_HPARAMS)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise TypeError(f"unknown hparam(s) {unknown} for policy_loss; allowed: {', '.join(allowed)}")
    spec = LOSSES[name]
    foreign = sorted(k for k, v in hparams.items() if v is not None and k not in spec.keywords
                     and k not in SHARED_HPARAMS)
    if foreign:
        raise ValueError(f"{name} does not take {', '.join(foreign)} (its parameters: "
                         f"{', '.join(spec.keywords + SHARED_HPARAMS)})")
    hp = {"ref_logp": None, "max_new_tokens": None, **BASE_DEFAULTS, **dict(spec.param_defaults()),
          **{p.name: p.default for p in spec.controls},
          **{k: v for k, v in hparams.items() if k in spec.keywords or k in SHARED_HPARAMS}}
    for p in spec.controls:
        if not p.valid(hp[p.name]):
            raise ValueError(f"{name}: {p.name}={hp[p.name]!r} must be {p.range_text()}")
    check_controls(spec, aggregation=aggregation, m2_threshold=m2_threshold)
    _check(spec, hp, logp, old_logp, advantages, mask, entropy)
    q, ent_coef = hp["top_entropy_quantile"] if spec.token_unit else 1.0, hp["entropy_coef"]
    if (q < 1.0 or spec.minibatch_wide or m2_threshold is not None) and units is not None:
        what = "top_entropy_quantile < 1" if q < 1.0 else "m2_threshold" if m2_threshold is not None else name
        raise ValueError(f"{what} needs the whole minibatch (it picks tokens by statistics over all of it), not a "
                         "part of one (micro-batches, several processes)")
    cap, floor = check_correction(correction, correction_cap, rollout_logp, logp.shape, correction_min,
                                  correction_level)
    if opsm_threshold is not None and (isinstance(opsm_threshold, bool) or not isinstance(
            opsm_threshold, numbers.Real) or not math.isfinite(opsm_threshold)):
        raise ValueError(f"opsm_threshold must be None or a finite float, got {opsm_threshold!r}")
    if m2_threshold is not None and (isinstance(m2_threshold, bool) or not isinstance(m2_threshold, numbers.Real)
                                     or not math.isfinite(m2_threshold) or m2_threshold <= 0):
        raise ValueError(f"m2_threshold must be None or a finite float > 0, got {m2_threshold!r}")
    if m2_threshold is not None and rollout_logp is None:
        raise ValueError("m2_threshold needs the sampler's log-probs (rollout_logp)")

    dtype = compute_dtype(logp.dtype)
    logp_BT = logp.to(dtype)  # (B, T), the only input that carries gradient
    old_logp_BT = old_logp.detach().to(dtype)  # (B, T)
    adv = advantages.detach().to(dtype)  # (B,) or (B, T)
    mask_BT = mask.to(dtype)  # (B, T)

    inputs = {"generator": generator} if "generator" in spec.inputs else {}
    if "rollout_logp" in spec.inputs:  # a loss weighted by the ratio to the sampler (rollout_is)
        inputs["rollout_logp"] = None if rollout_logp is None else rollout_logp.detach().to(dtype)
    unit_loss, high_BT, low_BT = spec.fn(logp_BT, old_logp_BT, adv, mask_BT,
                                         **{p.name: hp[p.name] for p in spec.params}, **inputs)
    extra_stats = {}
    if correction != "none" and rollout_logp is not None:
        level = UNIT_LEVELS[spec.ratio] if correction_level == "unit" else correction_level
        w, unit_w = is_weights(old_logp_BT, rollout_logp.detach().to(dtype), mask_BT, level)
        # L_u <- clamp(w_u, C_min, C_max) L_u (tis) or [C_min <= w_u <= C_max] w_u L_u (mis), KL untouched
        unit_loss, corrected = apply_correction(unit_loss, w, correction, cap, floor, mask_BT)
        extra_stats = correction_stats(w, corrected, unit_w)
    if opsm_threshold is not None:
        sampler_BT = old_logp_BT if rollout_logp is None else rollout_logp.detach().to(dtype)
        off_B = off_policy_sequences(logp_BT, sampler_BT, mask_BT, float(opsm_threshold))
        # drop the terms of an off-policy sequence with A < 0 (they stay in the denominator)
        if unit_loss.dim() == 1:
            drop = off_B & (adv < 0)
            dropped_B = drop
        else:
            drop = off_B[:, None] & (_adv_BT(adv, mask_BT) < 0) & (mask_BT > 0)
            dropped_B = drop.any(-1)
        unit_loss = torch.where(drop, 0.0, unit_loss)
        extra_stats["mismatch/opsm_frac"] = mean_of(dropped_B.to(dtype), (mask_BT.sum(-1) > 0).to(dtype))
    if m2_threshold is not None:
        keep_BT, m2 = m2po_mask(rollout_logp.detach().to(dtype), old_logp_BT, mask_BT, float(m2_threshold))
        valid_BT = mask_BT > 0
        # M2PO: the masked tokens' terms are zeroed (they stay in the denominator)
        unit_loss = torch.where(keep_BT | ~valid_BT, unit_loss, 0.0)
        extra_stats["mismatch/m2"] = Whole(m2.to(dtype))  # over the whole minibatch (no parts: checked above)
        extra_stats["mismatch/m2_masked_frac"] = mean_of((valid_BT & ~keep_BT).to(dtype), mask_BT)
    kept_BT = None
    if q < 1.0:
        kept_BT = top_entropy_mask(entropy, mask_BT, q)
        # only the top-entropy tokens keep their term (the others stay in the denominators)
        unit_loss = torch.where(kept_BT, unit_loss, 0.0)
        extra_stats["loss/entropy_mask_frac"] = mean_of(kept_BT.to(dtype), mask_BT)
    t_max = hp["max_new_tokens"]
    mode = spec.aggregation if aggregation is None else aggregation
    pg_loss = agg_loss(unit_loss, mask_BT, mode, units, t_max)

    kl_part = torch.zeros((), dtype=dtype, device=logp.device)
    if hp["kl_coef"] > 0:
        valid_BT = mask_BT > 0
        kl_BT = kl_penalty(torch.where(valid_BT, logp_BT, 0.0),
                           torch.where(valid_BT, hp["ref_logp"].to(dtype), 0.0), hp["kl_estimator"])
        # the KL shares the algorithm's reduction; a per-sequence loss has no tokens,
        # so its KL is the seq-mean of per-sequence token means
        kl_mode = "seq-mean-token-mean" if mode == "seq-mean" else mode
        # loss += kl_coef * kl_agg
        kl_part = hp["kl_coef"] * agg_loss(kl_BT, mask_BT, kl_mode, units, t_max)
    loss = pg_loss + kl_part
    if ent_coef > 0:
        m_BT = mask_BT if kept_BT is None else kept_BT.to(dtype)
        ent_BT = torch.where(m_BT > 0, entropy.to(dtype), 0.0)
        # Hbar = sum(H * m) / sum(m), a token mean over the minibatch whatever the aggregation
        h_bar = agg_loss(ent_BT, m_BT, "token-mean", token_units)
        # L = L_policy - c * Hbar
        loss = loss - ent_coef * h_bar
        extra_stats["loss/entropy_bonus"] = Total((ent_coef * h_bar).detach())  # a part's share, as h_bar is

    with torch.no_grad():
        stats = ratio_partials(logp_BT.detach(), old_logp_BT, mask_BT, high_BT, low_BT)
    # with units, the part's shares of the minibatch's terms: the parts' shares add up to them
    stats["loss/policy"] = Total(pg_loss.detach())
    stats["loss/kl"] = Total(kl_part.detach())
    stats.update(extra_stats)
    return loss, stats if partials else values(stats)
