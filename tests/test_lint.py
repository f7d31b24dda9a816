"""The code stays ruff-clean (lint and format) and mypy-clean, like the codebases STYLE.md holds up."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["dbt", "ivm_compiler", "tests", "integration_tests", "bench"]


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: run scripts/setup (it installs the test extra)")
    return found


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command: list[str]) -> None:
    completed = subprocess.run(
        [_ruff(), *command, *CHECKED], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_mypy() -> None:
    # The packages come from pyproject.toml ([tool.mypy] packages); the
    # closed sets (settings.py's enums) are what it checks hardest.
    completed = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
