"""The static checks the project promises: `mypy --strict` on every package and the tests, ruff
on the tree."""

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
def test_mypy_strict_is_clean_on_every_package_and_the_tests() -> None:
    """fifo, raft, cluster, pipeline and tests/ type-check under --strict (configured in
    pyproject). tests/ has no __init__.py: --explicit-package-bases names its modules by path
    (tests.fifo.model), the way the tests import each other's helpers."""
    packages = ("fifo", "raft", "cluster", "pipeline", "tests")
    result = run("mypy", "--strict", "--explicit-package-bases", *packages)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_is_clean() -> None:
    """The lint rules in pyproject hold over the whole tree."""
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
