"""The names the core's functions accept, as plain tuples: the config checks its fields against them without
importing torch."""

CORRECTIONS = ("none", "tis", "mis")
"""Sampler/trainer mismatch corrections (``ratios.apply_correction``)."""
KL_ESTIMATORS = ("k1", "k2", "k3")
"""KL-to-reference estimators (``losses.kl_penalty``)."""
