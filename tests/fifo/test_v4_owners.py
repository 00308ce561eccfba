"""Machine v4 (issue 31, item 3): a settle, return, discard, modify or lock renewal bound to a
connection (`BoundSettle` ...) is accepted only from the connection that holds the consumer.

A foreign one is refused with `not_owner` and changes nothing (state digest unchanged, no
effect); the owner's later ack of the same ids is `ok`. Unbound commands keep v3's behaviour
(node-internal submitters, the v3 corpus), and machines before v4 do not know the bound ones."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import fifo
import fifo.fuzz
from fifo import commands as c
from fifo.replies import Error, Ok
from fifo.state import State
from fifo.v4 import basics

OWNER = c.ConnectionId("n1", 1, 1)
FOREIGN = c.ConnectionId("n2", 1, 1)  # another client, on another node
QUEUE = "q"
MESSAGES = 3


class Run:
    """A v4 state with one consumer of OWNER holding MESSAGES messages."""

    def __init__(self, version: int = 4) -> None:
        self.state: State = fifo.init_state(version)
        self.index = 0
        self.version = version
        self.apply(c.DeclareQueue(QUEUE, c.QueueConfig(dead_letter_queue="dlq")))
        self.apply(c.DeclareQueue("dlq"))
        for number in range(MESSAGES):
            self.apply(c.Enqueue(QUEUE, b"m%d" % number))
        reply, _ = self.apply(c.Checkout(QUEUE, c.ConsumerId("a", OWNER), c.SimplePrefetch(10)))
        self.key: Any = reply.consumer_key if reply.consumer_key is not None else None
        self.ids = tuple(range(MESSAGES))

    def apply(self, command: object) -> tuple[Any, list[Any]]:
        """Apply at the next index; the reply and effects."""
        self.index += 1
        meta = fifo.Meta(self.index, 1, 1_000 + self.index, self.version)
        return fifo.apply(meta, command, self.state)


def bound_commands(key: Any, ids: tuple[int, ...], connection: c.ConnectionId) -> list[Any]:
    """Every bound settling command naming `key` and `ids`, submitted by `connection`."""
    return [
        c.BoundSettle(QUEUE, key, ids, connection),
        c.BoundReturn(QUEUE, key, ids, connection),
        c.BoundDiscard(QUEUE, key, ids, connection),
        c.BoundModify(QUEUE, key, ids, True, True, (), connection),
        c.BoundRenewLocks(QUEUE, key, ids, connection),
    ]


KINDS = [type(command).__name__ for command in bound_commands(1, (0,), OWNER)]


@pytest.mark.parametrize("position", range(len(KINDS)), ids=KINDS)
def test_a_foreign_connection_is_refused_and_nothing_changes(position: int) -> None:
    """Another connection naming the consumer's key and ids gets not_owner, no effect, and the
    state is exactly as before; the owner's ack afterwards is ok and settles every message."""
    run = Run()
    before = fifo.digest(run.state)
    command = bound_commands(run.key, run.ids, FOREIGN)[position]
    reply, effects = run.apply(command)
    assert isinstance(reply, Error) and reply.code == "not_owner", reply
    assert "belongs to another connection" in reply.message
    assert effects == []
    assert fifo.digest(run.state) == before
    reply, _ = run.apply(c.BoundSettle(QUEUE, run.key, run.ids, OWNER))
    assert isinstance(reply, Ok)
    assert run.state.queues[QUEUE].messages_total == 0


@pytest.mark.parametrize("position", range(len(KINDS)), ids=KINDS)
def test_the_owner_is_accepted(position: int) -> None:
    """The consumer's own connection settles, returns, discards, modifies and renews."""
    run = Run()
    reply, _ = run.apply(bound_commands(run.key, run.ids, OWNER)[position])
    assert isinstance(reply, Ok), reply


def test_naming_the_consumer_by_its_id_form_is_refused_too() -> None:
    """The id form (tag, owner's connection) names the same consumer: still not_owner."""
    run = Run()
    reply, _ = run.apply(c.BoundDiscard(QUEUE, c.ConsumerId("a", OWNER), run.ids, FOREIGN))
    assert isinstance(reply, Error) and reply.code == "not_owner"


def test_an_unknown_consumer_and_a_missing_connection_are_errors() -> None:
    """A key no consumer has is unknown_consumer (as unbound); a bound command without a
    connection is invalid."""
    run = Run()
    reply, _ = run.apply(c.BoundSettle(QUEUE, 999_999, run.ids, FOREIGN))
    assert isinstance(reply, Error) and reply.code == "unknown_consumer"
    reply, _ = run.apply(c.BoundSettle(QUEUE, run.key, run.ids, None))
    assert isinstance(reply, Error) and reply.code == "invalid_argument"


def test_a_dequeued_message_belongs_to_the_getters_connection() -> None:
    """basic.get with ack: only the getter's connection may settle what it took."""
    run = Run()
    run.apply(c.Enqueue("dlq", b"get me"))
    reply, _ = run.apply(c.Checkout("dlq", c.ConsumerId("get", FOREIGN), c.Dequeue(False)))
    taken = reply.message.msg_id
    refused, _ = run.apply(c.BoundSettle("dlq", reply.consumer_key, (taken,), OWNER))
    assert isinstance(refused, Error) and refused.code == "not_owner"
    accepted, _ = run.apply(c.BoundSettle("dlq", reply.consumer_key, (taken,), FOREIGN))
    assert isinstance(accepted, Ok)


def test_unbound_commands_keep_v3_behaviour() -> None:
    """An unbound Discard (a node-internal submitter) is applied as v3 applies it."""
    run = Run()
    reply, _ = run.apply(c.Discard(QUEUE, run.key, run.ids))
    assert isinstance(reply, Ok)
    assert run.state.queues["dlq"].messages_total == MESSAGES


@pytest.mark.parametrize("version", [1, 2, 3])
def test_machines_before_v4_do_not_know_bound_commands(version: int) -> None:
    """v1-v3 answer unknown_command (the node sends bound commands only once v4 is effective)."""
    run = Run(version)
    key = run.key if run.key is not None else c.ConsumerId("a", OWNER)
    reply, _ = run.apply(c.BoundSettle(QUEUE, key, run.ids, OWNER))
    assert isinstance(reply, Error) and reply.code == "unknown_command"



def _replies_to_bound(seed: int, steps: int) -> tuple[Counter[str], list[str]]:
    """The replies (type or error code) to bound commands in a v4 fuzz run, and its
    violations."""
    replies: Counter[str] = Counter()

    def recording(meta: fifo.Meta, command: Any, state: State) -> tuple[Any, list[Any]]:
        reply, effects = fifo.apply(meta, command, state)
        if type(command) in c.UNBOUND_SETTLES:
            replies[reply.code if isinstance(reply, Error) else type(reply).__name__] += 1
        return reply, effects

    result = fifo.fuzz.run(seed, steps, 4, apply_fn=recording)
    return replies, [v.invariant for v in result.violations]


def test_the_fuzzer_tries_foreign_settles_and_finds_the_rule_kept() -> None:
    """The v4 generator binds many answers to the owner and some to another connection; the
    machine refuses those (not_owner) and every invariant holds."""
    replies, violations = _replies_to_bound(3, 2000)
    assert violations == []
    assert replies["Ok"] >= 50 and replies["not_owner"] >= 10, replies


def test_planted_bug_a_machine_accepting_foreign_settles_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the ownership check removed, the fuzzer reports foreign_settle."""
    monkeypatch.setattr(basics.QueueBasics, "owner_refusal", lambda self, q, k, conn: None)
    _replies, violations = _replies_to_bound(3, 2000)
    assert "foreign_settle" in violations


def test_planted_bug_a_machine_refusing_the_owner_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every bound command refused, the fuzzer reports owner_refused."""
    refusal = Error("not_owner", "planted")
    monkeypatch.setattr(basics.QueueBasics, "owner_refusal", lambda self, q, k, c: refusal)
    _replies, violations = _replies_to_bound(3, 2000)
    assert "owner_refused" in violations
