"""Shared options of the fifo tests: `--rewrite` regenerates the golden scenario files."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register --rewrite (also settable with QUORUMQ_REWRITE_GOLDEN=1)."""
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite tests/fifo/golden/*/*.txt with the machine's actual output",
    )
