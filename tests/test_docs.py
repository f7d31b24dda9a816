"""The documentation site builds with `mkdocs build --strict`: every page is in the nav,
and no link points at a missing page, file or heading (mkdocs.yml turns those into
warnings, which --strict makes fatal)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mkdocs() -> str:
    found = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if found is None:
        pytest.fail("mkdocs is not installed: run scripts/setup (it installs the test extra)")
    return found


def test_docs_build_strict(tmp_path: Path) -> None:
    completed = subprocess.run(
        [_mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
