"""The package's layers, kept by import-linter (the contracts are in ``pyproject.toml``).

Two contracts: packages import downward only (``layers``, top to bottom: cli, suite, reporting, bench | tuning,
train, algorithms | callbacks, rollout, tasks, models, tracking, config, core, paths | tables), and no import cycle among
the modules of any package (``acyclic_siblings``). import-linter's graph (grimp) counts imports inside functions
too, so a lazy import cannot hide an upward edge. A test below plants one in a copy of the package and checks
that the contract breaks on it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent.name for p in (ROOT / "gspo_bench").glob("*/__init__.py"))


def _lint(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("lint-imports is missing: install the test extra (import-linter)")
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(lint), "--no-cache", "--no-logo", "--config", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_layers_acyclic_and_mlflow_contracts_are_kept():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 kept, 0 broken" in proc.stdout


def _lint_with(tmp_path: Path, module: str, code: str) -> subprocess.CompletedProcess:
    """``lint-imports`` over a copy of the package with ``code`` appended to ``module`` (a path under it)."""
    shutil.copytree(ROOT / "gspo_bench", tmp_path / "gspo_bench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "gspo_bench" / module, "a") as f:
        f.write(code)
    return _lint(tmp_path)


def test_a_lazy_mlflow_import_outside_tracking_breaks_the_contract(tmp_path):
    # the leaderboard builds its own client inside a function
    proc = _lint_with(tmp_path, "reporting/leaderboard.py",
                      "\n\ndef _client(uri):\n    import mlflow\n\n    return mlflow.MlflowClient(uri)\n")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "mlflow is imported under tracking only BROKEN" in proc.stdout
    assert "gspo_bench.reporting.leaderboard -> mlflow" in proc.stdout


def test_a_lazy_upward_import_breaks_the_contract(tmp_path):
    # the config imports the rollout package inside a function
    proc = _lint_with(tmp_path, "config/sections.py",
                      "\n\ndef _engines():\n    from gspo_bench.rollout import engine\n\n    return engine.ENGINES\n")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "gspo_bench.config is not allowed to import gspo_bench.rollout" in proc.stdout
    assert "gspo_bench.config.sections -> gspo_bench.rollout.engine" in proc.stdout


def test_every_package_is_a_layer_of_the_contract():
    text = (ROOT / "pyproject.toml").read_text()
    layers = text.split("layers = [", 1)[1].split("]", 1)[0]
    named = {name.strip() for line in layers.splitlines() for name in line.strip(' ",').split("|") if name.strip()}
    assert set(PACKAGES) <= named, set(PACKAGES) - named  # exhaustive = true checks the modules too


@pytest.mark.parametrize("module", ["gspo_bench.config", "gspo_bench.reporting.leaderboard"])
def test_the_config_and_the_leaderboard_import_without_torch(module):
    code = (f"import sys; import {module}; "
            "heavy = [m for m in ('torch', 'lightning', 'transformers') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, f"importing {module} loads {proc.stdout.strip()} {proc.stderr[-2000:]}"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_says_what_lives_there_and_what_it_may_import(package):
    import ast

    doc = ast.get_docstring(ast.parse((ROOT / "gspo_bench" / package / "__init__.py").read_text())) or ""
    assert len(doc) > 80, f"gspo_bench/{package}/__init__.py needs a docstring: what lives there, what it imports"
    assert "import" in doc, f"gspo_bench/{package}/__init__.py: say what it may import"
