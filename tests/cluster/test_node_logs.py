"""A node's log: one file that rotates by size, and a console that repeats none of it when it
is not a terminal (a launched node's stderr.log)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster

WRITER = """
import logging, structlog, sys
from pathlib import Path
from cluster.node.logs import setup_logging
setup_logging(Path(sys.argv[1]), "n1", file_bytes_max=20_000, files_kept=3)
log = structlog.get_logger("test")
for i in range(1000):
    log.info("something_happened", number=i, padding="x" * 40)
log.error("something_failed", number=-1)
"""


def test_node_log_rotates_by_size_and_stderr_gets_only_errors(tmp_path: Path) -> None:
    """1,000 lines into a log capped at 20 kB with 3 files kept: node.log and node.log.1-3,
    each within the cap, the newest lines in node.log; stderr (not a terminal) holds the error
    line alone."""
    log_file = tmp_path / "node.log"
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(log_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["node.log", "node.log.1", "node.log.2", "node.log.3"]
    assert all((tmp_path / name).stat().st_size <= 20_000 for name in files)
    last = json.loads(log_file.read_text().splitlines()[-1])
    assert last["event"] == "something_failed"
    assert "something_failed" in done.stderr and "something_happened" not in done.stderr


@pytest.mark.cluster
def test_a_launched_node_writes_each_line_once(cluster3: LocalCluster) -> None:
    """A node started by the launcher logs `node_started` in node.log, not also in stderr.log."""
    node = cluster3.config.node("n1")
    assert '"node_started"' in (node.data_dir / "node.log").read_text()
    assert "node_started" not in (node.data_dir / "stderr.log").read_text()
