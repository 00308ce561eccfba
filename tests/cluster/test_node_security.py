"""The cluster secret: a peer without it cannot join; a node refuses to start without it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import config
from cluster.launcher import LocalCluster, init_cluster
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok

ROOT = Path(__file__).resolve().parents[2]  # the checkout

pytestmark = pytest.mark.cluster


def test_a_peer_without_the_secret_cannot_join(tmp_path: Path) -> None:
    """n3 runs with another secret: n1+n2 make progress, n3 never learns anything."""
    data_dir = tmp_path / "D"
    cfg = init_cluster(data_dir, 3)
    intruder_dir = tmp_path / "intruder"
    intruder_dir.mkdir()
    shutil.copy(data_dir / "cluster.toml", intruder_dir / "cluster.toml")
    config.create_secret(intruder_dir)  # a different secret, same addresses
    cluster = LocalCluster(data_dir, cfg)
    intruder = LocalCluster(intruder_dir, cfg)
    try:
        cluster.start_node("n1")
        cluster.start_node("n2")
        intruder.start_node("n3")
        client = cluster.raw_client("n1")
        client.command(DeclareQueue("secure"))
        for i in range(10):
            assert client.command(Enqueue("secure", b"%d" % i)) == Ok()
        time.sleep(1.0)
        outsider = intruder.raw_client("n3").query("status")
        assert outsider["commit_index"] <= 1 and outsider["last_applied"] == 0
        assert outsider["leader"] is None and outsider["role"] != "leader"
        insider = client.query("status")
        assert insider["last_applied"] > 5 and insider["has_quorum"]
        client.close()
    finally:
        cluster.stop()
        intruder.stop()


def test_a_node_refuses_to_start_without_the_secret(tmp_path: Path) -> None:
    """No `secret` file: the node exits with EX_CONFIG (78) and says why."""
    data_dir = tmp_path / "D"
    init_cluster(data_dir, 1)
    (data_dir / "secret").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.node", "--data-dir", str(data_dir), "--node-id", "n1"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 78
    assert b"secret" in proc.stderr
