"""A real ``mlflow server`` for tests: SQLite backend, proxied artifacts, one worker, a free 127.0.0.1 port.

``running_server(root)`` starts it in ``root`` and stops its whole process group at the end. It skips, naming the
missing piece, where the server cannot run (``mlflow-skinny`` without its server modules, an early exit),
and fails where it starts but never answers ``/health`` within 60 s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

# what ``mlflow server`` imports beyond mlflow-skinny's client
SERVER_MODULES = ("flask", "fastapi", "uvicorn", "sqlalchemy", "alembic")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _missing_piece(log: str) -> str:
    """The line of a dead server's log that says what is missing (an import, an option), else its tail."""
    lines = [x.strip() for x in log.splitlines() if x.strip()]
    for line in reversed(lines):
        if "Error" in line or "No module named" in line or "No such option" in line:
            return line
    return " | ".join(lines[-3:]) or "no output"


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group: mlflow, uvicorn and its worker
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def running_server(root: Path, port: int | None = None):
    """The running server: ``port``, ``url``, ``root``, ``artifacts`` (its ``--artifacts-destination``), ``log``,
    ``proc`` (its process, leading its process group). ``port``: that one (a server started again where a
    killed one was), else a free one."""
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"mlflow server needs {', '.join(missing)} (install `mlflow`, not `mlflow-skinny`)")
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log_path = root / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner process: faster start
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{root}/backend.db", "--artifacts-destination", str(root / "artifacts"),
             "--workers", "1"],
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                pytest.skip(f"mlflow server exited ({proc.returncode}) before answering /health: "
                            f"{_missing_piece(log_path.read_text())}")
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer /health within 60 s; its log:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield SimpleNamespace(port=port, root=root, artifacts=root / "artifacts", log=log_path,
                              url=f"http://127.0.0.1:{port}", proc=proc)
    finally:
        _stop(proc)
