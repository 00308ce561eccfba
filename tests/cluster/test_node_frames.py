"""The node's client port: handshake, bad frames, limits, connection binding, forwarding."""

from __future__ import annotations

import socket
import struct
import time

import cbor2
import pytest

import fifo
from cluster import protocol
from cluster.errors import ProtocolError
from cluster.launcher import LocalCluster
from cluster.rawclient import RawClient
from fifo.codec import TAG_BASE
from fifo.commands import (
    Checkout,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    NodeDown,
    SimplePrefetch,
)
from fifo.replies import CheckoutOk, DeclareOk, Ok

pytestmark = pytest.mark.cluster


def digests(cluster: LocalCluster) -> set[tuple[int, str]]:
    """The (last applied, digest) pairs once every node agrees and nothing moved for 0.5 s."""
    while True:
        first = {(s["last_applied"], s["digest"]) for s in cluster.converged().values()}
        time.sleep(0.5)
        second = {(s["last_applied"], s["digest"]) for s in cluster.converged().values()}
        if first == second:
            return second


def raw_frame(client: RawClient, body: bytes) -> dict[str, object]:
    client.sock.sendall(struct.pack(">I", len(body)) + body)
    return protocol.recv_frame(client.sock)


def test_malformed_frames_get_an_error_and_change_nothing(shared_cluster3: LocalCluster) -> None:
    """Non-CBOR, non-map, unknown op, bad ids and undecodable or internal commands are refused."""
    client = shared_cluster3.raw_client("n1")
    client.command(DeclareQueue("frames"))
    before = digests(shared_cluster3)
    cases = [
        (b"\xff\xfe\xfd", protocol.BAD_FRAME),
        (cbor2.dumps([1, 2, 3]), protocol.BAD_FRAME),
        (cbor2.dumps({"no": "op"}), protocol.BAD_FRAME),
        (cbor2.dumps({"op": "teleport", "id": 1}), protocol.UNKNOWN_OP),
        (cbor2.dumps({"op": "command", "id": "x", "cmd": b""}), protocol.BAD_FRAME),
        (cbor2.dumps({"op": "command", "id": 2, "cmd": b"\x00garbage"}), protocol.BAD_COMMAND),
        (cbor2.dumps({"op": "command", "id": 3, "cmd": "text"}), protocol.BAD_COMMAND),
        (
            cbor2.dumps({"op": "command", "id": 4, "cmd": fifo.encode(NodeDown("n2"))}),
            "bad_command",
        ),
        (cbor2.dumps({"op": "query", "id": 5, "query": "nope", "args": {}}), protocol.BAD_REQUEST),
        (
            cbor2.dumps(
                {
                    "op": "query",
                    "id": 6,
                    "query": "messages",
                    "args": {"queue": "frames", "limit": 10**9},
                }
            ),
            protocol.BAD_REQUEST,
        ),
    ]
    for body, code in cases:
        frame = raw_frame(client, body)
        assert frame["op"] == "error" and frame["code"] == code, (body, frame)
        assert frame["message"]
    assert client.query("queues") == ["frames"]  # the connection is still usable
    assert digests(shared_cluster3) == before
    client.close()


def test_frames_too_costly_to_decode_are_refused_before_decoding(
    shared_cluster3: LocalCluster,
) -> None:
    """A frame (over 16 KiB) or a command blob (over 4 KiB) holding more CBOR items than any
    request needs (a 16 MiB array of zeros took the loop 0.6 s, as a command blob 3.2 s) is
    refused unread;
    a publish of a large body (one byte string) goes through; the connection stays usable."""
    client = shared_cluster3.raw_client("n3")
    client.command(DeclareQueue("costly"))
    before = digests(shared_cluster3)
    many = [0] * 200_000
    frame = raw_frame(client, cbor2.dumps({"op": "query", "id": 7, "query": "queues", "x": many}))
    assert frame["op"] == "error" and frame["code"] == protocol.BAD_FRAME, frame
    assert "CBOR items" in str(frame["message"])
    blob = cbor2.dumps(cbor2.CBORTag(TAG_BASE, many))  # shaped as a command, costly inside
    frame = raw_frame(client, cbor2.dumps({"op": "command", "id": 8, "cmd": blob}))
    assert frame["op"] == "error" and frame["code"] == protocol.BAD_COMMAND, frame
    assert frame["id"] == 8 and "CBOR items" in str(frame["message"])
    # a list of things at the top (fifo walks those in Python: 32 KiB of lists took 0.1 s)
    frame = raw_frame(client, cbor2.dumps({"op": "command", "id": 9, "cmd": cbor2.dumps([[]])}))
    assert frame["code"] == protocol.BAD_COMMAND and "one tagged" in str(frame["message"])
    assert digests(shared_cluster3) == before
    assert client.command(Enqueue("costly", b"x" * 1_000_000)) == Ok()
    assert client.query("overview", queue="costly")["total"] == 1
    client.close()


def test_an_oversized_frame_is_refused_and_the_connection_closed(
    shared_cluster3: LocalCluster,
) -> None:
    """A header announcing more than frame_bytes_max gets frame_too_large, then EOF."""
    client = shared_cluster3.raw_client("n2")
    before = digests(shared_cluster3)
    client.sock.sendall(struct.pack(">I", protocol.FRAME_BYTES_MAX_DEFAULT + 1))
    frame = protocol.recv_frame(client.sock)
    assert frame["code"] == protocol.FRAME_TOO_LARGE
    assert client.sock.recv(1) == b""
    assert digests(shared_cluster3) == before


def test_wrong_credentials_are_refused(shared_cluster3: LocalCluster) -> None:
    """A hello with a proof from another key gets auth_failed and the socket is closed."""
    address = shared_cluster3.config.node("n1").client_address
    with pytest.raises(ProtocolError) as info:
        RawClient(address, b"0" * 64)
    assert info.value.code == protocol.AUTH_FAILED
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    protocol.recv_frame(sock)  # the challenge
    protocol.send_frame(sock, protocol.query(1, "status"))
    assert protocol.recv_frame(sock)["code"] == protocol.NOT_AUTHENTICATED
    assert sock.recv(1) == b""
    sock.close()


def test_commands_work_through_a_follower_and_are_bound_to_the_caller(
    shared_cluster3: LocalCluster,
) -> None:
    """A follower forwards through the log; connection fields name the caller, whatever sent."""
    leader = shared_cluster3.leader()
    follower = next(n for n in ("n1", "n2", "n3") if n != leader)
    client = shared_cluster3.raw_client(follower)
    forged = ConnectionId(leader, 1, 999)
    assert isinstance(client.command(DeclareQueue("bound")), DeclareOk)
    assert client.command(Enqueue("bound", b"x", connection=forged)) == Ok()
    reply = client.command(Checkout("bound", ConsumerId("c", forged), SimplePrefetch(1)))
    assert isinstance(reply, CheckoutOk)
    [consumer] = client.query("consumers", queue="bound")["bound"]
    assert consumer["connection"]["node"] == follower
    deliveries = client.read_effects(1)
    assert deliveries and deliveries[0].connection == client.connection
    client.close()


def test_pipelined_commands_are_group_committed_with_one_reply_each(
    shared_cluster3: LocalCluster,
) -> None:
    """300 pipelined publishes: one reply per id, in far fewer log entries than commands."""
    leader = shared_cluster3.leader()
    client = shared_cluster3.raw_client(leader)
    client.command(DeclareQueue("batched"))
    before = client.query("status")["commit_index"]
    frames = [
        protocol.encode_frame(
            protocol.command(1000 + i, fifo.encode(Enqueue("batched", b"%d" % i)))
        )
        for i in range(300)
    ]
    client.sock.sendall(b"".join(frames))
    replies: dict[int, object] = {}
    while len(replies) < 300:
        frame = protocol.recv_frame(client.sock)
        assert frame["op"] == "reply", frame
        replies[frame["id"]] = fifo.decode(frame["reply"])
    assert sorted(replies) == list(range(1000, 1300))
    assert set(replies.values()) == {Ok()}
    entries = client.query("status")["commit_index"] - before
    assert 1 <= entries <= 30  # group commit: ~10+ commands per entry at the very least
    assert client.query("overview", queue="batched")["total"] == 300
    client.close()
