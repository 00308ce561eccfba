"""The node's side of the `oks` feature (issue 14): a client whose hello lists it gets its `Ok`
answers gathered into `oks` frames, in order with its other replies; any other client gets one
reply frame per command, as before. Raw sockets against a real node."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import fifo
from cluster import protocol
from cluster.client._wire import encode_enqueue
from cluster.config import read_client_key
from cluster.launcher import LocalCluster
from fifo.commands import DeclareQueue
from fifo.replies import Ok

pytestmark = pytest.mark.cluster
PUBLISHES = 200


def _connect(cluster: LocalCluster, features: tuple[str, ...]) -> tuple[socket.socket, Any]:
    leader = cluster.leader()
    host, port = cluster.config.endpoints()[leader].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10.0)
    key = read_client_key(cluster.data_dir / "client.key")
    challenge = protocol.recv_frame(sock)
    protocol.send_frame(sock, protocol.hello(key, challenge["nonce"], "oks-test", features))
    welcome = protocol.recv_frame(sock)
    assert welcome["op"] == protocol.WELCOME, welcome
    return sock, welcome


def _publish_and_collect(sock: socket.socket, queue: str) -> list[dict[str, Any]]:
    """Declare `queue` (a DeclareOk reply), then PUBLISHES enqueues in one write, then another
    declare; every frame the node sends until all of them are answered."""
    frames = [protocol.command(1, fifo.encode(DeclareQueue(queue)))]
    frames += [
        protocol.command(1 + n, encode_enqueue(queue, b"m%d" % n, "oks-test", n, None))
        for n in range(1, PUBLISHES + 1)
    ]
    frames.append(protocol.command(PUBLISHES + 2, fifo.encode(DeclareQueue(queue))))
    sock.sendall(b"".join(protocol.encode_frame(frame) for frame in frames))
    answered: set[int] = set()
    received: list[dict[str, Any]] = []
    while len(answered) < PUBLISHES + 2:
        frame = protocol.recv_frame(sock)
        received.append(frame)
        if frame["op"] == protocol.OKS:
            answered.update(frame["ids"])
        elif frame["op"] == protocol.REPLY:
            answered.add(frame["id"])
    assert answered == set(range(1, PUBLISHES + 3))
    return received


def test_a_client_that_lists_oks_gets_its_ok_answers_gathered_in_order(
    shared_cluster3: LocalCluster,
) -> None:
    sock, welcome = _connect(shared_cluster3, (protocol.OKS_FEATURE, "no-such-feature"))
    with sock:
        assert protocol.features_of(welcome) == {protocol.OKS_FEATURE}
        received = _publish_and_collect(sock, "oks-listed")
    replies = [frame for frame in received if frame["op"] == protocol.REPLY]
    assert [frame["id"] for frame in replies] == [1, PUBLISHES + 2]  # only the DeclareOks
    oks = [frame for frame in received if frame["op"] == protocol.OKS]
    ids = [request_id for frame in oks for request_id in frame["ids"]]
    assert ids == list(range(2, PUBLISHES + 2))  # each once, in the order they were sent
    assert len(oks) < PUBLISHES  # gathered: fewer frames than answers
    order = [frame["op"] for frame in received]  # the last declare's reply comes after every Ok
    assert order[0] == protocol.REPLY and order[-1] == protocol.REPLY


def test_a_client_that_lists_no_features_gets_one_reply_per_command(
    shared_cluster3: LocalCluster,
) -> None:
    sock, welcome = _connect(shared_cluster3, ())
    with sock:
        assert protocol.features_of(welcome) == frozenset()
        received = _publish_and_collect(sock, "oks-unlisted")
    assert all(frame["op"] == protocol.REPLY for frame in received), received[:3]
    assert [frame["id"] for frame in received][1:-1] == list(range(2, PUBLISHES + 2))
    assert all(isinstance(fifo.decode(f["reply"]), Ok) for f in received[1:-1])
