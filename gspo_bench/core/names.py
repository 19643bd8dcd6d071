"""The names the core's functions accept, as plain tuples: the config checks its fields against them without
importing torch."""

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
