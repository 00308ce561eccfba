"""The CBOR codec: exact round trips, frozen tags, snapshots, digests and bad bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cbor2
import pytest

import fifo
from fifo import codec
from fifo import commands as c
from fifo import effects as e
from fifo import replies as r
from fifo.replies import Error

CONN = c.ConnectionId("n1", 3, 7)
CID = c.ConsumerId("tag", CONN)
SAMPLES: list[object] = [
    CONN, CID, c.QueueConfig(True, 3, 10, 100, "reject_publish", 5, "dlq", 9, 8),
    c.SimplePrefetch(5), c.Credited(7), c.Cancel(), c.Remove(), c.Dequeue(False),
    c.DeclareQueue("q", c.QueueConfig()), c.DeleteQueue("q"), c.UpdateConfig("q", c.QueueConfig()),
    c.Enqueue("q", b"\x00body", "p", 4, CONN, 10), c.RegisterEnqueuer("q", "p", CONN),
    c.Checkout("q", CID, c.Credited(1), 2, 300), c.Settle("q", 5, (1, 2)),
    c.Return("q", CID, (3,)), c.Discard("q", 5, ()),
    c.Modify("q", 5, (1,), True, False, (("a", "b"), ("n", -4))),
    c.Credit("q", 5, 10, 2**32 - 1, True), c.RenewLocks("q", CID, (0,)), c.Purge("q"),
    c.EvalConsumerTimeouts("q", (5, CID)), c.ConsumerDisconnectedTimeout("q", 5), c.Expire("q"),
    c.ConnectionDown(CONN, "noconnection"), c.NodeDown("n1"), c.NodeUp("n1"),
    fifo.Meta(10, 2, 12345, 2),
    r.Ok(), r.Error("unknown_queue", "no"), r.NotEnqueued(3), r.RejectPublish(),
    r.DeclareOk(True), r.DeleteOk(4), r.CheckoutOk(CID, 1, 2, 3, True, 4), r.CancelOk(None, 0),
    r.DequeuedMessage(2, b"y", 0, False), r.DequeueOk(r.DequeuedMessage(0, b"x", 1, True), 3, 9),
    r.PurgeOk(2), e.Delivery(4, b"z", True, 1, (("k", 1),)),
    e.Deliver(CONN, "q", "t", 5, (e.Delivery(0, b"a", False, 0), e.Delivery(1, b"b", True, 2))),
    e.CreditReply(CONN, "q", "t", 5, 1, 2, 3, False, True),
    e.QueueStatus(CONN, "q", "p", "go"), e.Released(CONN, "q", "t", CID, (1, 2), "timeout"),
    e.ConsumerUpdate(CONN, "q", "t", 5, True, "single_active"),
    e.ConsumerCancelled(CONN, "q", "t", 5, "down"), e.DeadLettered("q", "maxlen", 3, None),
    c.GroupConfig(), c.DeclareGroupedQueue("q", c.QueueConfig(), c.GroupConfig("k", "exclusive")),
    c.AnnotatedEnqueue("q", b"b", annotations=(("k", 1),)), c.PurgeGroup("q", None),
    c.DeclarePartitionedQueue("p", c.QueueConfig(single_active_consumer=True), 4),
    c.JoinGroup("p", CID, c.Credited(0), group="g", member="m"),
    c.LeaveGroup("p", CID, c.Cancel(), group="g", member="m", epoch=2), r.JoinGroupOk(1, 4),
    e.GroupAssigned(CONN, "p.0", "t", 5, True, "single_active", "g", "m", 1),
    e.GroupRevoked(CONN, "p.0", "t", 5, False, "waiting", "g", "m", 2),
    e.RefDelivery(1, 3 * 1024, 5, False, 0),
    e.RefDeliver(CONN, "q", "t", 5,
                 (e.Delivery(0, b"a", False, 0), e.RefDelivery(1, 1025, 2, True, 1))),
    r.RefDequeuedMessage(0, 2048, 9, 0, False),
    r.RefDequeueOk(r.RefDequeuedMessage(0, 2049, 1, 1, True), 0, None),
    c.BoundSettle("q", 5, (1, 2), CONN), c.BoundReturn("q", CID, (3,), CONN),
    c.BoundDiscard("q", 5, (), None), c.BoundModify("q", 5, (1,), True, False, (), CONN),
    c.BoundRenewLocks("q", CID, (0,), CONN),
    c.DeclareExchange("x"), c.DeleteExchange("x"), c.BindQueue("q", "x"),
    c.UnbindQueue("q", "x", "k", (("x-match", "any"),)),
    c.PublishToExchange("", "q", b"m", (("h", "v"),), True, None), r.Routed(()),
    r.Unroutable("x", ""),
    c.DeclareExchange("x", "fanout", False, True, True), c.BindExchange("y", "x"),
    c.UnbindExchange("y", "x", "k", (("x-match", "any"),)),
]  # fmt: skip


@pytest.mark.parametrize("obj", SAMPLES, ids=[type(s).__name__ for s in SAMPLES])
def test_round_trip_is_exact(obj: object) -> None:
    """Every contract class decodes to an equal object of the same class."""
    back = fifo.decode(fifo.encode(obj))
    assert back == obj and type(back) is type(obj)


def test_every_class_has_a_sample() -> None:
    """A class added to the tag table without a round-trip sample fails here."""
    assert {type(s) for s in SAMPLES} == set(codec.CLASSES)


def test_tags_are_frozen() -> None:
    """Tag numbers never move: existing logs and snapshots must stay decodable."""
    assert codec.CODEC.tag_by_class[c.ConnectionId] == 71_000
    assert codec.CODEC.tag_by_class[c.Enqueue] == 71_011
    assert codec.CODEC.tag_by_class[fifo.Meta] == 71_027
    assert codec.CODEC.tag_by_class[e.DeadLettered] == 71_046


def test_lists_of_objects_round_trip() -> None:
    """A batch (list) of commands encodes and decodes as a list."""
    batch = [c.Purge("a"), c.NodeUp("n")]
    assert fifo.decode(fifo.encode(batch)) == batch


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xff",
        cbor2.dumps(cbor2.CBORTag(99_999, [1])),
        cbor2.dumps(cbor2.CBORTag(71_011, ["q"])),
        cbor2.dumps(cbor2.CBORTag(71_011, "q")),
        b"\x9f" * 500,
    ],
)
def test_bad_bytes_raise_codec_error(data: bytes) -> None:
    """Malformed input, unknown tags and wrong field counts raise CodecError only."""
    with pytest.raises(fifo.CodecError):
        fifo.decode(data)


def test_decode_rejects_non_bytes() -> None:
    """decode takes bytes."""
    with pytest.raises(fifo.CodecError):
        fifo.decode("text")  # type: ignore[arg-type]


def test_encode_rejects_unknown_classes() -> None:
    """Only contract classes (and plain CBOR values) can be encoded."""
    with pytest.raises(fifo.CodecError):
        fifo.encode(object())


def busy_state(version: int) -> fifo.State:
    """A state with queues, consumers, enqueuers, returned and checked-out messages."""
    s = fifo.init_state(version)
    log: list[object] = [
        c.DeclareQueue("q", c.QueueConfig(message_ttl_ms=1000)),
        c.DeclareQueue("s", c.QueueConfig(single_active_consumer=True)),
        c.Checkout("q", CID, c.SimplePrefetch(2)),
        c.Checkout("s", c.ConsumerId("a", CONN), c.Credited(3)),
        c.Checkout("s", c.ConsumerId("b", CONN), c.SimplePrefetch(1), priority=2),
        c.Enqueue("q", b"1", "p", 1, CONN), c.Enqueue("q", b"2", "p", 2, CONN),
        c.Enqueue("q", b"3"), c.Enqueue("s", b"4"), c.Return("q", CID, (0,)),
        c.ConnectionDown(c.ConnectionId("n9", 1, 1), "noconnection"),
    ]  # fmt: skip
    for i, cmd in enumerate(log, 1):
        reply, _ = fifo.apply(fifo.Meta(i, 1, 100 * i, version), cmd, s)
        assert not isinstance(reply, Error), (cmd, reply)
    return s


@pytest.mark.parametrize("version", [1, 2])
def test_snapshot_restore_keeps_the_digest(version: int) -> None:
    """restore(snapshot(s)) has the same digest and behaves the same afterwards."""
    s = busy_state(version)
    copy = fifo.restore(fifo.snapshot(s))
    assert fifo.digest(copy) == fifo.digest(s)
    assert fifo.state_version(copy) == version
    more = c.Settle("q", CID, (1, 2))
    out1 = fifo.apply(fifo.Meta(50, 1, 9000, version), more, s)
    out2 = fifo.apply(fifo.Meta(50, 1, 9000, version), more, copy)
    assert out1 == out2 and fifo.digest(s) == fifo.digest(copy)


def test_restore_rejects_garbage() -> None:
    """Snapshots are checked: garbage raises CodecError."""
    for data in (b"", b"\x80", cbor2.dumps([99, 1, 0, []]), cbor2.dumps([1, 1, 0, [[1]]])):
        with pytest.raises(fifo.CodecError):
            fifo.restore(data)


def test_digest_is_independent_of_hash_seed() -> None:
    """The same log gives the same digest in processes with different PYTHONHASHSEED."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_codec as t; "
        "print(__import__('fifo').digest(t.busy_state(2)))"
    )
    here = str(Path(__file__).parent)
    digests = {
        subprocess.run(
            [sys.executable, "-c", code, here],
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }  # fmt: skip
    assert len(digests) == 1 and len(digests.pop()) == 64
