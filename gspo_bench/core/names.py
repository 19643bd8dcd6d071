"""The names the core's functions accept, as plain tuples (the advantage estimators', a list their registry
extends), and how ``rollout.rejection``'s thresholds read: the config checks its fields against them without
importing torch."""

import math

CORRECTIONS = ("none", "tis", "mis")
"""Sampler/trainer mismatch corrections (``ratios.apply_correction``)."""
CORRECTION_LEVELS = ("unit", "token", "sequence", "geometric")
"""Where a correction's weight is taken: the loss's ratio unit, per token, the product over a response, or its
geometric mean (``ratios.is_weights``)."""
KL_ESTIMATORS = ("k1", "k2", "k3")
"""KL-to-reference estimators (``losses.kl_penalty``)."""
ADVANTAGE_BASELINES = ("group_mean", "leave_one_out")
"""What a group advantage subtracts (``advantages.group_zscore``)."""
ADVANTAGE_SCALES = ("group", "batch", "none")
"""What it divides by (``advantages.group_zscore``)."""
ADVANTAGE_ESTIMATOR_NAMES: list[str] = ["group"]
"""The advantage estimators' names (``advantages.ADVANTAGE_ESTIMATORS``): the built-in one, and each name
``advantages.register_advantage`` adds."""
REJECTION_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2",
                     "seq_max_k3")
"""Rejection by KL (``ratios.rejection_mask``): a statistic of ``l = log rho`` (k1, k2 or k3), per token, or its
mean or max over a response."""


def rejection_bounds(options, threshold) -> tuple[tuple[str, float | None, float], ...]:
    """``rollout.rejection`` and ``rollout.rejection_threshold`` read as ``(option, low, high)`` per option, in
    the statistic's own units (verl's ``rollout_rs`` rules): a ``*_k1`` option keeps ``low <= k1 <= high`` with
    ``low, high`` the logs of the ratios ``"lo_hi"`` (one number ``hi``: ``lo = 1 / hi``); the others keep
    ``stat <= high``, one positive number. ``threshold`` is one spec for every option or a comma list of one per
    option. A ValueError, one line, for anything else."""
    names = [o.strip() for o in str(options).split(",") if o.strip()] if options is not None else []
    if not names:
        raise ValueError(f"rejection={options!r} must name at least one of {', '.join(REJECTION_OPTIONS)}")
    unknown = [o for o in names if o not in REJECTION_OPTIONS]
    if unknown:
        raise ValueError(f"rejection option {unknown[0]!r} is not allowed (allowed: {', '.join(REJECTION_OPTIONS)})")
    repeated = sorted({o for o in names if names.count(o) > 1})
    if repeated:
        raise ValueError(f"rejection={options!r} names {repeated[0]!r} more than once")
    if threshold is None or isinstance(threshold, bool):
        raise ValueError(f"rejection={','.join(names)} needs rejection_threshold (e.g. 0.5_2.0 for *_k1, 0.01 "
                         "for the others)")
    specs = [p.strip() for p in str(threshold).split(",") if p.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"rejection_threshold={threshold!r} must give one threshold for every option or one per "
                         f"option ({len(names)})")
    specs = specs * len(names) if len(specs) == 1 else specs
    out = []
    for name, spec in zip(names, specs):
        parts = spec.split("_") if name.endswith("k1") else [spec]
        try:
            # float() would read "0.5_2" as 0.52: an underscore only ever separates k1's two ratios
            values = [float(p) for p in parts if "_" not in p]
        except ValueError:
            values = []
        values = values if len(values) == len(parts) else []
        if name.endswith("k1"):
            # "lo_hi" as ratios, or "hi" with lo = 1 / hi; compared in log space
            if len(values) == 1 and values[0] > 0:
                values = [1.0 / values[0], values[0]]
            ok = len(values) == 2 and all(math.isfinite(v) and v > 0 for v in values) and values[0] < values[1]
            if not ok:
                raise ValueError(f"rejection_threshold {spec!r} for {name} must be 'lo_hi', two ratios "
                                 "0 < lo < hi (or one ratio hi > 1: lo = 1 / hi)")
            out.append((name, math.log(values[0]), math.log(values[1])))
        else:
            if len(values) != 1 or not (math.isfinite(values[0]) and values[0] > 0):
                raise ValueError(f"rejection_threshold {spec!r} for {name} must be one number > 0 (an upper bound)")
            out.append((name, None, values[0]))
    return tuple(out)
