"""Unauthenticated connections are bounded (issue 12): a hello is read only up to a few KiB, the
handshake has a deadline, and only so many connections may wait to authenticate at once."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from cluster import protocol
from cluster.launcher import LocalCluster, init_cluster
from cluster.node import session
from fifo.commands import DeclareQueue
from fifo.replies import DeclareOk

pytestmark = pytest.mark.cluster


def _dial(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    assert protocol.recv_frame(sock)["op"] == protocol.CHALLENGE
    return sock


def _closed(sock: socket.socket) -> bool:
    try:
        while True:
            frame = protocol.recv_frame(sock)
            assert frame["op"] == protocol.ERROR
    except (ConnectionError, OSError):
        return True


def test_unauthenticated_connections_are_bounded(tmp_path: Path) -> None:
    cfg = init_cluster(tmp_path / "D", nodes=1)
    cluster = LocalCluster(tmp_path / "D", cfg)
    address = cfg.node("n1").client_address
    try:
        cluster.start_node("n1")
        cluster.raw_client("n1").close()  # up
        # a hello claiming more than HELLO_BYTES_MAX is refused before any of it is read
        big = _dial(address)
        big.sendall(protocol.HEADER.pack(session.HELLO_BYTES_MAX + 1))
        frame = protocol.recv_frame(big)
        assert frame["op"] == protocol.ERROR and frame["code"] == protocol.FRAME_TOO_LARGE
        assert _closed(big)
        # silent connections: at most PENDING_HANDSHAKES_MAX wait; the next is refused at once
        idle = [_dial(address) for _ in range(session.PENDING_HANDSHAKES_MAX)]
        host, port = address.rsplit(":", 1)
        extra = socket.create_connection((host, int(port)), timeout=10)
        frame = protocol.recv_frame(extra)
        assert frame["op"] == protocol.ERROR and frame["code"] == protocol.UNAVAILABLE
        extra.close()
        # the deadline frees them; an authenticated client then connects as usual
        started = time.monotonic()
        assert all(_closed(sock) for sock in idle)
        assert time.monotonic() - started < session.HELLO_TIMEOUT_S + 5
        for sock in idle:
            sock.close()
        client = cluster.raw_client("n1")
        assert client.command(DeclareQueue("after")) == DeclareOk(created=True)
        client.close()
    finally:
        cluster.stop()
