"""``python -m gspo_bench``, held after its first checkpoint: once that checkpoint and its tag are written, the
run writes the file named by ``GSPO_HOLD`` and waits until the same path with ``.go`` appended exists (at most
ten minutes). A signal sent while it waits lands mid-run however fast the remaining steps would have gone.

Used by ``test_resume.py``. A worker process started with ``spawn`` imports this file again as
``__mp_main__``: the guard keeps it from running a second command.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gspo_bench.cli.main import main  # noqa: E402
from gspo_bench.train.checkpoint import Checkpointer  # noqa: E402


def _held(save, marker: Path):
    go = Path(f"{marker}.go")

    def held_save(self, module):
        save(self, module)
        if not marker.exists():
            marker.write_text(str(module.rl_step))
            deadline = time.monotonic() + 600
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    return held_save


if __name__ == "__main__":
    Checkpointer.save = _held(Checkpointer.save, Path(os.environ["GSPO_HOLD"]))
    sys.exit(main())
