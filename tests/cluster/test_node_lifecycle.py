"""Starting and stopping node processes the way an operator does (issue 34): a second start of a
running node, `cluster start` with a node that cannot start or with nodes down, the node id
forms of `node start|stop|restart`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.launcher import (
    LEADER_TIMEOUT_S,
    LocalCluster,
    free_port_run,
    init_cluster,
    node_pid,
    node_status,
    running_nodes,
    start_cluster,
    stop_cluster,
    stop_node,
    wait_until,
)

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


def _listening(port: int) -> socket.socket:
    """A socket that holds `port` on 127.0.0.1 (and never answers)."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def test_cluster_start_names_a_node_whose_client_port_is_taken(tmp_path: Path) -> None:
    """It used to say "started" and exit 0 (two nodes elected a leader) while n2 died 10 s
    later: now it waits for every node to answer, exits 69 naming n2 and quoting its stderr,
    and stops the nodes it started."""
    data_dir = tmp_path / "D"
    config = init_cluster(data_dir, 3)
    holder = _listening(config.node("n2").client_port)
    try:
        result = quorumq("cluster", "start", "--data-dir", str(data_dir))
        assert result.returncode == 69, (result.stdout, result.stderr)
        assert "node n2 exited at start" in result.stderr, result.stderr
        assert "address already in use" in result.stderr.lower(), result.stderr
        assert running_nodes(config) == {}
    finally:
        holder.close()
        stop_cluster(config, grace_s=2.0)  # whatever a failed assertion left running


def test_node_restart_quotes_the_stderr_of_a_node_that_exits_at_start(tmp_path: Path) -> None:
    """`node restart` (and `node recover`, the same wait) said only "exited at start; see
    .../stderr.log": in a test's failure that file was gone with its temp dir. Now the error
    quotes what the node wrote there since it was started."""
    data_dir = tmp_path / "D"
    config = init_cluster(data_dir, 3)
    try:
        started = quorumq("cluster", "start", "--data-dir", str(data_dir))
        assert started.returncode == 0, started.stderr
        stop_node(config.node("n2"), grace_s=5.0)
        holder = _listening(config.node("n2").client_port)
        try:
            result = quorumq("node", "restart", "n2", "--data-dir", str(data_dir))
        finally:
            holder.close()
        assert result.returncode == 69, (result.stdout, result.stderr)
        assert "n2 exited at start" in result.stderr, result.stderr
        assert "address already in use" in result.stderr.lower(), result.stderr
    finally:
        stop_cluster(config, grace_s=2.0)


@pytest.mark.parametrize("cause", ["metrics port taken", "prometheus-client missing"])
def test_cluster_start_names_a_node_that_exits_at_once(tmp_path: Path, cause: str) -> None:
    """A node that exits in under a second: named with its error at once, not after 30 s of
    "no leader elected"."""
    data_dir = tmp_path / "D"
    metrics_base = free_port_run(3)
    config = init_cluster(data_dir, 3, metrics_base_port=metrics_base)
    env = dict(os.environ)
    holder = None
    if cause == "metrics port taken":
        holder = _listening(metrics_base)  # n1's
        expected, culprit = "cannot serve metrics", "n1"
    else:
        shadow = tmp_path / "shadow"
        (shadow / "prometheus_client").mkdir(parents=True)
        (shadow / "prometheus_client" / "__init__.py").write_text("raise ImportError('gone')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
        expected, culprit = "needs prometheus-client", "n"  # every node: the first one seen
    started = time.monotonic()
    try:
        result = quorumq("cluster", "start", "--data-dir", str(data_dir), env=env)
        assert result.returncode == 69, (result.stdout, result.stderr)
        assert "exited at start" in result.stderr and f"node {culprit}" in result.stderr
        assert expected in result.stderr, result.stderr
        assert time.monotonic() - started < LEADER_TIMEOUT_S
        assert running_nodes(config) == {}
    finally:
        if holder is not None:
            holder.close()
        stop_cluster(config, grace_s=2.0)  # whatever a failed assertion left running


def test_cluster_start_starts_the_nodes_that_are_down_and_keeps_its_size(tmp_path: Path) -> None:
    """A killed node is started again by `cluster start` (the running ones are left alone);
    `--nodes 5` on this 3-node dir is refused, saying how to add a member; `node stop`,
    `node restart` and `node start` take the node id either way."""
    data_dir = tmp_path / "D"
    d = str(data_dir)
    with start_cluster(data_dir, nodes=3) as cluster:
        before = running_nodes(cluster.config)
        cluster.kill("n2")
        result = quorumq("cluster", "start", "--data-dir", d)
        assert result.returncode == 0, result.stderr
        assert "started n2 (n1, n3 were running)" in result.stdout, result.stdout
        after = running_nodes(cluster.config)
        assert after["n1"] == before["n1"] and after["n3"] == before["n3"]
        assert node_status(cluster.config.node("n2"), cluster.key) is not None
        bigger = quorumq("cluster", "start", "--nodes", "5", "--data-dir", d)
        assert bigger.returncode == 64, bigger.stderr
        assert "a cluster of 3 nodes" in bigger.stderr and "member add" in bigger.stderr
        assert cluster.reload().node_ids() == ["n1", "n2", "n3"]
        # every node command: NODE_ID or --node-id
        stopped = quorumq("node", "stop", "--node-id", "n3", "--data-dir", d)
        assert stopped.returncode == 0 and "stopped n3" in stopped.stdout, stopped.stderr
        restarted = quorumq("node", "restart", "--node-id", "n3", "--data-dir", d)
        assert restarted.returncode == 0, restarted.stderr
        assert quorumq("node", "stop", "n3", "--data-dir", d).returncode == 0
        foreground = subprocess.Popen(
            [*QUORUMQ, "node", "start", "n3", "--data-dir", d],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            node = cluster.config.node("n3")
            wait_until(lambda: node_status(node, cluster.key), 30, "n3 started by its id")
            assert node_pid(node) == foreground.pid
        finally:
            foreground.terminate()
            foreground.wait(15)
        both = quorumq("node", "stop", "n3", "--node-id", "n1", "--data-dir", d)
        assert both.returncode == 64 and "two node ids" in both.stderr, both.stderr


def test_the_demo_removes_its_temp_dir(tmp_path: Path) -> None:
    """`quorumq demo` without --data-dir leaves nothing behind in the temp dir."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    result = quorumq("demo", "--messages", "20", env={**os.environ, "TMPDIR": str(tmp)})
    assert result.returncode == 0, result.stderr
    assert "demo finished" in result.stdout
    assert list(tmp.iterdir()) == []
