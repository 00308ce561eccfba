"""The node process itself: exit codes when it cannot start."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher import init_cluster, node_pid, node_status, start_cluster

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


def test_node_restart_checks_what_the_node_needs_before_stopping_it(tmp_path: Path) -> None:
    """`node restart` with a configuration the node could not start with (a machine-version cap
    this code does not support, a secret that is missing or not hex) exits 78 and leaves the
    running node alone (before, a bad cap stopped the node, which then refused to start)."""
    data_dir = tmp_path / "D"
    init_cluster(data_dir, 1)
    cluster = start_cluster(data_dir, 1)
    node = cluster.config.node("n1")
    try:
        pid = node_pid(node)
        secret = data_dir / "secret"
        good = secret.read_bytes()
        for damage in ("cap", "missing", "not hex"):
            args = ["--max-machine-version", "9"] if damage == "cap" else []
            if damage == "missing":
                secret.unlink()
            elif damage == "not hex":
                secret.write_bytes(b"not a secret\n")
            command = [sys.executable, "-m", "cluster.cli", "--data-dir", str(data_dir)]
            proc = subprocess.run(
                [*command, "node", "restart", "n1", *args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            secret.write_bytes(good)
            assert proc.returncode == 78, (damage, proc.stderr)
            assert "nothing was stopped" in proc.stderr, (damage, proc.stderr)
            assert node_pid(node) == pid and node_status(node, cluster.key) is not None, damage
        assert "max_machine_version" not in (data_dir / "cluster.toml").read_text()
    finally:
        cluster.stop()
