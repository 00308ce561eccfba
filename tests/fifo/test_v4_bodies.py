"""Machine v4 keeps message bodies in the log (issue 32): a publish leaves a reference (the meta
index of its command) and the size in the state, never the body; `fifo.live_entry_indexes`
names the entries still referred to through every way a message leaves or moves."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import fifo
from fifo import commands as c
from fifo import limits
from fifo.bodies import (
    BodyMissingError,
    referenced_bodies,
    references,
    resolve_effects,
    resolve_reply,
)
from fifo.effects import Deliver, Delivery, RefDeliver, RefDelivery
from fifo.replies import DequeueOk, Error, RefDequeueOk
from fifo.state import (
    BODY_SIZE_BITS,
    BodyNotHeldError,
    Message,
    RefMessage,
    State,
    compact,
    inflate,
)
from raft.entry import SUB_INDEX_SPAN

CONN = c.ConnectionId("n1", 1, 1)
SPAN = limits.commands_per_entry_max


class Log:
    """Applies commands one per entry (meta index = entry * 1024) and keeps their bodies, as a
    journal would, to resolve references."""

    def __init__(self, version: int = 4) -> None:
        self.state: State = fifo.init_state(version)
        self.entry = 0
        self.bodies: dict[int, bytes] = {}
        self.now = 1_000

    def apply(self, command: object, position: int = 0) -> tuple[Any, list[Any]]:
        self.entry += 1
        index = self.entry * SPAN + position
        if isinstance(command, c.Enqueue):
            self.bodies[index] = command.body
        reply, effects = fifo.apply(fifo.Meta(index, 1, self.now, 4), command, self.state)
        assert not isinstance(reply, Error), reply
        return reply, effects

    def body_of(self, ref: int) -> bytes:
        if ref not in self.bodies:
            raise BodyMissingError(ref, "not in this log")
        return self.bodies[ref]

    def live(self) -> list[int]:
        return fifo.live_entry_indexes(self.state)


def declare(log: Log, name: str = "q", **config: Any) -> None:
    log.apply(c.DeclareQueue(name, c.QueueConfig(**config)))


def checkout(log: Log, prefetch: int = 10, name: str = "q") -> int:
    reply, _ = log.apply(c.Checkout(name, c.ConsumerId("t", CONN), c.SimplePrefetch(prefetch)))
    return int(reply.consumer_key)


def test_the_span_is_rafts() -> None:
    """fifo's commands-per-entry span is raft's sub-index span (meta index = I * 1024 + pos)."""
    assert SPAN == SUB_INDEX_SPAN


def test_a_v4_publish_keeps_a_reference_and_no_body() -> None:
    """The state holds the command's meta index and the size; reading the body is an error."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"x" * 1000))
    log.apply(c.AnnotatedEnqueue("q", b"yy", annotations=(("k", "v"),)))
    stored = list(log.state.queues["q"].ready)
    assert [type(m) for m in stored] == [int, RefMessage]  # a plain one kept as its packed int
    messages = [inflate(m) for m in stored]
    assert [type(m) for m in messages] == [RefMessage, RefMessage]
    assert [(m.ref, m.size) for m in messages] == [(2 * SPAN, 1000), (3 * SPAN, 2)]
    with pytest.raises(BodyNotHeldError, match=f"meta index {2 * SPAN}"):
        _ = messages[0].body
    overview = fifo.overview(log.state, "q")
    assert overview is not None and overview.bytes == 1002
    assert b"x" * 1000 not in fifo.snapshot(log.state)
    assert referenced_bodies(log.state) == (2, 1002)


def test_a_snapshot_restores_the_references_to_the_same_digest() -> None:
    """A reference survives snapshot and restore (the digest depends on nothing node-local)."""
    log = Log()
    declare(log)
    for n in range(5):
        log.apply(c.Enqueue("q", b"m%d" % n))
    restored = fifo.restore(fifo.snapshot(log.state))
    assert fifo.digest(restored) == fifo.digest(log.state)
    refs = [inflate(m).ref for m in log.state.queues["q"].ready]
    assert [inflate(m).ref for m in restored.queues["q"].ready] == refs


def test_the_digest_is_the_same_in_processes_with_other_hash_seeds() -> None:
    """Equal logs give equal digests whatever PYTHONHASHSEED (references included)."""
    script = (
        "import fifo\nfrom fifo import commands as c\ns = fifo.init_state(4)\n"
        "fifo.apply(fifo.Meta(1024, 1, 1, 4), c.DeclareQueue('q', c.QueueConfig()), s)\n"
        "for n in range(50):\n"
        "    fifo.apply(fifo.Meta((n + 2) * 1024, 1, 1, 4), c.AnnotatedEnqueue('q', b'm%d' % n,"
        " annotations=(('g', str(n)),)), s)\nprint(fifo.digest(s))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        for seed in ("1", "2", "3")
    ]
    digests = {run.stdout for run in runs}
    assert len(digests) == 1


def test_deliveries_carry_the_reference_or_the_body_in_hand() -> None:
    """A publish handed straight to a waiting consumer carries its body (it is in hand); a
    message delivered later carries its reference, resolved from the log to the same body."""
    log = Log()
    declare(log)
    key = checkout(log, prefetch=1)
    _, fresh = log.apply(c.Enqueue("q", b"first"))
    assert type(fresh[0]) is RefDeliver
    assert [m.body for m in fresh[0].messages if isinstance(m, Delivery)] == [b"first"]
    log.apply(c.Enqueue("q", b"second"))  # no credit: waits
    _, later = log.apply(c.Settle("q", key, (0,)))
    delivery = next(e for e in later if type(e) is RefDeliver)
    assert type(delivery.messages[0]) is RefDelivery
    resolved = resolve_effects(later, log.body_of)
    assert [type(e) for e in resolved if isinstance(e, Deliver)] == [Deliver]
    assert next(e for e in resolved if isinstance(e, Deliver)).messages[0].body == b"second"


def test_a_dequeue_replies_by_reference() -> None:
    """basic.get's reply names the reference; resolving it gives the body."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"got"))
    reply, _ = log.apply(c.Checkout("q", c.ConsumerId("g", CONN), c.Dequeue(True)))
    assert type(reply) is RefDequeueOk and reply.message.size == 3
    resolved = resolve_reply(reply, log.body_of)
    assert type(resolved) is DequeueOk and resolved.message is not None
    assert resolved.message.body == b"got"


def test_a_missing_body_is_an_error_naming_its_index() -> None:
    """Resolving a reference the log does not hold raises, never yields an empty body."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"lost"))
    reply, _ = log.apply(c.Checkout("q", c.ConsumerId("g", CONN), c.Dequeue(True)))
    log.bodies.clear()
    with pytest.raises(BodyMissingError, match=f"meta index {2 * SPAN} \\(raft index 2\\)"):
        resolve_reply(reply, log.body_of)


def test_a_body_of_the_wrong_size_is_missing() -> None:
    """The size the state recorded is checked against what the log holds."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"abc"))
    reply, _ = log.apply(c.Checkout("q", c.ConsumerId("g", CONN), c.Dequeue(True)))
    with pytest.raises(BodyMissingError, match="holds 2 bytes there, the state 3"):
        resolve_reply(reply, lambda ref: b"ab")


def test_live_entries_follow_settle_and_return() -> None:
    """Checked out and returned messages stay live; a settled one is no longer."""
    log = Log()
    declare(log)
    for n in range(3):
        log.apply(c.Enqueue("q", b"m%d" % n))  # entries 2, 3, 4
    assert log.live() == [2, 3, 4]
    key = checkout(log, prefetch=3)
    assert log.live() == [2, 3, 4]
    log.apply(c.Settle("q", key, (0,)))
    assert log.live() == [3, 4]
    log.apply(c.Return("q", key, (1,)))
    assert log.live() == [3, 4]
    log.apply(c.Settle("q", key, (2,)))
    assert log.live() == [3]


def test_live_entries_are_distinct_and_sorted_with_many_commands_per_entry() -> None:
    """Several commands of one entry (positions) give one live entry index, sorted."""
    state = fifo.init_state(4)
    fifo.apply(fifo.Meta(SPAN, 1, 1, 4), c.DeclareQueue("q", c.QueueConfig()), state)
    for index in (9 * SPAN + 1, 9 * SPAN + 5, 10 * SPAN + 6, 12 * SPAN + 2, 12 * SPAN + 3):
        fifo.apply(fifo.Meta(index, 1, 1, 4), c.Enqueue("q", b"p"), state)
    assert fifo.live_entry_indexes(state) == [9, 10, 12]
    assert [packed >> BODY_SIZE_BITS for packed in references(state)] == [
        9 * SPAN + 1, 9 * SPAN + 5, 10 * SPAN + 6, 12 * SPAN + 2, 12 * SPAN + 3]  # fmt: skip


def test_a_dead_lettered_message_moves_its_reference() -> None:
    """A rejected message moves to the dead-letter queue with the same reference: still live,
    resolved to its original body."""
    log = Log()
    declare(log, "dlq")
    declare(log, dead_letter_queue="dlq")
    log.apply(c.Enqueue("q", b"bad"))
    key = checkout(log)
    log.apply(c.Discard("q", key, (0,)))
    assert len(log.state.queues["q"].ready) == 0
    moved = log.state.queues["dlq"].ready[0]
    assert type(moved) is RefMessage and moved.ref == 3 * SPAN
    assert log.live() == [3]
    reply, _ = log.apply(c.Checkout("dlq", c.ConsumerId("g", CONN), c.Dequeue(True)))
    assert resolve_reply(reply, log.body_of).message.body == b"bad"  # type: ignore[union-attr]
    assert log.live() == []


def test_purge_and_expiry_drop_live_entries() -> None:
    """Purged and expired (no dead-letter target) messages no longer keep their entries."""
    log = Log()
    declare(log, message_ttl_ms=100)
    declare(log, "p")
    log.apply(c.Enqueue("q", b"old"))
    log.apply(c.Enqueue("p", b"purged"))
    assert log.live() == [3, 4]
    log.apply(c.Purge("p"))
    assert log.live() == [3]
    log.now += 1_000
    log.apply(c.Expire("q"))
    assert log.live() == []


def test_drop_head_frees_the_entry() -> None:
    """max_length with drop-head drops the oldest reference."""
    log = Log()
    declare(log, max_length=1)
    log.apply(c.Enqueue("q", b"a"))
    log.apply(c.Enqueue("q", b"b"))
    assert log.live() == [3]


def test_grouped_queues_keep_references_too() -> None:
    """Messages of a grouped queue are references as well, in their groups."""
    log = Log()
    log.apply(c.DeclareGroupedQueue("g", c.QueueConfig(), c.GroupConfig()))
    log.apply(c.AnnotatedEnqueue("g", b"one", annotations=(("x-group-id", "a"),)))
    log.apply(c.AnnotatedEnqueue("g", b"two", annotations=(("x-group-id", "b"),)))
    assert log.live() == [2, 3]
    log.apply(c.PurgeGroup("g", "a"))
    assert log.live() == [3]


def test_v3_messages_keep_their_inline_body_through_the_conversion() -> None:
    """A v3 state's messages are not references: none is live; v4 publishes after are."""
    log = Log(version=3)
    declare(log)
    log.apply(c.Enqueue("q", b"from v3"))
    assert fifo.live_entry_indexes(log.state) == []
    log.state = fifo.convert(log.state, 3, 4, fifo.Meta(10 * SPAN, 1, 1, 4))
    assert [type(m) for m in log.state.queues["q"].ready] == [Message]
    assert log.live() == []
    log.entry = 10
    log.apply(c.Enqueue("q", b"from v4"))
    assert log.live() == [11]
    reply, _ = log.apply(c.Checkout("q", c.ConsumerId("g", CONN), c.Dequeue(True)))
    assert type(reply) is DequeueOk and reply.message is not None
    assert reply.message.body == b"from v3"  # inline: no resolution needed


def test_v1_to_v3_states_have_no_live_entries() -> None:
    """Older machines keep bodies inline: the live list is empty."""
    for version in (1, 2, 3):
        log = Log(version)
        declare(log)
        log.apply(c.Enqueue("q", b"inline"))
        assert fifo.live_entry_indexes(log.state) == []


def test_peek_names_the_reference() -> None:
    """`fifo.messages` gives a v4 message's reference (the node reads the body back)."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"peeked"))
    (info,) = fifo.messages(log.state, "q")
    assert (info.body, info.body_ref) == (b"", 2 * SPAN)


def test_the_fuzzer_reports_a_reference_to_no_publish() -> None:
    """A machine that delivers a reference the log does not hold is caught (`apply_raised`,
    naming the index): the fuzzer resolves every reference from the commands it applied."""
    import dataclasses

    from fifo.fuzz import runner

    def shifted(meta: fifo.Meta, command: Any, state: State) -> tuple[Any, list[Any]]:
        reply, effects = fifo.apply(meta, command, state)
        out = []
        for effect in effects:
            if type(effect) is RefDeliver:
                items = tuple(
                    dataclasses.replace(m, ref=m.ref + 1) if type(m) is RefDelivery else m
                    for m in effect.messages
                )
                effect = dataclasses.replace(effect, messages=items)
            out.append(effect)
        return reply, out

    assert not runner.run(1, 400, 4).violations
    found = runner.run(1, 400, 4, apply_fn=shifted).violations
    assert found and found[0].invariant == "apply_raised"
    assert "is missing" in found[0].detail


def test_a_ready_message_is_two_slots_until_a_field_leaves_its_default() -> None:
    """The memory the issue asks for: an untouched message has no fields object (48 bytes with
    its GC header); a checkout (its lock) gives it one, defaults written change nothing."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"x" * 1024))
    message = inflate(log.state.queues["q"].ready[0])
    assert type(message) is RefMessage and message.fields is None
    assert sys.getsizeof(message) <= 48
    message.delivery_count = 0
    message.annotations = ()
    assert message.fields is None and message.expiry is None and message.lock == 0
    checkout(log)
    held = next(iter(log.state.queues["q"].consumers.values())).checked_out[0]
    assert type(held) is RefMessage and held.packed == message.packed and held.lock > 0
    assert getattr(held, "fields", None) is not None


def test_a_plain_waiting_message_is_kept_as_its_packed_int() -> None:
    """A ready message without fields is its bare packed int in the line (a 64-bit word, not
    the object's 88 bytes), also after a restore; one with a TTL, annotations or a return
    stays an object; both encode as the same record."""
    log = Log()
    declare(log)
    log.apply(c.Enqueue("q", b"x" * 1024))
    log.apply(c.Enqueue("q", b"y" * 10, ttl_ms=60_000))
    log.apply(c.AnnotatedEnqueue("q", b"z", annotations=(("k", "v"),)))
    ready = log.state.queues["q"].ready
    assert [type(item) for item in ready] == [int, RefMessage, RefMessage]
    assert sys.getsizeof(ready[0]) <= 32
    assert ready[0] == RefMessage(2 * SPAN, 1024, None).packed
    assert compact(inflate(ready[0])) == ready[0] and compact(inflate(ready[1])) is ready[1]
    restored = fifo.restore(fifo.snapshot(log.state))
    assert [type(item) for item in restored.queues["q"].ready] == [int, RefMessage, RefMessage]
    assert fifo.snapshot(restored) == fifo.snapshot(log.state)
    key = checkout(log)
    log.apply(c.Return("q", key, (0, 1, 2)))
    assert all(type(item) is RefMessage for item in log.state.queues["q"].returns)
