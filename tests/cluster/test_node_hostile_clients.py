"""Clients that misbehave on purpose: a flood of stalled TLS handshakes does not keep honest
clients out, and a client that opens too many connections is refused beyond the node's cap with
a clear, retryable error while the node keeps serving (and keeps its own files writable)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from cluster import protocol
from cluster.client.errors import TlsError, Unavailable
from cluster.client.tls import handshake_failed
from cluster.config import CONFIG_FILE
from cluster.errors import ClusterError, ProtocolError
from cluster.launcher import LocalCluster, init_cluster, start_cluster
from cluster.node.limits import (
    FD_RESERVE,
    OPEN_FILES_WANTED,
    REFUSAL_LOG_INTERVAL_S,
    ConnectionCaps,
    RefusalLog,
    effective_connections_max,
)
from cluster.rawclient import RawClient
from raft import durability

pytestmark = pytest.mark.cluster

CLIENT_HELLO_START = b"\x16\x03\x01\x02\x00\x01"  # a ClientHello's first bytes, then silence


@contextlib.contextmanager
def _stalled_handshakes(endpoint: str, count: int) -> Iterator[list[socket.socket]]:
    host, port = endpoint.rsplit(":", 1)
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(CLIENT_HELLO_START)
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def test_a_flood_of_stalled_handshakes_does_not_keep_clients_out(
    tls_cluster: LocalCluster,
) -> None:
    """With 100 strangers stalled mid-handshake on one node (more than its pending-handshake
    slots), 30 honest TLS clients in a row still connect to that node and publish: the node
    closes the slowest handshakes first, and a client whose handshake was cut retries it."""
    node = tls_cluster.leader()
    with tls_cluster.client(node, only=True) as client:
        client.declare_queue("flooded")
    with _stalled_handshakes(tls_cluster.endpoint(node), 100):
        time.sleep(0.2)  # every stranger is accepted and holds its slot
        for i in range(30):
            with tls_cluster.client(node, only=True) as client:
                client.publish("flooded", b"%d" % i)


def test_a_handshake_cut_short_is_retryable_and_says_so() -> None:
    """A TLS handshake the node closed mid-way is `Unavailable` (the client retries it), never
    the permanent `TlsError` that says the cluster runs without TLS."""
    error = handshake_failed("n1:5000", ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    assert isinstance(error, Unavailable) and not isinstance(error, TlsError)
    assert "cut short by the node" in str(error) and "without tls" not in str(error)
    error = handshake_failed("n1:5000", ConnectionResetError(104, "Connection reset by peer"))
    assert isinstance(error, Unavailable)


# --- connection caps ---------------------------------------------------------------------------

CONNECTIONS_MAX = 30


@pytest.fixture
def capped_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """3 nodes whose cluster.toml caps client connections at CONNECTIONS_MAX per node."""
    data_dir = tmp_path / "D"
    init_cluster(data_dir, nodes=3)
    toml = data_dir / CONFIG_FILE
    toml.write_text(
        toml.read_text().replace("[cluster]\n", f"[cluster]\nconnections_max = {CONNECTIONS_MAX}\n")
    )
    cluster = start_cluster(data_dir, nodes=3)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_connections_past_the_cap_are_refused_clearly_and_the_node_keeps_serving(
    capped_cluster: LocalCluster,
) -> None:
    """A client holding a node's every connection slot: the next connections to that node are
    told why (`connection_limit`, naming the cap) and closed, logged once with their count; a
    library client dialing that node first goes on to another; once the slots free up the node
    serves again; and the node raised its open-file limit at start (1,024 is too few)."""
    node = capped_cluster.leader()
    held = [capped_cluster.raw_client(node, name=f"hog{i}") for i in range(CONNECTIONS_MAX)]
    try:
        for _ in range(50):
            with pytest.raises(ProtocolError) as refused:
                RawClient(capped_cluster.endpoint(node), capped_cluster.key, tls=capped_cluster.tls)
            assert refused.value.code == protocol.CONNECTION_LIMIT
            assert "connections_max" in str(refused.value)
        with capped_cluster.client(node) as client:  # n1 first, then the others
            client.declare_queue("capped")
            client.publish("capped", b"x")
    finally:
        for raw in held:
            raw.close()
    with capped_cluster.client(node, only=True) as client:
        overview = client.overview("capped")
        assert overview is not None and overview.ready == 1
    log = [json.loads(line) for line in (capped_cluster.data_dir / node / "node.log").open()]
    refusals = [line for line in log if line.get("event") == "client_connections_refused"]
    assert len(refusals) == 1 and refusals[0]["refused"] == 1  # the rest wait for the interval
    pid = int((capped_cluster.data_dir / node / "node.pid").read_text())
    soft, hard = _open_files_limit(pid)
    assert soft >= min(hard, OPEN_FILES_WANTED)


def _open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


def test_the_caps_count_per_node_and_per_source_address() -> None:
    """Past either cap a connection is refused with the cap's name, nothing counted; a closed
    connection frees its slot; refusals are logged once per source per interval."""
    caps = ConnectionCaps(total_max=3, per_source_max=2)
    assert caps.admit("10.0.0.1") is None and caps.admit("10.0.0.1") is None
    refused = caps.admit("10.0.0.1")
    assert refused is not None and "connections_per_source_max" in refused
    assert caps.admit("10.0.0.2") is None
    refused = caps.admit("10.0.0.3")
    assert refused is not None and "connections_max" in refused
    caps.release("10.0.0.1")
    assert caps.admit("10.0.0.3") is None
    assert caps.total == 3 and caps.by_source == {"10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 1}
    assert effective_connections_max(4096, 1024) == 1024 - FD_RESERVE


# --- a node whose disk is full -----------------------------------------------------------------


def test_a_client_of_a_node_whose_disk_is_full_moves_to_another_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on one node's journal (the test-only hook) while the other two are healthy: a
    library client connected to that node does not give up with `disk_full` (exit 65 for the
    CLI) but retries on another node, and every publish is confirmed."""
    monkeypatch.setenv(durability.FAULT_ENOSPC_ENV, "enospc.flag")  # relative: the node's dir
    cluster = start_cluster(tmp_path / "D", nodes=3)
    try:
        full = cluster.leader()
        with cluster.client() as client:
            client.declare_queue("spill")
        (cluster.config.node(full).data_dir / "enospc.flag").touch()
        with cluster.client(full) as client:  # its first failed write moves leadership away
            client.publish("spill", b"first", timeout_s=30.0)
        cluster.leader(exclude=full)
        with cluster.client(full, connect_timeout_s=30.0) as client:  # the full node first
            assert client.node == full
            for i in range(20):
                client.publish("spill", b"%d" % i, timeout_s=30.0)
            overview = client.overview("spill")
            assert overview is not None and overview.ready == 21
            assert client.node != full
    finally:
        cluster.stop()


def test_refusals_of_strangers_are_logged_once_per_source_and_interval() -> None:
    """Each (event, source) gets one line per interval, carrying how many refusals it stands
    for; another source or event is logged on its own."""
    now = [0.0]
    refusals = RefusalLog(clock=lambda: now[0])
    with structlog.testing.capture_logs() as lines:
        for _ in range(50):
            refusals.note("auth_failed", "10.0.0.1")
        refusals.note("auth_failed", "10.0.0.2")
        now[0] += REFUSAL_LOG_INTERVAL_S
        refusals.note("auth_failed", "10.0.0.1")
    counts = [(line["source"], line["refused"]) for line in lines]
    assert counts == [("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.1", 50)]


def test_a_flood_of_wrong_credentials_logs_one_line(tls_cluster: LocalCluster) -> None:
    """50 connections with a wrong client key, each refused: one `auth_failed` line."""
    node = tls_cluster.leader()
    path = tls_cluster.data_dir / node / "node.log"
    before = path.read_text().count('"auth_failed"')
    for _ in range(50):
        with pytest.raises(ClusterError):
            RawClient(tls_cluster.endpoint(node), b"0" * 64, tls=tls_cluster.tls)
    # (the node writes its line before it answers: every line is in the file by now)
    assert path.read_text().count('"auth_failed"') == before + 1
