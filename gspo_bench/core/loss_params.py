"""The losses' hyper-parameters, each declared once: default, valid range, ``tune``'s search range, one-line doc.

A loss's registration (``losses.register_loss``) lists the ``LossParam``\\ s it
takes. Everything else reads them: the config's ``loss.<name>`` keys (``auto``
= the algorithm's loss's default), their check and its one-line error,
``--set loss.<name>=...``, ``RunConfig.resolve``, ``policy_loss``'s check,
``tune``'s search space and the README table's defaults column. A new
parameter is a ``declare(LossParam(...))`` line here, named in the
registration of the loss that takes it.

A parameter whose default or search range differs from loss to loss (the
clip band) is declared once here and specialised in each registration with
``LossParam.at``; ``clip_band`` does that for the usual band.

Torch-free: the config reads this module.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

# (low, high, log scale): tune samples uniformly in [low, high], or log-uniformly
SearchRange = tuple[float, float, bool]


@dataclass(frozen=True)
class LossParam:
    """One keyword of ``policy_loss`` that a loss takes, and the ``loss.<name>`` config key that sets it."""

    name: str
    """The keyword and the config key."""
    default: float | None
    """Its value when the config says ``auto`` (None: off, or no bound; see ``null``)."""
    doc: str
    """One line: what it is, and whose (the docs' and ``list``'s wording)."""
    low: float = -math.inf
    """Valid values are finite numbers from ``low`` ..."""
    high: float = math.inf
    """... to ``high``."""
    low_open: bool = False
    """``low`` itself is not valid."""
    high_open: bool = False
    """``high`` itself is not valid."""
    null: str | None = None
    """What None (YAML null) means where it is valid ("no lower bound", "off"); None: not valid."""
    auto: bool = True
    """The config key defaults to ``auto`` (the loss's default); False: to ``default``, for every loss."""
    search: SearchRange | None = None
    """``tune``'s range; None: not searchable."""
    searched: bool = True
    """``tune`` searches it when ``--params`` does not say (only with a ``search`` range)."""

    def at(self, default=dataclasses.MISSING, **changes) -> "LossParam":
        """This parameter as one loss takes it: its own default, search range or ``searched``."""
        if default is not dataclasses.MISSING:
            changes["default"] = default
        return dataclasses.replace(self, **changes)

    def range_text(self, auto: bool = False) -> str:
        """What a valid value is, for an error line: ``a finite number in [0, 1) (or null: no lower bound)``;
        ``auto``: the config's key, which also takes ``auto``."""
        if math.isfinite(self.low) and math.isfinite(self.high):
            text = (f"a finite number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                    f"{')' if self.high_open else ']'}")
        elif math.isfinite(self.low):
            text = f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        elif math.isfinite(self.high):
            text = f"a finite number {'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = "a finite number"
        others = ([f"null: {self.null}"] if self.null is not None else []) + (["auto"] if auto and self.auto else [])
        return text + (f" (or {', or '.join(others)})" if others else "")

    def valid(self, value) -> bool:
        """``value`` is in the declared range (None only where ``null`` says what it means)."""
        if value is None:
            return self.null is not None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


PARAMS: dict[str, LossParam] = {}
"""Every declared loss parameter by name, in declaration order (the config's ``loss.`` keys)."""


def declare(param: LossParam) -> LossParam:
    """Add ``param`` to ``PARAMS``; a second declaration of one name is an error."""
    if param.name in PARAMS:
        raise ValueError(f"loss parameter {param.name!r} is already declared")
    PARAMS[param.name] = param
    return param


# The clip band (docs/algorithms.md, "One clip convention for all"); each loss gives its own default and range.
EPS_LOW = declare(LossParam(
    "eps_low", 0.2, "Lower clip offset (band [1-eps_low, 1+eps_high]), or the loss's lower threshold.",
    low=0.0, high=1.0, high_open=True, null="no lower bound"))
EPS_HIGH = declare(LossParam("eps_high", 0.2, "Upper clip offset, or the loss's upper threshold.", low=0.0))
DUAL_CLIP_C = declare(LossParam(
    "dual_clip_c", None, "PPO dual clip c: for A < 0, L = min(L, -A c) (3.0 is usual).", low=1.0, low_open=True,
    null="off", auto=False))
# SAPO's gate temperatures: a temperature sets how far from 1 the ratio may move before the gradient halves
# (|r - 1| ~ 1.76 / tau), so the search is log-uniform over 0.25 .. 4 around the published 1.0 / 1.05.
TAU_POS = declare(LossParam("tau_pos", 1.0, "SAPO gate temperature where A > 0.", low=0.0, low_open=True,
                            search=(0.25, 4.0, True)))
TAU_NEG = declare(LossParam("tau_neg", 1.05, "SAPO gate temperature where A <= 0.", low=0.0, low_open=True,
                            search=(0.25, 4.0, True)))
# VESPO's phi peaks at w = k / lam and narrows as both grow: each log-uniform over 0.5 .. 8 (published 2 / 3 and
# 3 / 2). The powers may be any real; the decays are scales.
K_POS = declare(LossParam("k_pos", 2.0, "VESPO power k where A >= 0.", search=(0.5, 8.0, True)))
LAM_POS = declare(LossParam("lam_pos", 3.0, "VESPO decay lambda where A >= 0.", low=0.0, low_open=True,
                            search=(0.5, 8.0, True)))
K_NEG = declare(LossParam("k_neg", 3.0, "VESPO power k where A < 0.", search=(0.5, 8.0, True)))
LAM_NEG = declare(LossParam("lam_neg", 2.0, "VESPO decay lambda where A < 0.", low=0.0, low_open=True,
                            search=(0.5, 8.0, True)))
# DPPO's truncation: log-uniform over 2 .. 100 around the published 20, searched only when --params names it.
TRUNC_C = declare(LossParam("trunc_c", 20.0, "DPPO: the importance weight is truncated at this.", low=0.0,
                            low_open=True, search=(2.0, 100.0, True), searched=False))


# DRO's penalty on the squared log-ratio (ROLL's kimi15 tau, verl's default 0.1): log-uniform over 0.01 .. 1.
DRO_BETA = declare(LossParam("dro_beta", 0.1, "DRO: weight beta of the (beta / 2)(log p - log p_old)^2 penalty.",
                             low=0.0, low_open=True, search=(0.01, 1.0, True)))


# Clip-Cov and KL-Cov (verl's defaults): the share of response tokens selected, the covariance window Clip-Cov draws
# from, and KL-Cov's penalty weight. The two ratios are log-uniform over 1e-5 .. 1e-3 around the published 2e-4.
CLIP_COV_RATIO = declare(LossParam("clip_cov_ratio", 2e-4, "Clip-Cov: share of response tokens whose term is zeroed.",
                                   low=0.0, low_open=True, high=1.0, search=(1e-5, 1e-3, True), searched=False))
CLIP_COV_LB = declare(LossParam("clip_cov_lb", 1.0, "Clip-Cov: lower bound of the covariance window it draws from."))
CLIP_COV_UB = declare(LossParam("clip_cov_ub", 5.0, "Clip-Cov: upper bound of the covariance window it draws from."))
KL_COV_RATIO = declare(LossParam("kl_cov_ratio", 2e-4, "KL-Cov: share of response tokens given the |delta| penalty.",
                                 low=0.0, low_open=True, high=1.0, search=(1e-5, 1e-3, True)))
KL_COV_COEF = declare(LossParam("kl_cov_coef", 1.0, "KL-Cov: weight of the |delta| penalty.", low=0.0,
                                search=(0.1, 10.0, True)))

# The controls (docs/algorithms.md, "Controls"): every loss, or every loss of one kind, takes them; each is off at
# its default and the same for every algorithm (no auto). tune searches them only when --params names them.
ENTROPY_COEF = declare(LossParam(
    "entropy_coef", 0.0, "Entropy bonus c: L = L_policy - c * (token-mean entropy); the start value when adaptive.",
    low=0.0, auto=False, search=(1e-4, 1e-2, True), searched=False))
ENTROPY_TARGET = declare(LossParam(
    "entropy_target", None, "Adaptive entropy (TRL's): the coefficient moves to keep the token entropy at this.",
    low=0.0, null="off", auto=False))
ENTROPY_COEF_MIN = declare(LossParam("entropy_coef_min", 0.0, "Adaptive entropy: the coefficient's floor.", low=0.0,
                                     auto=False))
ENTROPY_COEF_MAX = declare(LossParam("entropy_coef_max", 1.0, "Adaptive entropy: the coefficient's ceiling.",
                                     low=0.0, auto=False))
ENTROPY_COEF_DELTA = declare(LossParam("entropy_coef_delta", 0.005, "Adaptive entropy: the coefficient's step.",
                                       low=0.0, low_open=True, auto=False))
TOP_ENTROPY_QUANTILE = declare(LossParam(
    "top_entropy_quantile", 1.0, "Only the top q of the minibatch's tokens by entropy keep a policy-loss term "
    "(1 = all; token-unit losses).", low=0.0, low_open=True, high=1.0, auto=False, search=(0.05, 1.0, False),
    searched=False))
DELTA_CLIP = declare(LossParam(
    "delta_clip", None, "Two-sided clip: the unclipped ratio is capped at d > 1 + eps_high (TRL's delta; ppo, "
    "grpo, dapo, dr_grpo).", low=1.0, low_open=True, null="off", auto=False, search=(1.5, 10.0, True),
    searched=False))
ENTROPY_CONTROLS = (ENTROPY_COEF, ENTROPY_TARGET, ENTROPY_COEF_MIN, ENTROPY_COEF_MAX, ENTROPY_COEF_DELTA)
"""Every loss takes these (the entropy bonus and its adaptive coefficient)."""


def check_relations(values: dict, prefix: str = "") -> None:
    """The rules between parameters, on one set of values (``prefix``: how the error names them, ``loss.``); a
    value that is not a number yet (``auto``, None: off or not taken) is left to the check of the resolved ones.
    One ValueError line for the first rule broken:

    - ``clip_cov_lb < clip_cov_ub``: Clip-Cov draws from the tokens whose covariance lies strictly between them;
    - ``entropy_coef_min <= entropy_coef_max``;
    - with ``entropy_target`` set, ``entropy_coef_min <= entropy_coef <= entropy_coef_max``: the coefficient is
      the adaptive control's start, and every step keeps it within those bounds.
    """
    def number(name: str):
        v = values.get(name)
        return v if isinstance(v, numbers.Real) and not isinstance(v, bool) else None

    lb, ub = number("clip_cov_lb"), number("clip_cov_ub")
    if lb is not None and ub is not None and not lb < ub:
        raise ValueError(f"{prefix}clip_cov_lb={lb:g} must be below {prefix}clip_cov_ub={ub:g} (Clip-Cov draws from "
                         "the tokens whose covariance lies strictly between them)")
    lo, hi, c = number("entropy_coef_min"), number("entropy_coef_max"), number("entropy_coef")
    if lo is not None and hi is not None and not lo <= hi:
        raise ValueError(f"{prefix}entropy_coef_min={lo:g} must be <= {prefix}entropy_coef_max={hi:g}")
    if number("entropy_target") is not None and None not in (lo, hi, c) and not lo <= c <= hi:
        raise ValueError(f"{prefix}entropy_coef={c:g} must be within [{prefix}entropy_coef_min, "
                         f"{prefix}entropy_coef_max] = [{lo:g}, {hi:g}]: with {prefix}entropy_target set it is the adaptive coefficient's "
                         "start, and the control keeps it within those bounds")


def clip_band(eps_low: float | None, eps_high: float, search_low: SearchRange | None = None,
              search_high: SearchRange | None = None, dual_clip: bool = True) -> tuple[LossParam, ...]:
    """The clip parameters of a loss with band ``[1 - eps_low, 1 + eps_high]`` (and the dual clip).

    Without search ranges, those of a token-level clip (PPO, GRPO, DAPO): uniform around the published offsets
    (p_lo, p_hi), split at their midpoint m = (p_lo + p_hi) / 2: eps_low in [p_lo / 2, m], eps_high in
    [m, 1.5 p_hi]. So eps_high >= eps_low always (DAPO's clip-higher; PPO's symmetric 0.2 / 0.2 is the corner)
    while both ranges stay fixed: Optuna's parameter importance refuses ranges that move from trial to trial.
    """
    if search_low is None and search_high is None:
        # m = (p_lo + p_hi) / 2; eps_low in [p_lo / 2, m], eps_high in [m, 1.5 p_hi]
        m = (eps_low + eps_high) / 2
        search_low, search_high = (0.5 * eps_low, m, False), (m, 1.5 * eps_high, False)
    band = (EPS_LOW.at(eps_low, search=search_low), EPS_HIGH.at(eps_high, search=search_high))
    return band + ((DUAL_CLIP_C,) if dual_clip else ())
