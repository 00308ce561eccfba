"""Machine v4 bodies through the replica (issue 32), on a real single-node pysyncobj group in
this process: a delivery of messages whose bodies are not cached waits for a read on a worker
thread (the loop keeps running), everything after it waits behind it in log order, and a body
the journal no longer holds is an error naming its index, never an empty message."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cluster.launcher import free_ports
from fifo import encode
from fifo.commands import (
    Checkout,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Dequeue,
    Enqueue,
    SimplePrefetch,
)
from fifo.effects import Deliver
from fifo.replies import CheckoutOk, DequeueOk, Ok
from raft.bodies import BodyCache, read_entry_bodies
from raft.entry import SUB_INDEX_SPAN, Entry, encode_entry
from raft.errors import EntryGoneError, SubmitError
from raft.node import RaftSettings
from raft.replica import Applied, Replica, Reply
from raft.replicated import InternalFailure

pytestmark = pytest.mark.slow
MINE = ConnectionId("n1", 7, 1)


def _settings(data_dir: Path) -> RaftSettings:
    return RaftSettings(
        node_id="n1",
        address=f"127.0.0.1:{free_ports(1)[0]}",
        peers={},
        data_dir=data_dir,
        password="secret-for-tests",
        supported_version=4,
        incarnation=7,
        election_timeout_ms=(300, 500),
    )


class Recorder:
    """Replies and effects in the order the replica hands them to the node."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def applied(self, applied: Applied) -> None:
        self.events.extend(("effect", effect) for effect in applied.effects)

    def reply_sink(self, name: str) -> Callable[[Reply], None]:
        def on_reply(reply: Reply) -> None:
            self.events.append((name, reply))

        return on_reply

    def delivered(self) -> list[bytes]:
        return [m.body for kind, e in self.events if isinstance(e, Deliver) for m in e.messages]


async def _until(check: Callable[[], bool], what: str) -> None:
    for _ in range(300):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _run(replica: Replica, recorder: Recorder, name: str, command: object) -> object:
    replica.propose(command, recorder.reply_sink(name))  # type: ignore[arg-type]
    await _until(lambda: any(kind == name for kind, _ in recorder.events), name)
    return next(reply for kind, reply in recorder.events if kind == name)


async def _v4_replica(data_dir: Path, recorder: Recorder) -> Replica:
    replica = Replica(_settings(data_dir), asyncio.get_running_loop(), recorder.applied,
                      lambda index: None)  # fmt: skip
    await _until(lambda: replica.role() == "leader", "leadership")
    upgraded: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    replica.propose_hello(lambda reply: None)
    replica.propose_upgrade(4, upgraded.set_result)
    assert await asyncio.wait_for(upgraded, 15) == Ok()
    return replica


@contextlib.asynccontextmanager
async def _v4_session(data_dir: Path) -> AsyncIterator[tuple[Replica, Recorder]]:
    """A leading single-node replica upgraded to v4, and what it hands over; shut down after."""
    recorder = Recorder()
    replica = await _v4_replica(data_dir, recorder)
    try:
        yield replica, recorder
    finally:
        replica.fail_pending(SubmitError("shutdown", "test"))
        replica.destroy()


async def _cold_delivery_scenario(data_dir: Path) -> None:
    async with _v4_session(data_dir) as (replica, recorder):
        await _run(replica, recorder, "declare", DeclareQueue("q"))
        for body in (b"a" * 100, b"b" * 200, b"c" * 300):
            reply = await _run(replica, recorder, f"publish {body[:1]!r}", Enqueue("q", body))
            assert reply == Ok()
        assert len(replica.bodies) == 0  # nothing delivered yet: nothing read back
        gate = threading.Event()
        readers: list[str] = []
        read_entry = replica._node.read_entry  # the journal read, held until the gate opens

        def held_read(raft_index: int) -> bytes:
            readers.append(threading.current_thread().name)
            gate.wait(10)
            return read_entry(raft_index)

        replica._node.read_entry = held_read  # type: ignore[method-assign]
        replica.propose(Checkout("q", ConsumerId("c", MINE), SimplePrefetch(10)),
                        recorder.reply_sink("checkout"))  # fmt: skip
        await _until(lambda: len(readers) > 0, "a read off the loop")
        # the three publish entries are pinned while read: a snapshot now retains them
        assert len(set(replica._node.pinned_indexes())) == 3
        replica.propose(Enqueue("q", b"d" * 400), recorder.reply_sink("publish d"))
        await asyncio.sleep(0.3)  # the loop runs while the read is held
        assert recorder.delivered() == []
        assert not any(kind in ("checkout", "publish d") for kind, _ in recorder.events)
        gate.set()
        await _until(lambda: len(recorder.delivered()) == 4, "the deliveries")
        assert recorder.delivered() == [b"a" * 100, b"b" * 200, b"c" * 300, b"d" * 400]
        assert not set(replica._node.pinned_indexes())
        kinds = [kind for kind, _ in recorder.events if kind in ("checkout", "publish d", "effect")]
        assert kinds[:2] == ["checkout", "effect"] and "publish d" in kinds[2:]  # log order
        assert isinstance(dict(recorder.events)["checkout"], CheckoutOk)
        assert readers and all(name.startswith("quorumq-bodies") for name in readers)
        assert replica.bodies_missing == 0


async def _delivery_beyond_the_cache_scenario(data_dir: Path) -> None:
    async with _v4_session(data_dir) as (replica, recorder):
        await _run(replica, recorder, "declare", DeclareQueue("q"))
        bodies = [bytes([65 + n]) * (n + 1) for n in range(13)]
        for n, body in enumerate(bodies):  # one entry each: four reads of four entries
            assert await _run(replica, recorder, f"publish {n}", Enqueue("q", body)) == Ok()
        replica.bodies = BodyCache(bodies_max=3)  # a delivery of 13 bodies, a cache of 3
        reply = await _run(replica, recorder, "checkout", Checkout(
            "q", ConsumerId("c", MINE), SimplePrefetch(100)))  # fmt: skip
        assert isinstance(reply, CheckoutOk)
        assert recorder.delivered() == bodies
        assert await _run(replica, recorder, "publish last", Enqueue("q", b"last")) == Ok()
        await _until(lambda: recorder.delivered()[-1:] == [b"last"], "the next delivery")
        assert replica.handovers_waiting() == 0 and not replica._fresh  # nothing kept after
        assert replica.bodies_missing == 0


async def _drained_scenario(data_dir: Path) -> None:
    async with _v4_session(data_dir) as (replica, recorder):
        await _run(replica, recorder, "declare", DeclareQueue("q"))
        for n in range(3):
            assert await _run(replica, recorder, f"publish {n}", Enqueue("q", b"%d" % n)) == Ok()
        replica.bodies.clear()
        getter = ConsumerId("g", MINE)
        for n in range(2):  # dequeued and settled at once: read back, cached, no longer held
            reply = await _run(replica, recorder, f"get {n}", Checkout("q", getter, Dequeue(True)))
            assert isinstance(reply, DequeueOk) and reply.message is not None
        cached = len(replica.bodies)
        assert cached >= 2
        assert replica.sweep() is False and len(replica.bodies) == cached  # one still held
        await _run(replica, recorder, "get 2", Checkout("q", getter, Dequeue(True)))
        assert replica.sweep() is False  # checked less than BODIES_DRAINED_CHECK_S ago
        replica._bodies_checked_at = -1e9
        assert replica.sweep() is True
        assert len(replica.bodies) == 0 and replica.bodies.bytes_held == 0
        assert replica.sweep() is False  # nothing cached: nothing to drop


async def _missing_body_scenario(data_dir: Path) -> None:
    async with _v4_session(data_dir) as (replica, recorder):
        await _run(replica, recorder, "declare", DeclareQueue("q"))
        await _run(replica, recorder, "publish", Enqueue("q", b"gone"))

        def gone(raft_index: int) -> bytes:
            raise EntryGoneError(raft_index, "compacted and not retained")

        replica._node.read_entry = gone  # type: ignore[method-assign]
        reply = await _run(replica, recorder, "get", Checkout("q", ConsumerId("g", MINE),
                                                             Dequeue(True)))  # fmt: skip
        assert isinstance(reply, InternalFailure)
        assert "is missing" in reply.message and "compacted and not retained" in reply.message
        assert replica.bodies_missing == 1
        await _run(replica, recorder, "publish 2", Enqueue("q", b"here"))
        del replica._node.read_entry  # the journal's read again
        reply = await _run(replica, recorder, "get 2", Checkout("q", ConsumerId("h", MINE),
                                                               Dequeue(True)))  # fmt: skip
        assert isinstance(reply, DequeueOk) and reply.message is not None
        assert reply.message.body == b"here"


def test_a_cold_delivery_is_read_off_the_loop_and_keeps_log_order(tmp_path: Path) -> None:
    """Bodies not cached are read on a worker thread; the checkout's reply, its deliveries and
    a later publish's reply and delivery come in log order once the read is done."""
    asyncio.run(_cold_delivery_scenario(tmp_path))


def test_a_delivery_of_more_bodies_than_the_cache_holds_is_handed_over(tmp_path: Path) -> None:
    """A checkout whose delivery needs more bodies than the cache keeps (a prefetch of 50,000
    over a backlog: the cache holds 16,384) is handed over once every body was read: the
    bodies read for it are kept until then, not evicted by the next read (which left the
    node reading forever, every later reply and delivery waiting behind it)."""
    asyncio.run(_delivery_beyond_the_cache_scenario(tmp_path))


def test_a_drained_node_drops_its_cached_bodies(tmp_path: Path) -> None:
    """Once the state holds no message, the sweep empties the body cache (it held a drained
    leader's resident set up by 16 MiB and more); not while a message is held."""
    asyncio.run(_drained_scenario(tmp_path))


def test_a_body_the_journal_lost_is_an_error_naming_its_index(tmp_path: Path) -> None:
    """A dequeue whose body cannot be read back gets an InternalFailure naming the index."""
    asyncio.run(_missing_body_scenario(tmp_path))


def test_an_entry_read_brings_every_body_it_holds() -> None:
    """One read of a group-committed entry caches all its bodies (a backlog drains with one
    read per entry); other commands of the entry bring nothing."""
    cmds = (encode(Enqueue("q", b"x")), encode(DeclareQueue("r")), encode(Enqueue("q", b"yy")))
    blob = encode_entry(Entry("cmds", 1, ("n1", 1, 1), cmds=cmds))
    assert read_entry_bodies(lambda index: blob, 7) == {
        7 * SUB_INDEX_SPAN: b"x", 7 * SUB_INDEX_SPAN + 2: b"yy"}  # fmt: skip


def test_the_body_cache_is_bounded_by_count_and_bytes() -> None:
    """The least recently used bodies leave first past either limit."""
    cache = BodyCache(bodies_max=3, bytes_max=10)
    cache.put_all({1: b"aaaa", 2: b"bbbb"})
    assert cache.get(1) == b"aaaa"  # 1 is now the most recent
    cache.put_all({3: b"cccc"})  # 12 bytes > 10: the least recent (2) goes
    assert (cache.has(1), cache.has(2), cache.has(3)) == (True, False, True)
    cache.put_all({4: b"d", 5: b"e"})  # 4 bodies > 3: 1 goes
    assert sorted(r for r in range(6) if cache.has(r)) == [3, 4, 5]
    assert cache.bytes_held == 6
    assert cache.missing_entries([3, 2 * SUB_INDEX_SPAN, 2 * SUB_INDEX_SPAN + 1, 9]) == [2, 0]
