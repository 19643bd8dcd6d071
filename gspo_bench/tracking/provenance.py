"""Provenance: which code and which machine made a run or a results file (run tags, results headers)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from gspo_bench import __version__


def machine() -> str:
    """The accelerator or core count, the architecture and torch's version."""
    import platform

    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{os.cpu_count()}-core CPU"
    return f"{dev}, {platform.machine()}, torch {torch.__version__}"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's commit (``+dirty`` with local changes) when first asked, i.e. the code this process loaded."""
    import subprocess

    root = Path(__file__).resolve().parents[2]  # the checkout: gspo_bench/tracking/ is two below it
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return (sha + ("+dirty" if dirty else "")) if sha else f"gspo-bench {__version__}"
