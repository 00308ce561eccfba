"""Upper bounds on the CLI's counts and sizes (issue 12): each is a usage error (exit 64) that
names the allowed range, before any connection (no cluster runs here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli.publish import BODY_BYTES_MAX
from fifo import limits


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (["publish", "q", "--count", "10000001"], "1<=x<=10000000"),
        (
            ["publish", "q", "--size", str(BODY_BYTES_MAX + 1)],
            f"0<=x<={BODY_BYTES_MAX}",
        ),
        (["consume", "q", "--prefetch", "65536"], "1<=x<=65535"),
        (["consume", "q", "--count", "1000000001"], "1<=x<=1000000000"),
        (["consume", "q", "--priority", "256"], "-255<=x<=255"),
        (["consume", "q", "--consumer-timeout", str(limits.timeout_ms_max + 1)], "1<=x<="),
        (["consume", "q", "--timeout", "1e300"], "0<=x<=86400"),
    ],
)
def test_a_value_over_its_bound_is_a_usage_error_naming_the_range(
    tmp_path: Path, args: list[str], allowed: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "--data-dir", str(tmp_path / "none"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 64, result.stderr
    assert allowed in result.stderr
