"""Effect routing: only live connections of this node incarnation receive effects."""

from __future__ import annotations

from typing import Any

import fifo
from cluster.node.effects import EffectRouter
from cluster.node.session import bind_connection
from fifo.commands import Checkout, ConnectionId, ConsumerId, Enqueue, SimplePrefetch
from fifo.effects import CreditReply, DeadLettered, Deliver, Delivery


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
