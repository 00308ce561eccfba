"""TLS on the client port of a `tls = true` cluster started by the CLI: the threaded and the
asyncio client, RawClient and the CLI publish and consume over TLS (through a follower that
sends them to the leader, and across a leader's death); a mismatch (plaintext client on a TLS
port, TLS client on a plaintext port, another cluster's CA) fails at once with a message that
says what to do; a stranger's garbage or stalled handshake does not stop the node serving;
and no message body crosses the wire in the clear."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster import protocol, tls
from cluster.client import AsyncClient, Client
from cluster.client import _threaded as threaded_shell
from cluster.client.errors import TlsError
from cluster.client.tls import client_context
from cluster.errors import ProtocolError
from cluster.launcher import LocalCluster, init_cluster
from cluster.rawclient import RawClient
from tests.cluster.conftest import quorumq_cli

pytestmark = pytest.mark.cluster

MESSAGES = 200


def _ca(cluster: LocalCluster) -> Path:
    return cluster.data_dir / "tls" / "ca.crt"


def _follower(cluster: LocalCluster) -> tuple[str, str]:
    leader = cluster.leader()
    return next(n for n in cluster.config.node_ids() if n != leader), leader


def _log_events(cluster: LocalCluster, node_id: str, event: str) -> list[dict[str, Any]]:
    text = (cluster.data_dir / node_id / "node.log").read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == event]


def _wait_for_log(cluster: LocalCluster, node_id: str, event: str, count: int) -> None:
    deadline = time.monotonic() + 10.0
    while len(_log_events(cluster, node_id, event)) < count:
        assert time.monotonic() < deadline, f"no {event} line in {node_id}'s log"
        time.sleep(0.05)


# --- the clients over TLS ----------------------------------------------------------------------


def test_the_threaded_client_publishes_and_consumes_through_a_follower(
    tls_cluster: LocalCluster,
) -> None:
    """Dialing only a follower, with the CA's path as `tls=`: the client moves to the leader
    (over TLS too) and every message comes back in order."""
    follower, leader = _follower(tls_cluster)
    with Client([tls_cluster.endpoint(follower)], tls_cluster.key, tls=_ca(tls_cluster)) as client:
        assert client.node == leader
        client.declare_queue("tls-threaded")
        with client.publisher("tls-threaded", window=50) as publisher:
            publisher.publish_many(b"threaded-%d" % i for i in range(MESSAGES))
            publisher.wait_for_confirms(timeout_s=30.0)
        consumer = client.consume("tls-threaded", prefetch=50)
        bodies = []
        for _ in range(MESSAGES):
            message = consumer.get(timeout_s=10.0)
            assert message is not None
            bodies.append(message.body)
            consumer.ack([message])
        assert consumer.wait_settled(timeout_s=10.0)
        consumer.cancel()
    assert bodies == [b"threaded-%d" % i for i in range(MESSAGES)]


def test_the_asyncio_client_publishes_and_consumes_through_a_follower(
    tls_cluster: LocalCluster,
) -> None:
    """The same with AsyncClient and an `ssl.SSLContext` as `tls=`."""
    follower, leader = _follower(tls_cluster)
    context = client_context(_ca(tls_cluster))

    async def run() -> list[bytes]:
        endpoints = [tls_cluster.endpoint(follower)]
        async with AsyncClient(endpoints, tls_cluster.key, tls=context) as client:
            assert client.node == leader
            await client.declare_queue("tls-asyncio")
            async with client.publisher("tls-asyncio", window=50) as publisher:
                await publisher.publish_many(b"asyncio-%d" % i for i in range(MESSAGES))
                await publisher.wait_for_confirms(timeout_s=30.0)
            bodies = []
            async with client.consume("tls-asyncio", prefetch=50) as consumer:
                for _ in range(MESSAGES):
                    message = await consumer.get(timeout_s=10.0)
                    assert message is not None
                    bodies.append(message.body)
                    await message.ack()
                assert await consumer.wait_settled(timeout_s=10.0)
            return bodies

    assert asyncio.run(run()) == [b"asyncio-%d" % i for i in range(MESSAGES)]


def test_the_cli_publishes_consumes_and_reports_status_over_tls(
    tls_cluster: LocalCluster,
) -> None:
    """With --data-dir the CLI finds D/tls/ca.crt itself (publish, consume, status, member
    list); with --endpoints (a follower only) it takes --tls-ca FILE."""
    data_dir, follower = str(tls_cluster.data_dir), _follower(tls_cluster)[0]
    remote = [
        "--endpoints", tls_cluster.endpoint(follower),
        "--credentials", str(tls_cluster.data_dir / "client.key"),
        "--tls-ca", str(_ca(tls_cluster)),
    ]  # fmt: skip
    declared = quorumq_cli("--data-dir", data_dir, "queue", "declare", "tls-cli")
    assert declared.returncode == 0, declared.stderr
    published = quorumq_cli(*remote, "publish", "tls-cli", "--count", "20", "--body", "cli-body")
    assert published.returncode == 0, published.stderr
    assert "confirmed 20" in published.stdout
    consumed = quorumq_cli(
        "--data-dir", data_dir, "-o", "jsonl", "consume", "tls-cli", "--count", "20"
    )
    assert consumed.returncode == 0, consumed.stderr
    assert [json.loads(line)["body"] for line in consumed.stdout.splitlines()] == ["cli-body"] * 20
    status = quorumq_cli("--data-dir", data_dir, "-o", "json", "cluster", "status")
    assert status.returncode == 0, status.stderr
    assert {row["role"] for row in json.loads(status.stdout)} == {"leader", "follower"}
    by_endpoint = quorumq_cli(*remote, "-o", "json", "cluster", "status")
    assert by_endpoint.returncode == 0, by_endpoint.stderr
    assert json.loads(by_endpoint.stdout)[0]["role"] == "follower"
    members = quorumq_cli("--data-dir", data_dir, "-o", "json", "member", "list")
    assert members.returncode == 0, members.stderr
    assert all(row["committed"] for row in json.loads(members.stdout))


def test_raw_client_and_cluster_helpers_speak_tls(tls_cluster: LocalCluster) -> None:
    """LocalCluster's clients, status rows and RawClient use the cluster CA by themselves."""
    assert {row["role"] for row in tls_cluster.status()} == {"leader", "follower"}
    raw = tls_cluster.raw_client(tls_cluster.leader())
    try:
        assert raw.query("status")["role"] == "leader"
    finally:
        raw.close()
    address = tls_cluster.endpoint("n1")
    with contextlib.closing(RawClient(address, tls_cluster.key, tls=_ca(tls_cluster))) as raw:
        assert raw.query("status")["id"] == "n1"


def test_tls_data_left_in_the_ssl_buffer_is_not_lost(
    tls_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two answers in one TLS record, read in pieces smaller than one answer: the second is
    already decrypted inside the SSL object when the first completes, where poll never sees
    it; the client must still deliver it (without draining `pending()` it waits forever)."""
    monkeypatch.setattr(threaded_shell, "RECV_BYTES", 64)
    with tls_cluster.client(tls_cluster.leader(), only=True) as client:
        for _ in range(5):
            answers = [threaded_shell._Waiter(), threaded_shell._Waiter()]
            client.submit([protocol.query(0, "status"), protocol.query(0, "status")], answers)
            assert client.wait_until(answers[0].event.is_set, time.monotonic() + 10.0)
            assert client.wait_until(answers[1].event.is_set, time.monotonic() + 3.0)
            assert answers[1].error is None


# --- mismatches fail at once, with what to do ----------------------------------------------------


def test_a_plaintext_client_on_a_tls_port_is_told_to_use_tls(tls_cluster: LocalCluster) -> None:
    """Client, AsyncClient and RawClient without tls=: the node answers in the clear that it
    speaks TLS and what to pass; the client raises at once (no retry until a timeout); the node
    logs it once per connection."""
    endpoint = tls_cluster.endpoint("n2")
    before = len(_log_events(tls_cluster, "n2", "client_without_tls"))
    with pytest.raises(TlsError) as threaded:
        Client([endpoint], tls_cluster.key, connect_retry_s=30.0)
    assert f"n2 at {endpoint} speaks TLS" in str(threaded.value)
    assert "tls=<the cluster CA, D/tls/ca.crt>" in str(threaded.value)

    async def connect() -> None:
        async with AsyncClient([endpoint], tls_cluster.key, connect_retry_s=30.0):
            pass

    with pytest.raises(TlsError, match="speaks TLS"):
        asyncio.run(connect())
    with pytest.raises(ProtocolError) as raw:
        RawClient(endpoint, tls_cluster.key)
    assert raw.value.code == protocol.TLS_REQUIRED
    _wait_for_log(tls_cluster, "n2", "client_without_tls", before + 3)
    time.sleep(0.3)
    assert len(_log_events(tls_cluster, "n2", "client_without_tls")) == before + 3


def test_the_cli_without_the_ca_names_the_fix(tls_cluster: LocalCluster) -> None:
    """--endpoints to a TLS cluster without --tls-ca: exit 78 and the node's own words."""
    refused = quorumq_cli(
        "--endpoints", tls_cluster.endpoint("n1"),
        "--credentials", str(tls_cluster.data_dir / "client.key"),
        "queue", "list",
    )  # fmt: skip
    assert refused.returncode == 78, refused.stderr
    assert "speaks TLS" in refused.stderr and "--tls-ca FILE" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_tls_client_on_a_plaintext_cluster_is_told_to_drop_tls(
    tls_cluster: LocalCluster, shared_cluster3: LocalCluster
) -> None:
    """tls= against a cluster without tls = true: TlsError at once saying it does not speak
    TLS (threaded, asyncio, RawClient); the plaintext cluster serves on."""
    endpoint = shared_cluster3.endpoint("n1")
    with pytest.raises(TlsError, match="does not speak TLS"):
        Client([endpoint], shared_cluster3.key, tls=_ca(tls_cluster), connect_retry_s=30.0)

    async def connect() -> None:
        context = client_context(_ca(tls_cluster))
        async with AsyncClient([endpoint], shared_cluster3.key, tls=context, connect_retry_s=30.0):
            pass

    with pytest.raises(TlsError, match="does not speak TLS"):
        asyncio.run(connect())
    with pytest.raises(TlsError, match="does not speak TLS"):
        RawClient(endpoint, shared_cluster3.key, tls=_ca(tls_cluster))
    with shared_cluster3.client() as client:
        assert client.status()["id"] in shared_cluster3.config.node_ids()


def test_a_certificate_of_another_ca_is_refused(tls_cluster: LocalCluster, tmp_path: Path) -> None:
    """A client trusting another cluster's CA refuses the node's certificate (before sending its
    key); dialing a host the certificate does not name is refused too; the node logs each
    failed handshake once and serves on."""
    other = init_cluster(tmp_path / "Other", 3, tls=True)
    tls.ensure_certificates(tmp_path / "Other", other)
    endpoint = tls_cluster.endpoint("n3")
    before = len(_log_events(tls_cluster, "n3", "client_tls_failed"))
    with pytest.raises(TlsError, match="does not verify"):
        Client([endpoint], tls_cluster.key, tls=tmp_path / "Other" / "tls" / "ca.crt")
    port = endpoint.rpartition(":")[2]
    with pytest.raises(TlsError, match="not valid for 'localhost'"):
        Client([f"localhost:{port}"], tls_cluster.key, tls=_ca(tls_cluster))
    _wait_for_log(tls_cluster, "n3", "client_tls_failed", before + 2)
    with tls_cluster.client("n3", only=True) as client:
        assert client.status()["id"] == "n3"


def test_a_missing_ca_file_is_a_config_error_before_any_dial(tmp_path: Path) -> None:
    """tls= naming no file: ConfigError naming it; the CLI exits 78 without a traceback."""
    from cluster.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot read the cluster CA file"):
        Client(["127.0.0.1:1"], b"0" * 64, tls=tmp_path / "nope.crt")
    key = tmp_path / "client.key"
    key.write_text("0" * 64)
    key.chmod(0o600)
    refused = quorumq_cli(
        "--endpoints", "127.0.0.1:1", "--credentials", str(key),
        "--tls-ca", str(tmp_path / "nope.crt"), "queue", "list",
    )  # fmt: skip
    assert refused.returncode == 78, refused.stderr
    assert "nope.crt" in refused.stderr and "Traceback" not in refused.stderr


def test_the_client_finds_the_ca_where_cluster_start_writes_it(tmp_path: Path) -> None:
    """cluster.client.tls (no cryptography import) names the same CA file as cluster.tls."""
    from cluster.client.tls import data_dir_ca

    assert data_dir_ca(tmp_path, True) == tls.node_files(tmp_path, "n1").ca_cert
    assert data_dir_ca(tmp_path, False) is None
    with pytest.raises(TypeError, match="tls= takes"):
        client_context(b"ca.crt")  # type: ignore[arg-type]


# --- strangers, and the wire ------------------------------------------------------------------


def test_garbage_and_stalled_handshakes_do_not_stop_the_node(tls_cluster: LocalCluster) -> None:
    """While strangers hold connections in the middle of a TLS handshake (a ClientHello cut
    short, never finished) and another sends a record of garbage, a TLS client publishes and
    consumes on the same node; the garbage is logged once for its connection."""
    node = tls_cluster.leader()
    host, port = tls_cluster.endpoint(node).rsplit(":", 1)
    before = len(_log_events(tls_cluster, node, "client_tls_failed"))
    stalled = []
    for _ in range(20):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes, then silence
        stalled.append(sock)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as garbage:
            garbage.sendall(b"\x16\x03\x03\x00\x10" + b"\xff" * 16 + b"\0" * 100_000)
            with contextlib.suppress(OSError):
                while garbage.recv(65536):
                    pass  # the node's alert, then its close
        with tls_cluster.client(node, only=True) as client:
            client.declare_queue("after-strangers")
            with client.publisher("after-strangers", window=20) as publisher:
                publisher.publish_many(b"%d" % i for i in range(50))
                publisher.wait_for_confirms(timeout_s=30.0)
            overview = client.overview("after-strangers")
            assert overview is not None and overview.ready == 50
    finally:
        for sock in stalled:
            sock.close()
    _wait_for_log(tls_cluster, node, "client_tls_failed", before + 1)
    time.sleep(0.3)
    failed = _log_events(tls_cluster, node, "client_tls_failed")[before:]
    assert len({line["peer"] for line in failed}) == len(failed)  # once per connection


class _RecordingProxy:
    """A TCP proxy on 127.0.0.1 to one node that keeps every byte it forwards, both ways;
    `close` ends its threads."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
                with self._lock:
                    self._sockets += [client, upstream]
                for src, dst in ((client, upstream), (upstream, client)):
                    pump = threading.Thread(
                        target=self._pump, args=(src, dst), name="proxy-pump", daemon=True
                    )
                    with self._lock:
                        self._threads.append(pump)
                    pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self._lock:
                    self.seen += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop accepting, end every forwarded connection and join the threads (a shutdown
        wakes a thread blocked in accept or recv; a close alone does not, on Linux)."""
        with self._lock:
            sockets = [self.listener, *self._sockets]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)


@pytest.mark.parametrize("kind", ["tls", "plaintext"])
def test_no_body_crosses_the_wire_in_the_clear(
    kind: str, tls_cluster: LocalCluster, shared_cluster3: LocalCluster
) -> None:
    """Bytes recorded between client and node: the body marker is there without TLS (so the
    recording works) and nowhere with it, in either direction."""
    cluster = tls_cluster if kind == "tls" else shared_cluster3
    marker = b"SECRET-BODY-MARKER-%s" % kind.encode()
    leader = cluster.leader()
    proxy = _RecordingProxy(cluster.endpoint(leader))
    # the certificate names 127.0.0.1, which the proxy's address is too
    try:
        with Client(
            [proxy.endpoint], cluster.key, tls=cluster.tls, prefer_leader=False, reconnect=False
        ) as client:
            queue = f"wire-{kind}"
            client.declare_queue(queue)
            client.publish(queue, marker)
            message = client.get(queue)
            assert message is not None and message.body == marker
            message.ack()
    finally:
        proxy.close()
    assert len(proxy.seen) > 500  # the handshake, the publish, the get and their answers
    assert (marker in proxy.seen) is (kind == "plaintext")


def test_a_node_stops_cleanly_with_tls_sessions_open(tls_cluster: LocalCluster) -> None:
    """SIGTERM with a TLS client connected: the node ends the session (logged with its
    connection number) and stops (`node_stopped`); it serves again after a restart."""
    node = _follower(tls_cluster)[0]
    stopped_before = len(_log_events(tls_cluster, node, "node_stopped"))
    client = tls_cluster.client(node, only=True)
    try:
        assert client.status()["id"] == node
        number = client.connection_id.number
        tls_cluster.terminate(node)
        _wait_for_log(tls_cluster, node, "node_stopped", stopped_before + 1)
        events = _log_events(tls_cluster, node, "client_disconnected")
        assert number in [event["connection"] for event in events]
    finally:
        client.close()
        tls_cluster.restart(node)


# --- reconnects ------------------------------------------------------------------------------


def test_clients_follow_a_new_leader_over_tls(tls_cluster: LocalCluster) -> None:
    """The leader is killed under a TLS client: it reconnects (over TLS) to the new leader and
    its publishes go on; the node is restarted for the tests after this one."""
    old = tls_cluster.leader()
    with tls_cluster.client() as client:
        assert client.node == old
        client.declare_queue("tls-failover")
        with client.publisher("tls-failover", window=20) as publisher:
            publisher.publish_many(b"before-%d" % i for i in range(50))
            publisher.wait_for_confirms(timeout_s=30.0)
            tls_cluster.kill(old, signal.SIGKILL)
            publisher.publish_many(b"after-%d" % i for i in range(50))
            publisher.wait_for_confirms(timeout_s=30.0)
        assert client.node != old
        assert client.reconnects >= 1
        overview = client.overview("tls-failover")
        assert overview is not None and overview.ready == 100
    tls_cluster.restart(old)
