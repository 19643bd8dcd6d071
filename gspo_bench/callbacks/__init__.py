"""Lightning callbacks: what watches a run without being part of its update.

``collapse.py`` (collapse events), ``moe.py`` (expert flip rate),
``diagnostics.py`` (the engine/trainer mismatch and the ratio-histogram sample), ``masking.py`` (a run whose
loss's mask left no token to train on).

May import: rollout, tasks, models, tracking, config, core (never algorithms,
which it watches through Lightning's hooks only).
"""

from gspo_bench.callbacks.collapse import COLLAPSE_KINDS, CollapseCallback, CollapseDetector, CollapseEvent
from gspo_bench.callbacks.diagnostics import MismatchProbe, RatioSample
from gspo_bench.callbacks.masking import MaskedAllRun, MaskedAllWatch
from gspo_bench.callbacks.moe import MoEFlipProbe, RouterRecorder, expert_flip_rate, route

__all__ = ["COLLAPSE_KINDS", "CollapseCallback", "CollapseDetector", "CollapseEvent", "MaskedAllRun",
           "MaskedAllWatch", "MismatchProbe",
           "MoEFlipProbe", "RatioSample", "RouterRecorder", "expert_flip_rate", "route"]
