"""The import layering of DESIGN §7, as the import-linter contract in ``.importlinter``.

``lint-imports`` (import-linter) reads every ``import`` in ``semimig/``, lazy ones inside functions
included, and fails on an import from a lower layer into a higher one (e.g. ``semimig.hybrid`` into
``semimig.bench``) or, inside ``semimig.bench``, from the results back up into the report.  The second
test plants such an import in a copy of the package and checks the contract breaks on it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports() -> str:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.skip("import-linter is not installed (pip install -e '.[test]' installs it)")
    exe = Path(sys.executable).with_name("lint-imports")
    if exe.exists():
        return str(exe)
    found = shutil.which("lint-imports")
    if found is None:
        pytest.skip("import-linter is installed but its lint-imports command is not on PATH")
    return found


def _run(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([_lint_imports(), "--no-cache", "--config", str(root / ".importlinter")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_layers_contract_holds():
    out = _run(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_the_contract_breaks_on_an_upward_import(tmp_path):
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    shutil.copytree(ROOT / "semimig", tmp_path / "semimig", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "kernels"))
    with open(tmp_path / "semimig" / "hybrid" / "layout.py", "a") as f:
        f.write("\n\ndef _planted():\n    from semimig.bench import results  # noqa: F401\n")
    with open(tmp_path / "semimig" / "bench" / "results.py", "a") as f:
        f.write("\n\ndef _planted():\n    from semimig.bench import report  # noqa: F401\n")
    out = _run(tmp_path)
    assert out.returncode != 0, out.stdout
    assert "semimig.hybrid is not allowed to import semimig.bench" in out.stdout, out.stdout
    assert "semimig.bench.results is not allowed to import semimig.bench.report" in out.stdout, out.stdout
