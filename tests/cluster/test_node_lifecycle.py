"""Starting and stopping node processes the way an operator does (issue 34): a second start of a
running node, `cluster start` with a node that cannot start or with nodes down, the node id
forms of `node start|stop|restart`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster, node_pid, node_status, start_cluster

pytestmark = pytest.mark.cluster

QUORUMQ = [sys.executable, "-m", "cluster.cli"]


def quorumq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess (120 s at most), output captured."""
    return subprocess.run(
        [*QUORUMQ, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def test_a_second_node_start_is_refused_and_leaves_the_running_node_untouched(
    tmp_path: Path,
) -> None:
    """`node start` on a running node exits 64 naming its pid before writing anything: the
    incarnation and node.pid stay, and `node stop` still finds the node even without node.pid
    (the lock it holds on its dir names it)."""
    data_dir = tmp_path / "D"
    with start_cluster(data_dir, nodes=1) as cluster:
        node = cluster.config.node("n1")
        pid = node_pid(node)
        assert pid is not None
        incarnation = (node.data_dir / "incarnation").read_text()
        second = quorumq("node", "start", "--data-dir", str(data_dir), "--node-id", "n1")
        assert second.returncode == 64, second.stderr
        assert f"already running (pid {pid})" in second.stderr, second.stderr
        assert (node.data_dir / "incarnation").read_text() == incarnation
        assert (node.data_dir / "node.pid").read_text().strip() == str(pid)
        status = node_status(node, cluster.key)
        assert status is not None and status["incarnation"] == int(incarnation)
        (node.data_dir / "node.pid").unlink()  # what the duplicate used to do
        assert node_pid(node) == pid
        stopped = quorumq("node", "stop", "n1", "--data-dir", str(data_dir))
        assert stopped.returncode == 0 and "stopped n1" in stopped.stdout, stopped.stderr
        assert node_pid(node) is None
        assert LocalCluster(data_dir).statuses()["n1"] is None
