"""A `tls = true` cluster from the real CLI: it comes up, replicates and serves; its files are in
D/tls with private keys 0600; a peer connection without TLS, or with another CA's certificate,
is refused and logged once per connection while the cluster keeps its leader and serves."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from cluster import tls
from cluster.launcher import LocalCluster, init_cluster
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok
from raft.transport import HELLO_HEAD, MAGIC, VERSION
from tests.cluster.conftest import quorumq_cli

pytestmark = pytest.mark.cluster


def _refusals(log_file: Path, reason: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    return [
        line
        for line in lines
        if line.get("event") == "peer_refused" and reason in str(line.get("reason"))
    ]


def _raft_endpoint(cluster: LocalCluster, node_id: str) -> tuple[str, int]:
    host, port = cluster.config.node(node_id).raft_address.rsplit(":", 1)
    return host, int(port)


def test_a_tls_cluster_from_the_cli_replicates_and_serves(tls_cluster: LocalCluster) -> None:
    """A publish / consume round trip through the leader; every node applies the same state."""
    assert tls_cluster.config.tls
    with tls_cluster.client() as client:
        client.declare_queue("tls-jobs")
        with client.publisher("tls-jobs", window=10) as publisher:
            for i in range(50):
                publisher.publish(b"job-%d" % i)
            publisher.wait_for_confirms(timeout_s=30.0)
        consumer = client.consume("tls-jobs", prefetch=10)
        bodies = []
        for _ in range(50):
            message = consumer.get(timeout_s=10.0)
            assert message is not None
            bodies.append(message.body)
            consumer.ack([message])
        consumer.wait_settled(timeout_s=10.0)
        consumer.cancel()
    assert bodies == [b"job-%d" % i for i in range(50)]
    statuses = tls_cluster.converged(timeout_s=30.0)
    assert len(statuses) == 3


def test_the_certificates_are_in_the_data_dir_with_private_keys_0600(
    tls_cluster: LocalCluster,
) -> None:
    """D/tls: 0700, the CA and a pair per node; every key 0600."""
    base = tls_cluster.data_dir / "tls"
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    for node_id in ("n1", "n2", "n3"):
        assert stat.S_IMODE((base / f"{node_id}.key").stat().st_mode) == 0o600
        assert (base / f"{node_id}.crt").is_file()
    assert stat.S_IMODE((base / "ca.key").stat().st_mode) == 0o600


def test_a_plain_peer_connection_to_a_tls_node_is_refused_and_logged_once(
    tls_cluster: LocalCluster,
) -> None:
    """A member's HELLO sent without TLS: the node closes the connection, logs it once, and
    the cluster keeps its leader and term and serves."""
    leader = tls_cluster.leader()
    client = tls_cluster.raw_client(leader)
    term = client.query("status")["term"]
    member = tls_cluster.config.node("n1").raft_address.encode()
    hello = HELLO_HEAD.pack(MAGIC, VERSION, b"\0" * 32, len(member)) + member
    log_file = tls_cluster.data_dir / leader / "node.log"
    before = len(_refusals(log_file, "TLS handshake failed"))
    with socket.create_connection(_raft_endpoint(tls_cluster, leader), timeout=5) as sock:
        sock.sendall(hello)
        with contextlib.suppress(OSError):
            assert sock.recv(4096)[:6] != MAGIC  # no challenge in the clear
            assert sock.recv(4096) == b""  # then closed
    client.command(DeclareQueue("after-plain"))
    for i in range(10):
        assert client.command(Enqueue("after-plain", b"%d" % i)) == Ok()
    assert client.query("status")["term"] == term
    client.close()
    deadline = time.monotonic() + 5.0
    while len(_refusals(log_file, "TLS handshake failed")) == before:
        assert time.monotonic() < deadline, "no peer_refused line"
        time.sleep(0.05)
    time.sleep(0.3)
    assert len(_refusals(log_file, "TLS handshake failed")) == before + 1


def test_a_certificate_from_another_ca_is_refused_both_ways(
    tls_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A stranger with another cluster's node certificate: it cannot verify the node, and the
    node refuses it when it trusts the node's CA but presents its own certificate."""
    other = init_cluster(tmp_path / "Other", 3, tls=True)
    tls.ensure_certificates(tmp_path / "Other", other)
    stranger = tls.node_peer_contexts(tmp_path / "Other", other, "n1")
    assert stranger is not None
    leader = tls_cluster.leader()
    host, port = _raft_endpoint(tls_cluster, leader)
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        stranger.client.wrap_socket(raw, server_hostname=host)
    # trusts the node's CA, presents a certificate of another CA
    posing = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    posing.minimum_version = ssl.TLSVersion.TLSv1_3
    posing.load_cert_chain(
        tmp_path / "Other" / "tls" / "n1.crt", tmp_path / "Other" / "tls" / "n1.key"
    )
    posing.load_verify_locations(cafile=tls_cluster.data_dir / "tls" / "ca.crt")
    log_file = tls_cluster.data_dir / leader / "node.log"
    before = len(_refusals(log_file, "TLS handshake failed"))
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        posing.wrap_socket(raw, server_hostname=host) as conn,  # TLS 1.3: the client finishes first
        contextlib.suppress(ssl.SSLError, OSError),
    ):
        conn.sendall(b"x")
        assert conn.recv(100) == b""  # the node's alert or close, never data
    deadline = time.monotonic() + 5.0
    while len(_refusals(log_file, "TLS handshake failed")) == before:
        assert time.monotonic() < deadline, "no peer_refused line"
        time.sleep(0.05)
    with tls_cluster.client() as client:
        client.declare_queue("after-stranger")


def test_a_tls_cluster_with_a_missing_key_is_refused_before_any_node_starts(
    tmp_path: Path,
) -> None:
    """`cluster start` names the missing file (exit 66) and starts no node; a node started by
    hand refuses too (exit 78), instead of speaking without TLS."""
    data_dir = tmp_path / "D"
    config = init_cluster(data_dir, 3, tls=True)
    tls.ensure_certificates(data_dir, config)
    (data_dir / "tls" / "n2.key").unlink()
    refused = quorumq_cli("cluster", "start", "--data-dir", str(data_dir))
    assert refused.returncode == 66, refused.stderr
    assert "n2.key" in refused.stderr
    assert not list(data_dir.glob("n*/node.pid"))
    by_hand = quorumq_cli("node", "start", "--data-dir", str(data_dir), "--node-id", "n2")
    assert by_hand.returncode == 78, by_hand.stderr
    assert "n2.key" in by_hand.stderr
