"""Clients that misbehave on purpose: a flood of stalled TLS handshakes does not keep honest
clients out, and a client that opens too many connections is refused beyond the node's cap with
a clear, retryable error while the node keeps serving (and keeps its own files writable)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from cluster.client.errors import TlsError, Unavailable
from cluster.client.tls import handshake_failed
from cluster.launcher import LocalCluster

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
