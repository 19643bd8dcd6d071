"""``python -m gspo_bench``, with one rank made to fail: the command line of a multi-process run whose rank
``GSPO_FAIL_RANK`` raises at ``GSPO_FAIL_AT``: ``step:N`` (in RL step N's training step) or ``trainer`` (while
its Lightning Trainer is built, so rank 0 waits alone for it).

Used by ``test_distributed.py``. Lightning's launcher starts the other ranks by running this same file
again (``LOCAL_RANK=1``), so they fail the same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gspo_bench.train import runner  # noqa: E402
from gspo_bench.cli.main import main  # noqa: E402
from gspo_bench.algorithms.base import PolicyModule  # noqa: E402


def _this_rank() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == os.environ["GSPO_FAIL_RANK"]


where = os.environ["GSPO_FAIL_AT"]
if where.startswith("step:"):
    step, training_step = int(where.split(":")[1]), PolicyModule.training_step

    def failing_step(self, batch, batch_idx):
        if _this_rank() and self.rl_step + 1 == step:
            raise RuntimeError(f"forced failure at RL step {step}")
        return training_step(self, batch, batch_idx)

    PolicyModule.training_step = failing_step
else:
    make_trainer = runner._trainer

    def failing_trainer(*args, **kwargs):
        if _this_rank():
            raise RuntimeError("forced failure while building the trainer")
        return make_trainer(*args, **kwargs)

    runner._trainer = failing_trainer

sys.exit(main())
