"""The static checks the project promises: `mypy --strict` on every package, ruff on the tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_mypy_strict_is_clean_on_every_package() -> None:
    """fifo, raft, cluster and pipeline type-check under --strict (configured in pyproject)."""
    result = run("mypy", "--strict", "fifo", "raft", "cluster", "pipeline")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_is_clean() -> None:
    """The lint rules in pyproject hold over the whole tree."""
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
