"""raft.transport over TLS: two PeerConnections on loopback driven by a real pysyncobj poller.

The TLS handshake runs non-blocking before the secret's handshake; frames pass both ways, also
when a read event's budget stops inside a TLS record (bytes the poller cannot see); a peer
without TLS, with another CA's certificate, or for another host is refused and logged once.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE
from structlog.testing import capture_logs

from cluster import tls
from cluster.launcher import init_cluster
from raft import transport
from raft.transport import PeerConnection

DIALER, LISTENER = "127.0.0.1:1001", "127.0.0.1:1002"
KEY = transport.cluster_key("secret-for-tls-tests")
BUFFER_BYTES = 2**20


def contexts(root: Path, name: str) -> tls.PeerContexts:
    """n1's contexts of a fresh TLS cluster called `name` (one CA per name)."""
    config = init_cluster(root / name, 2, tls=True)
    tls.ensure_certificates(root / name, config)
    made = tls.node_peer_contexts(root / name, config, "n1")
    assert made is not None
    return made


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> tls.PeerContexts:
    return contexts(tmp_path_factory.mktemp("tls"), "ours")


@dataclass
class Pair:
    """A dialer and the connection its dial was accepted into, on one poller."""

    poller: Any
    dialer: PeerConnection
    listener: PeerConnection | None = None
    to_dialer: list[Any] = field(default_factory=list)
    to_listener: list[Any] = field(default_factory=list)

    def drive(self, until: Callable[[], bool], seconds: float = 10.0) -> bool:
        """Poll (and tick the deadlines, as the transport does) until `until()` or timeout."""
        deadline = monotonic_time() + seconds
        while not until():
            if monotonic_time() > deadline:
                return False
            self.poller.poll(0.01)
            now = monotonic_time()
            for conn in (self.dialer, self.listener):
                if conn is not None:
                    conn.check_deadlines(now)
        return True

    def open(self) -> bool:
        """Both sides past both handshakes."""
        listener = self.listener
        return (
            self.dialer.state == CONNECTION_STATE.CONNECTED
            and listener is not None
            and listener.peer_address == DIALER
            and listener._phase == transport._OPEN
        )

    def close(self) -> None:
        self.dialer.disconnect()
        if self.listener is not None:
            self.listener.disconnect()


@contextmanager
def connect(
    dialer_ctx: ssl.SSLContext | None,
    listener_ctx: ssl.SSLContext | None,
    hostname: str = "127.0.0.1",
) -> Iterator[Pair]:
    poller = createPoller("auto")
    server = socket.create_server(("127.0.0.1", 0))
    dialer = PeerConnection(
        poller, KEY, DIALER, timeout=5.0, send_buffer=BUFFER_BYTES, recv_buffer=BUFFER_BYTES,
        ssl_context=dialer_ctx, server_hostname=hostname,
    )  # fmt: skip
    pair = Pair(poller, dialer)
    dialer.setOnMessageReceivedCallback(pair.to_dialer.append)
    assert dialer.connect("127.0.0.1", server.getsockname()[1])
    sock, _ = server.accept()
    server.close()
    sock.setblocking(False)
    pair.listener = PeerConnection(
        poller, KEY, LISTENER, timeout=5.0, send_buffer=BUFFER_BYTES, recv_buffer=BUFFER_BYTES,
        sock=sock, is_member=lambda address: address == DIALER, ssl_context=listener_ctx,
    )  # fmt: skip
    pair.listener.setOnMessageReceivedCallback(pair.to_listener.append)
    try:
        yield pair
    finally:
        pair.close()


def _events(logs: list[Any], name: str) -> list[Any]:
    return [entry for entry in logs if entry["event"] == name]


def test_frames_pass_both_ways_over_tls_13(ours: tls.PeerContexts) -> None:
    """The TLS handshake, then the secret's, then messages both ways on a TLS 1.3 socket."""
    with connect(ours.client, ours.server) as pair:
        assert pair.drive(pair.open)
        assert isinstance(pair.dialer._sock, ssl.SSLSocket)
        assert pair.dialer._sock.version() == "TLSv1.3"
        pair.dialer.send({"type": "ping", "n": 1})
        assert pair.listener is not None
        pair.listener.send({"type": "pong", "n": 2})
        assert pair.drive(lambda: bool(pair.to_listener and pair.to_dialer))
        assert pair.to_listener == [{"type": "ping", "n": 1}]
        assert pair.to_dialer == [{"type": "pong", "n": 2}]


def test_bytes_left_in_tls_when_a_read_budget_runs_out_are_read_on_the_next_tick(
    ours: tls.PeerContexts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read event stops at its budget inside a TLS record; the rest is decrypted already and
    no poll event will announce it: the tick reads it (else the message would wait forever)."""
    monkeypatch.setattr(transport, "READ_BYTES_PER_EVENT", 1000)
    with connect(ours.client, ours.server) as pair:
        assert pair.drive(pair.open)
        blob = bytes(range(256)) * 40  # one 10 KiB frame: one TLS record, 10 read budgets
        pair.dialer.send({"type": "blob", "data": blob})
        assert pair.drive(lambda: bool(pair.to_listener), seconds=5.0)
        assert pair.to_listener == [{"type": "blob", "data": blob}]


def test_large_frames_pass_over_tls(ours: tls.PeerContexts) -> None:
    """Three 3 MiB frames (larger than a socket buffer and a read budget) arrive whole."""
    with connect(ours.client, ours.server) as pair:
        assert pair.drive(pair.open)
        blobs = [bytes([i]) * (3 * 2**20) for i in range(3)]
        for blob in blobs:
            pair.dialer.send({"type": "blob", "data": blob})
        assert pair.drive(lambda: len(pair.to_listener) == 3, seconds=30.0)
        assert [message["data"] for message in pair.to_listener] == blobs


def test_a_dialer_without_tls_is_refused_and_logged_once(ours: tls.PeerContexts) -> None:
    """A plain HELLO to a TLS listener: refused at the TLS handshake, one log line."""
    with capture_logs() as logs, connect(None, ours.server) as pair:
        assert pair.drive(
            lambda: (
                pair.listener is not None and pair.listener.state == CONNECTION_STATE.DISCONNECTED
            )
        )
        assert pair.drive(lambda: pair.dialer.state == CONNECTION_STATE.DISCONNECTED)
    refused = _events(logs, "peer_refused")
    assert [entry["reason"] for entry in refused] == ["TLS handshake failed"]


def test_a_tls_dialer_to_a_plain_listener_is_told_what_it_speaks(ours: tls.PeerContexts) -> None:
    """The plain side names the mistake instead of 'not the quorumq raft protocol'."""
    with capture_logs() as logs, connect(ours.client, None) as pair:
        assert pair.drive(
            lambda: (
                pair.listener is not None and pair.listener.state == CONNECTION_STATE.DISCONNECTED
            )
        )
    refused = _events(logs, "peer_refused")
    assert refused and "speaks TLS" in refused[0]["reason"]


def test_a_certificate_from_another_ca_is_refused_by_both_sides(
    ours: tls.PeerContexts, tmp_path: Path
) -> None:
    """Another cluster's node can neither dial nor be dialed; nothing reaches a message."""
    theirs = contexts(tmp_path, "theirs")
    for dialer_ctx, listener_ctx in ((theirs.client, ours.server), (ours.client, theirs.server)):
        with capture_logs() as logs, connect(dialer_ctx, listener_ctx) as pair:
            assert pair.drive(lambda: pair.dialer.state == CONNECTION_STATE.DISCONNECTED)
            assert pair.drive(
                lambda: (
                    pair.listener is not None
                    and pair.listener.state == CONNECTION_STATE.DISCONNECTED
                )
            )
            assert not pair.to_listener and not pair.to_dialer
        assert _events(logs, "peer_refused"), logs


def test_a_dialer_checks_the_host_in_the_listeners_certificate(ours: tls.PeerContexts) -> None:
    """Dialing 127.0.0.1 while expecting another host: the certificate does not match."""
    with (
        capture_logs() as logs,
        connect(ours.client, ours.server, hostname="127.0.0.2") as pair,
    ):
        assert pair.drive(lambda: pair.dialer.state == CONNECTION_STATE.DISCONNECTED)
    errors = [entry["error"] for entry in _events(logs, "peer_refused")]
    assert any("127.0.0.2" in error or "mismatch" in error for error in errors), errors


def test_a_silent_connection_to_a_tls_listener_is_closed_at_the_handshake_deadline(
    ours: tls.PeerContexts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TCP connection that never starts TLS is refused after AUTH_TIMEOUT_S, logged once."""
    monkeypatch.setattr(transport, "AUTH_TIMEOUT_S", 0.3)
    poller = createPoller("auto")
    server = socket.create_server(("127.0.0.1", 0))
    with socket.create_connection(server.getsockname(), timeout=5):
        sock, _ = server.accept()
        sock.setblocking(False)
        with capture_logs() as logs:
            listener = PeerConnection(
                poller, KEY, LISTENER, timeout=5.0, send_buffer=BUFFER_BYTES,
                recv_buffer=BUFFER_BYTES, sock=sock, is_member=lambda _a: True,
                ssl_context=ours.server,
            )  # fmt: skip
            pair = Pair(poller, listener)
            assert pair.drive(lambda: listener.state == CONNECTION_STATE.DISCONNECTED, 5.0)
    server.close()
    assert [entry["reason"] for entry in _events(logs, "peer_refused")] == ["no handshake"]
