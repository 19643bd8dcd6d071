"""Where built-in declarative files and caches live."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def builtin_dir(kind: str) -> Path:
    """``tasks`` / ``baselines`` folder: inside the wheel, or at the top of a source checkout.

    A non-editable install copies the top-level ``tasks/`` and ``baselines/``
    folders into ``gspo_bench/_builtin/`` (see pyproject.toml); an editable or
    source checkout reads them where they are.
    """
    installed = PACKAGE_DIR / "_builtin" / kind
    return installed if installed.is_dir() else PACKAGE_DIR.parent / kind


def probe_writable_dir(path: Path, make: bool = False) -> None:
    """Raise OSError unless files can be created in ``path`` (made first when ``make``). A real write probe: a
    temporary file, created and removed, since permission bits lie to root and /proc-like folders refuse files."""
    import tempfile

    if make:
        path.mkdir(parents=True, exist_ok=True)
    tempfile.TemporaryFile(dir=path).close()


def cache_dir() -> Path:
    """Warm-start checkpoints and other reusable artefacts; ``GSPO_BENCH_CACHE`` overrides."""
    root = os.environ.get("GSPO_BENCH_CACHE") or Path.home() / ".cache" / "gspo_bench"
    return Path(root).expanduser()
