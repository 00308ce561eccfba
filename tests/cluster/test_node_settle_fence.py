"""The settle fence (issue 24) when the state object is replaced while a settle is in flight.

A session notes, when a settle arrives, which named messages its consumer holds (the message
objects and how often each was taken back); when the settle is answered Ok it checks them again.
A machine upgrade converts the state into new objects (`fifo.convert`): a message taken back
after that is counted in the new object, never in the one noted. Driven against real machine
states, without a process."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import fifo
from cluster.node.session import ClientSession
from fifo.codec import restore, snapshot
from fifo.commands import (
    Checkout,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.meta import Meta
from fifo.replies import CheckoutOk, Ok, Reply
from fifo.state import State
from raft.errors import SubmitError
from raft.replica import Reply as ReplicaReply

CONNECTION = ConnectionId("n1", 1, 7)


class Holder:
    """The replica's state as the session reads it (replaced by an upgrade, like the node's)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.index = 0

    def apply(self, command: object) -> Reply:
        self.index += 1
        reply, _effects = fifo.apply(Meta(self.index, 1, 1000 + self.index, 3), command, self.state)
        return reply

    def read(self, function: Any) -> Any:
        return function(SimpleNamespace(state=self.state))


def a_consumer_holding_one_message() -> tuple[Holder, Any]:
    """A v3 state where one consumer of this node's connection holds message 0."""
    holder = Holder(fifo.init_state(3))
    holder.apply(DeclareQueue("q"))
    reply = holder.apply(Checkout("q", ConsumerId("c", CONNECTION), SimplePrefetch(1)))
    assert isinstance(reply, CheckoutOk)
    holder.apply(Enqueue("q", b"m0"))
    assert 0 in holder.state.queues["q"].consumers[reply.consumer_key].checked_out
    return holder, reply.consumer_key


def settle_sink(holder: Holder, settle: Settle) -> tuple[Any, list[ReplicaReply]]:
    """The session's checking sink for `settle`, and what it passes on."""
    server: Any = SimpleNamespace(replica=holder)
    session = ClientSession(server, None, None)  # type: ignore[arg-type]
    answers: list[ReplicaReply] = []
    return session._settle_sink(settle, answers.append), answers


def test_a_message_taken_back_after_an_upgrade_is_not_answered_settled_ok() -> None:
    """Settle noted; then an upgrade replaces the state, the message is taken back in the new
    state, and the settle applies (the machine answers Ok: its consumer no longer holds it):
    the session must not pass that Ok on as a settle."""
    holder, key = a_consumer_holding_one_message()
    settle = Settle("q", key, (0,))
    checked, answers = settle_sink(holder, settle)
    holder.state = restore(snapshot(holder.state))  # what an upgrade's conversion does
    assert holder.apply(Return("q", key, (0,))) == Ok()  # taken back, in the new objects only
    checked(holder.apply(settle))
    [answer] = answers
    assert isinstance(answer, SubmitError) and answer.code == "unavailable"
    assert "outcome unknown" in answer.message


def test_a_message_taken_back_before_the_upgrade_is_refused_as_fenced() -> None:
    """Taken back before the state was replaced: the noted object says so, the refusal is
    certain (fenced)."""
    holder, key = a_consumer_holding_one_message()
    settle = Settle("q", key, (0,))
    checked, answers = settle_sink(holder, settle)
    assert holder.apply(Return("q", key, (0,))) == Ok()
    holder.state = restore(snapshot(holder.state))
    checked(holder.apply(settle))
    [answer] = answers
    assert getattr(answer, "code", None) == "fenced"


def test_a_settle_across_no_replacement_is_answered_as_the_machine_did() -> None:
    """The common path: nothing replaced, the message still held: Ok passes through."""
    holder, key = a_consumer_holding_one_message()
    settle = Settle("q", key, (0,))
    checked, answers = settle_sink(holder, settle)
    checked(holder.apply(settle))
    assert answers == [Ok()]


def test_a_fenced_settle_is_not_counted_as_acked() -> None:
    """`quorumq_queue_messages_acked_total` counts what the client is told was settled: a
    settle the fence turns into a refusal (here: the message was taken back first) is not an
    ack, and one answered `unavailable` (outcome unknown) is not one either, else its resend
    counts the same messages twice (a test workload that overlapped the cluster's first machine
    upgrade saw 84-88 acks for 80)."""
    pytest.importorskip("prometheus_client")
    from cluster.node.metrics import NodeMetrics

    holder, key = a_consumer_holding_one_message()
    metrics = NodeMetrics("n1", lambda: holder, lambda: 0, None)  # type: ignore[arg-type,return-value]
    server: Any = SimpleNamespace(replica=holder, metrics=metrics)
    session = ClientSession(server, None, None)  # type: ignore[arg-type]
    answers: list[ReplicaReply] = []
    settle = Settle("q", key, (0,))
    sink = session._command_sink(settle, answers.append)
    assert holder.apply(Return("q", key, (0,))) == Ok()
    sink(holder.apply(settle))
    [answer] = answers
    assert getattr(answer, "code", None) == "fenced"
    assert metrics.acked.labels("q")._value.get() == 0
