"""Machine v3: publishes to a partitioned queue's base name are routed to its partitions (by key
or round robin) with the publisher's dedup held over the whole partitioned queue; the base is
deleted as a whole. The fuzzer's routing invariants are shown to fail on planted bugs."""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fifo
import fifo.fuzz
from fifo.commands import (
    AnnotatedEnqueue,
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    DeclareGroupedQueue,
    DeclarePartitionedQueue,
    DeclareQueue,
    DeleteQueue,
    Discard,
    Enqueue,
    JoinGroup,
    Purge,
    QueueConfig,
    RegisterEnqueuer,
    SimplePrefetch,
    UpdateConfig,
)
from fifo.effects import ConsumerCancelled, DeadLettered
from fifo.meta import Meta
from fifo.replies import DeclareOk, DeleteOk, Error, NotEnqueued, Ok
from fifo.state import State
from fifo.v3 import routing

SAC = QueueConfig(single_active_consumer=True)
CONN = ConnectionId("n1", 1, 7)


class Log:
    """A v3 state and the next log index."""

    def __init__(self) -> None:
        self.state: State = fifo.init_state(3)
        self.index = 0

    def apply(self, command: object) -> object:
        self.index += 1
        reply, self.effects = fifo.apply(Meta(self.index, 1, 1_000 + self.index, 3), command,
                                         self.state)  # fmt: skip
        return reply

    def totals(self, base: str = "orders") -> list[int]:
        count = self.state.partitioned[base]
        return [self.state.queues[f"{base}.{i}"].messages_total for i in range(count)]


def orders(partitions: int = 4) -> Log:
    log = Log()
    assert log.apply(DeclarePartitionedQueue("orders", SAC, partitions)) == DeclareOk(True)
    return log


def keyed(body: bytes, key: str | int, **kw: object) -> AnnotatedEnqueue:
    return AnnotatedEnqueue("orders", body, annotations=(("x-group-id", key),), **kw)  # type: ignore[arg-type]


def test_keyless_publishes_go_round_robin() -> None:
    """Messages without a key go to partition 0, 1, 2, 3, 0, ... (the cursor is state)."""
    log = orders()
    for number in range(6):
        assert log.apply(Enqueue("orders", b"m%d" % number)) == Ok()
    assert log.totals() == [2, 2, 1, 1]
    assert log.state.routing["orders"].cursor == 2


def test_a_key_goes_to_crc32_of_its_utf8_bytes_always() -> None:
    """Every message of a key lands on crc32(key) mod partitions, an int key as its text."""
    log = orders(5)
    for key in ("customer-42", "ü-ключ", 17):
        want = zlib.crc32(str(key).encode()) % 5
        before = log.totals()
        for _ in range(3):
            assert log.apply(keyed(b"x", key)) == Ok()
        after = log.totals()
        assert [a - b for a, b in zip(after, before, strict=True)] == [
            3 if i == want else 0 for i in range(5)
        ]
    assert log.state.routing["orders"].cursor == 0  # keyed messages leave round robin alone


def test_dedup_holds_across_partitions() -> None:
    """A resend (same publisher and seq) is acked and stored nowhere, although round robin
    would put it on another partition; a gap is refused with the expected seq."""
    log = orders()
    assert log.apply(Enqueue("orders", b"a", "p", 1, CONN)) == Ok()
    assert log.apply(Enqueue("orders", b"b", "p", 2, CONN)) == Ok()
    assert log.apply(Enqueue("orders", b"b", "p", 2, CONN)) == Ok()  # duplicate
    assert log.apply(Enqueue("orders", b"a", "p", 1, CONN)) == Ok()  # duplicate
    assert log.apply(Enqueue("orders", b"d", "p", 4, CONN)) == NotEnqueued(3)
    assert log.totals() == [1, 1, 0, 0]
    assert log.state.routing["orders"].cursor == 2
    assert log.apply(Enqueue("orders", b"c", "p", 3, CONN)) == Ok()
    assert log.totals() == [1, 1, 1, 0]


def test_dedup_survives_a_normal_connection_down() -> None:
    """A publisher whose connection closed keeps its dedup (it resends through another node)."""
    log = orders()
    assert log.apply(Enqueue("orders", b"a", "p", 1, CONN)) == Ok()
    assert log.apply(ConnectionDown(CONN, "normal")) == Ok()
    assert log.state.routing["orders"].enqueuers["p"].status == "down"
    other = ConnectionId("n2", 1, 1)
    assert log.apply(Enqueue("orders", b"a", "p", 1, other)) == Ok()
    assert log.totals() == [1, 0, 0, 0]
    assert log.state.routing["orders"].enqueuers["p"].status == "up"


def test_register_enqueuer_on_the_base_registers_with_the_whole_queue() -> None:
    """RegisterEnqueuer naming the base is answered Ok and knows the publisher afterwards."""
    log = orders()
    assert log.apply(RegisterEnqueuer("orders", "p", CONN)) == Ok()
    assert log.state.routing["orders"].enqueuers["p"].next_seq == 1


def test_a_refused_publish_changes_nothing() -> None:
    """Bad input to the base is refused before the cursor or the dedup move."""
    log = orders()
    digest = fifo.digest(log.state)
    for bad in (
        Enqueue("orders", "text", "p", 1),  # type: ignore[arg-type]
        Enqueue("orders", b"x", "p", 0),
        Enqueue("orders", b"x", None, 1),
        Enqueue("orders", b"x", ttl_ms=-1),
        AnnotatedEnqueue("orders", b"x", annotations=(("x-group-id", 1.5),)),  # type: ignore[arg-type]
    ):
        assert isinstance(log.apply(bad), Error), bad
    assert fifo.digest(log.state) == digest


def test_other_per_queue_commands_on_the_base_are_refused_clearly() -> None:
    """A checkout or purge naming the base says what to do instead."""
    log = orders()
    reply = log.apply(Checkout("orders", ConsumerId("t", CONN), SimplePrefetch(1)))
    assert isinstance(reply, Error) and reply.code == "unsupported"
    assert "consumer group" in reply.message
    assert isinstance(log.apply(Purge("orders")), Error)


def test_the_base_name_cannot_be_declared_as_another_queue() -> None:
    """A plain or grouped queue named like a partitioned queue is refused, and a partitioned
    queue whose partition would be another's base too."""
    log = orders(2)
    assert isinstance(log.apply(DeclareQueue("orders")), Error)
    assert isinstance(log.apply(DeclareGroupedQueue("orders")), Error)
    assert log.apply(DeclarePartitionedQueue("a.1", SAC, 2)) == DeclareOk(True)
    reply = log.apply(DeclarePartitionedQueue("a", SAC, 2))  # a.1 would be a queue and a base
    assert isinstance(reply, Error) and reply.code == "queue_exists"


def test_delete_of_the_base_deletes_partitions_groups_and_routing() -> None:
    """Deleting the base removes every partition (their consumers told), the consumer groups
    over it and its routing, and answers the messages lost; it can be declared afresh."""
    log = orders(3)
    for number in range(5):
        log.apply(Enqueue("orders", b"m%d" % number, "p", number + 1, CONN))
    member = ConsumerId("g/m1", CONN)
    reply = log.apply(JoinGroup("orders", member, SimplePrefetch(1), group="g", member="m1"))
    assert not isinstance(reply, Error)
    assert log.apply(DeleteQueue("orders")) == DeleteOk(5)
    cancelled = [e for e in log.effects if isinstance(e, ConsumerCancelled)]
    assert {e.queue for e in cancelled} == {"orders.0", "orders.1", "orders.2"}
    state = log.state
    assert state.queues == {} and state.partitioned == {} and state.consumer_groups == {}
    assert state.routing == {}
    assert log.apply(DeclarePartitionedQueue("orders", SAC, 2)) == DeclareOk(True)
    assert log.apply(Enqueue("orders", b"again", "p", 1, CONN)) == Ok()  # dedup started over
    assert log.totals() == [1, 0]


def test_a_single_partition_cannot_be_deleted_or_leave_single_active_consumer() -> None:
    """Deleting `orders.1` alone, or making it a competing queue, is refused unchanged."""
    log = orders(2)
    digest = fifo.digest(log.state)
    reply = log.apply(DeleteQueue("orders.1"))
    assert isinstance(reply, Error) and "delete 'orders'" in reply.message
    assert isinstance(log.apply(UpdateConfig("orders.1", QueueConfig())), Error)
    assert isinstance(log.apply(UpdateConfig("orders", SAC)), Error)
    assert fifo.digest(log.state) == digest
    assert log.apply(UpdateConfig("orders.1", QueueConfig(True, delivery_limit=3))) == Ok()


def test_routing_survives_snapshot_and_restore() -> None:
    """Cursor and publishers' dedup are in the snapshot: a restored replica routes alike."""
    log = orders(3)
    log.apply(Enqueue("orders", b"a", "p", 1, CONN))
    restored = fifo.restore(fifo.snapshot(log.state))
    assert fifo.digest(restored) == fifo.digest(log.state)
    assert restored.routing["orders"].cursor == 1
    assert restored.routing["orders"].enqueuers["p"].next_seq == 2


def test_routing_is_the_same_under_another_hash_seed() -> None:
    """The same log routed in a process with another PYTHONHASHSEED gives the same digest."""
    script = (
        "import fifo\nfrom fifo.commands import *\nfrom fifo.meta import Meta\n"
        "s = fifo.init_state(3)\n"
        "fifo.apply(Meta(1, 1, 1, 3), DeclarePartitionedQueue('o', QueueConfig(True), 7), s)\n"
        "for i in range(60):\n"
        "    a = (('x-group-id', f'k{i % 9}'),) if i % 3 else ()\n"
        "    fifo.apply(Meta(i + 2, 1, 2, 3), AnnotatedEnqueue('o', b'x', 'p', i + 1,"
        " annotations=a), s)\n"
        "print(fifo.digest(s))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        )
        for seed in ("1", "2", "3")
    ]
    digests = {run.stdout for run in runs}
    assert len(digests) == 1


@given(st.text(max_size=40) | st.integers(-(10**12), 10**12), st.integers(1, 256))
def test_partition_index_is_crc32_of_the_key_text(key: str | int, partitions: int) -> None:
    """The machine's hash is plain CRC-32 of the key's UTF-8 text modulo the partitions."""
    text = str(key)
    assert routing.partition_index(text, partitions) == (
        zlib.crc32(text.encode("utf-8", "surrogatepass")) % partitions
    )


# --- planted bugs: the fuzzer's routing invariants must notice --------------------------------


def violations(seeds: range, steps: int = 500) -> set[str]:
    found: set[str] = set()
    for seed in seeds:
        found |= {v.invariant for v in fifo.fuzz.run(seed, steps, 3).violations}
    return found


def test_seeded_runs_route_and_hold_every_invariant() -> None:
    """v3 runs with routed publishes, resends, gaps and deletes of the base report nothing."""
    assert violations(range(300, 306)) == set()


def test_planted_bug_python_hash_routing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routing keys by something other than CRC-32 breaks "a key goes to crc32(key)"."""
    monkeypatch.setattr(routing, "partition_index", lambda key, count: len(key) % count)
    assert "partition_route" in violations(range(300, 306))


def test_planted_bug_stuck_round_robin_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cursor that never moves sends every keyless message to one partition."""
    monkeypatch.setattr(routing, "next_cursor", lambda index, count: index)
    assert "partition_round_robin" in violations(range(300, 306))


def test_planted_bug_per_partition_dedup_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the partitioned queue's dedup, a resend is stored again."""
    monkeypatch.setattr(routing.Router, "dedup", lambda self, r, cmd: None)
    assert "partition_dedup" in violations(range(300, 306))


def test_dead_letters_into_a_partitioned_queue_are_routed_like_publishes() -> None:
    """A queue dead-lettering into a partitioned queue's name: a keyed message goes to its
    key's partition, keyless ones round robin (one DeadLettered effect per partition)."""
    log = orders(3)
    work = QueueConfig(dead_letter_queue="orders")
    assert log.apply(DeclareQueue("work", work)) == DeclareOk(True)
    for body, anns in ((b"k", (("x-group-id", "cust-7"),)), (b"a", ()), (b"b", ())):
        log.apply(AnnotatedEnqueue("work", body, annotations=anns))
    consumer = ConsumerId("c", CONN)
    log.apply(Checkout("work", consumer, SimplePrefetch(10)))
    assert log.apply(Discard("work", consumer, (0, 1, 2))) == Ok()
    expected = [1, 1, 0]  # keyless: round robin from partition 0
    expected[zlib.crc32(b"cust-7") % 3] += 1
    assert log.totals() == expected
    lettered = [e for e in log.effects if isinstance(e, DeadLettered)]
    assert sum(e.count for e in lettered) == 3
    assert {e.target for e in lettered} == {f"orders.{i}" for i, n in enumerate(expected) if n}
    assert log.state.routing["orders"].cursor == 2
