"""Effect routing: only live connections of this node incarnation receive effects."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import fifo
from cluster.node.effects import EffectRouter
from cluster.node.session import bind_connection
from fifo.commands import Checkout, ConnectionId, ConsumerId, Enqueue, QueueConfig, SimplePrefetch
from fifo.effects import CreditReply, DeadLettered, Deliver, Delivery
from fifo.state import Consumer, Message, Queue, State


def deliver(connection: ConnectionId) -> Deliver:
    return Deliver(connection, "q", "t", 1, (Delivery(0, b"x", False, 0),))


def test_replayed_effects_of_an_older_incarnation_are_dropped() -> None:
    """Same node and connection number but an older incarnation: the effect is not sent."""
    router = EffectRouter("n1", incarnation=2)
    sent: list[dict[str, Any]] = []
    live = ConnectionId("n1", 2, 1)
    router.register(live, sent.append)
    router.dispatch([deliver(ConnectionId("n1", 1, 1))])  # replayed from the journal
    assert sent == [] and router.dropped == 1
    router.dispatch([deliver(live)])
    assert [fifo.decode(m["effect"]) for m in sent] == [deliver(live)]


def test_effects_for_other_nodes_or_closed_connections_are_not_sent() -> None:
    """Effects owned by another node, for a closed connection or without one are skipped."""
    router = EffectRouter("n1", incarnation=2)
    sent: list[dict[str, Any]] = []
    live = ConnectionId("n1", 2, 1)
    router.register(live, sent.append)
    credit = CreditReply(live, "q", "t", 1, 0, 5, 0, False, True)
    router.dispatch([deliver(ConnectionId("n2", 2, 1)), DeadLettered("q", "expired", 1, None)])
    router.unregister(live)
    router.dispatch([credit])
    assert sent == []


def test_connection_fields_are_overwritten_with_the_callers() -> None:
    """bind_connection replaces every connection a client could forge."""
    mine, forged = ConnectionId("n1", 2, 1), ConnectionId("n9", 1, 1)
    assert bind_connection(Enqueue("q", b"x", connection=forged), mine).connection == mine
    checkout = bind_connection(Checkout("q", ConsumerId("t", forged), SimplePrefetch(1)), mine)
    assert checkout.consumer.connection == mine


class FakeReplica:
    """What the router asks of a replica: is the state current, and a view of it."""

    def __init__(self, state: State) -> None:
        self.current = True
        self.state = state

    def applied_state_current(self) -> bool:
        return self.current

    def read(self, function: Any) -> Any:
        return function(SimpleNamespace(state=self.state))

    def handovers_waiting(self) -> int:
        return 0  # every applied entry handed over (machine v4 reads bodies first)


def held_consumer(connection: ConnectionId, ids: list[int]) -> tuple[State, Consumer]:
    """A state with queue "q" whose consumer key 1 (tag "t") holds messages `ids` ("m<id>")."""
    state = State(2)
    queue = Queue("q", QueueConfig(), 0)
    consumer = Consumer(1, "t", connection, 1)
    for mid in ids:
        consumer.checked_out[mid] = Message(f"m{mid}".encode(), None)
    consumer.next_msg_id = max(ids, default=-1) + 1
    queue.consumers[1] = consumer
    state.queues["q"] = queue
    return state, consumer


def deliveries(sent: list[dict[str, Any]]) -> list[tuple[int, bytes]]:
    """(msg id, body) of every message in the Deliver frames sent, in order."""
    effects = [fifo.decode(m["effect"]) for m in sent]
    return [(d.msg_id, d.body) for e in effects if isinstance(e, Deliver) for d in e.messages]


def delivery_of(connection: ConnectionId, *ids: int) -> Deliver:
    messages = tuple(Delivery(i, f"m{i}".encode(), False, 0) for i in ids)
    return Deliver(connection, "q", "t", 1, messages)


def test_deliveries_applied_while_not_current_are_held_then_reconciled_from_the_state() -> None:
    """Issue 24: deliveries of entries applied while catching up are not sent; once current,
    only what the state says the consumer still holds from the first held id is sent."""
    live = ConnectionId("n1", 2, 1)
    state, consumer = held_consumer(live, [0, 1, 2, 3])
    replica = FakeReplica(state)
    router = EffectRouter("n1", incarnation=2)
    router.use_replica(replica)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    router.register(live, sent.append)
    router.dispatch([delivery_of(live, 0)])
    replica.current = False
    router.dispatch([delivery_of(live, 1, 2), delivery_of(live, 3)])
    router.dispatch([CreditReply(live, "q", "t", 1, 0, 5, 0, False, True)])  # not held
    assert deliveries(sent) == [(0, b"m0")] and router.held == 2
    router.reconcile()  # still not current: nothing
    del consumer.checked_out[2]  # a later entry took 2 back (it went to another consumer)
    replica.current = True
    router.reconcile()
    assert deliveries(sent) == [(0, b"m0"), (1, b"m1"), (3, b"m3")]
    router.reconcile()  # nothing held any more: nothing sent twice
    assert len(deliveries(sent)) == 3


def test_a_delivery_once_current_again_sends_what_was_held_first_and_nothing_twice() -> None:
    """The first delivery dispatched once current reconciles first (ids stay in order) and
    does not send again what the reconciliation sent."""
    live = ConnectionId("n1", 2, 1)
    state, consumer = held_consumer(live, [0, 1])
    replica = FakeReplica(state)
    router = EffectRouter("n1", incarnation=2)
    router.use_replica(replica)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    router.register(live, sent.append)
    replica.current = False
    router.dispatch([delivery_of(live, 0, 1)])
    consumer.checked_out[2] = Message(b"m2", None)  # the entry being applied now delivers 2
    replica.current = True
    router.dispatch([delivery_of(live, 2)])
    assert deliveries(sent) == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    consumer.checked_out[3] = Message(b"m3", None)
    router.dispatch([delivery_of(live, 3)])
    assert deliveries(sent)[-1] == (3, b"m3") and len(deliveries(sent)) == 4


def test_held_deliveries_of_a_closed_connection_or_a_gone_consumer_are_forgotten() -> None:
    """Nothing is reconciled for a connection that closed or a consumer the state no longer has."""
    live, other = ConnectionId("n1", 2, 1), ConnectionId("n1", 2, 2)
    state, _consumer = held_consumer(live, [0])
    replica = FakeReplica(state)
    router = EffectRouter("n1", incarnation=2)
    router.use_replica(replica)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    router.register(live, sent.append)
    router.register(other, sent.append)
    replica.current = False
    router.dispatch([delivery_of(live, 0), delivery_of(other, 0)])
    router.unregister(live)
    replica.current = True
    router.reconcile()
    assert sent == []
