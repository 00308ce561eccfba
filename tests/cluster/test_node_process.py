"""The node process itself: exit codes when it cannot start."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher import init_cluster

ROOT = Path(__file__).resolve().parents[2]  # the checkout

pytestmark = pytest.mark.cluster


def test_a_busy_client_port_is_a_clean_failure(tmp_path: Path) -> None:
    """Another process holds the client port: the node exits non-zero, says so, leaves no pid."""
    data_dir = tmp_path / "D"
    cfg = init_cluster(data_dir, 1)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", cfg.nodes[0].client_port))
    holder.listen()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cluster.node", "--data-dir", str(data_dir), "--node-id", "n1"],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        holder.close()
    assert proc.returncode == 70
    assert b"node_failed" in proc.stderr and b"address already in use" in proc.stderr.lower()
    assert not (data_dir / "n1" / "node.pid").exists()
