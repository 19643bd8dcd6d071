"""Lightning callbacks: what watches a run without being part of its update.

``collapse.py`` (collapse events), ``moe.py`` (expert flip rate),
``diagnostics.py`` (the engine/trainer mismatch and the ratio-histogram sample).

May import: rollout, tasks, models, tracking, config, core (never algorithms,
which it watches through Lightning's hooks only).
"""

from gspo_bench.callbacks.collapse import COLLAPSE_KINDS, CollapseCallback, CollapseDetector, CollapseEvent
from gspo_bench.callbacks.diagnostics import MismatchProbe, RatioSample
from gspo_bench.callbacks.moe import MoEFlipProbe, RouterRecorder, expert_flip_rate, route

__all__ = ["COLLAPSE_KINDS", "CollapseCallback", "CollapseDetector", "CollapseEvent", "MismatchProbe",
           "MoEFlipProbe", "RatioSample", "RouterRecorder", "expert_flip_rate", "route"]
