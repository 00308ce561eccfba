"""Golden scenario files: each file's recorded output must equal the machine's output.

Rewrite with `pytest tests/fifo/test_golden.py --rewrite` (or QUORUMQ_REWRITE_GOLDEN=1) and read
the diff: the golden files are the behaviour spec.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fifo.fifo_golden_runner import run_file

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("v*/*.txt"))


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_golden(path: Path, request: pytest.FixtureRequest) -> None:
    """The machine reproduces the scenario's recorded replies, effects and queries."""
    text = path.read_text()
    actual, problems = run_file(text)
    assert not problems, problems
    rewrite = request.config.getoption("--rewrite") or os.environ.get("QUORUMQ_REWRITE_GOLDEN")
    if rewrite:
        path.write_text(actual)
        return
    assert actual == text


def test_golden_files_exist() -> None:
    """Every machine version has scenario files."""
    assert len(list(GOLDEN.glob("v1/*.txt"))) >= 10
    assert len(list(GOLDEN.glob("v2/*.txt"))) >= 10
    assert len(list(GOLDEN.glob("v3/*.txt"))) >= 7
