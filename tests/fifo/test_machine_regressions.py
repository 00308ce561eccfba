"""Machine bugs found while fixing the SAC findings or by `quorumq fuzz`, pinned as named scenarios.

Each test is a minimal command sequence; the docstring says how it was found and what was wrong.
"""

from __future__ import annotations

import pytest

import fifo
from fifo.commands import (
    Cancel,
    Checkout,
    Command,
    ConnectionDown,
    ConnectionId,
    ConsumerDisconnectedTimeout,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    SimplePrefetch,
)
from fifo.effects import Deliver, Effect
from fifo.fuzz.invariants import check_state
from fifo.meta import Meta
from fifo.replies import Error
from fifo.state import State

CONN_A, CONN_B = ConnectionId("n1", 1, 1), ConnectionId("n2", 1, 2)
A, B = ConsumerId("a", CONN_A), ConsumerId("b", CONN_B)


def apply_all(state: State, version: int, commands: list[Command], first: int = 1) -> list[Effect]:
    """Apply commands at consecutive indexes; every reply must be a success."""
    effects: list[Effect] = []
    for offset, command in enumerate(commands):
        reply, out = fifo.apply(Meta(first + offset, 1, 1_000 + offset, version), command, state)
        assert not isinstance(reply, Error), (command, reply)
        effects += out
    return effects


@pytest.mark.parametrize("version", [1, 2])
def test_closing_the_connection_of_a_waiting_holder_is_a_failed_delivery(version: int) -> None:
    """Found reading drop_waiting while fixing the soft cancel of a waiting holder: SAC, `a` takes
    m and cancels, `b` becomes active, `a` checks out again (waits, still holding m), then a's
    connection closes normally. m came back with delivery_count 0; DESIGN.md: messages returned
    because the connection went down (not noconnection) count as a failed delivery, so m must be
    redelivered to `b` with delivery_count 1 (and v2's delivery limit must see it)."""
    state = fifo.init_state(version)
    effects = apply_all(state, version, [
        DeclareQueue("q", QueueConfig(single_active_consumer=True)),
        Enqueue("q", b"m"),
        Checkout("q", A, SimplePrefetch(1)),
        Checkout("q", A, Cancel()),
        Checkout("q", B, SimplePrefetch(1)),
        Checkout("q", A, SimplePrefetch(1)),
        ConnectionDown(CONN_A, "normal"),
    ])
    redelivered = [(m.body, m.delivery_count) for e in effects
                   if isinstance(e, Deliver) and e.tag == "b" for m in e.messages]
    assert redelivered == [(b"m", 1)]
    assert check_state(state, {}) == []


def waiting_holder(version: int) -> State:
    """SAC: `a` takes m and cancels, `b` becomes active, `a` checks out again: it waits, holding m
    (indexes 1..6; in v2 a's key is 3)."""
    state = fifo.init_state(version)
    apply_all(state, version, [
        DeclareQueue("q", QueueConfig(single_active_consumer=True)),
        Enqueue("q", b"m"),
        Checkout("q", A, SimplePrefetch(1)),
        Checkout("q", A, Cancel()),
        Checkout("q", B, SimplePrefetch(1)),
        Checkout("q", A, SimplePrefetch(1)),
    ])
    return state


def test_v1_noconnection_returns_the_messages_of_a_waiting_holder() -> None:
    """Found reading down_noconnection after the waiting-holder fixes: v1 only marked a waiting
    holder suspected and it kept m; DESIGN.md v1: a `noconnection` down returns the consumer's
    messages at once (not a failed delivery), so m goes to the active `b`."""
    state = waiting_holder(1)
    effects = apply_all(state, 1, [ConnectionDown(CONN_A, "noconnection")], first=7)
    redelivered = [(m.body, m.delivery_count) for e in effects
                   if isinstance(e, Deliver) and e.tag == "b" for m in e.messages]
    assert redelivered == [(b"m", 0)]
    assert check_state(state, {}) == []


def test_v2_disconnected_timeout_returns_the_messages_of_a_waiting_holder() -> None:
    """Found reading consumer_disconnected_timeout after the waiting-holder fixes: v2 returned a
    suspected consumer's messages on its disconnected timeout only if it was in the consumer map;
    a waiting holder kept m for ever. DESIGN.md v2: suspected until it comes back or its
    disconnected timeout fires, then its messages are returned (not a failed delivery)."""
    state = waiting_holder(2)
    effects = apply_all(state, 2, [ConnectionDown(CONN_A, "noconnection")], first=7)
    assert not [e for e in effects if isinstance(e, Deliver)]  # suspected: keeps m for now
    due = fifo.due_commands(state, state.last_time + 60_000)  # the default 60 s; locks still hold
    assert due == [ConsumerDisconnectedTimeout("q", 3)]
    effects = apply_all(state, 2, due, first=8)
    redelivered = [(m.body, m.delivery_count) for e in effects
                   if isinstance(e, Deliver) and e.tag == "b" for m in e.messages]
    assert redelivered == [(b"m", 0)]
    assert check_state(state, {}) == []
