"""Machine v4 (issue 32): deliveries reconciled from the state after catching up carry the
bodies read back for the state's references (never an empty body)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import fifo
from cluster.node.effects import EffectRouter
from fifo.bodies import resolve_deliver
from fifo.commands import ConnectionId, QueueConfig
from fifo.effects import Deliver, Delivery, RefDeliver, RefDelivery
from fifo.state import Consumer, Message, Queue, RefMessage, State

LIVE = ConnectionId("n1", 2, 1)
BODIES = {5 * 1024: b"ref-zero", 6 * 1024 + 3: b"ref-one!"}


class BodyReplica:
    """A replica whose state holds references; `resolve_now` reads them from BODIES."""

    def __init__(self, state: State) -> None:
        self.current = True
        self.state = state
        self.resolved: list[int] = []
        self.waiting = 0  # hand-overs of applied entries still waiting for their bodies

    def handovers_waiting(self) -> int:
        return self.waiting

    def applied_state_current(self) -> bool:
        return self.current

    def read(self, function: Any) -> Any:
        return function(SimpleNamespace(state=self.state))

    def resolve_now(self, effect: RefDeliver) -> Deliver:
        self.resolved.extend(m.ref for m in effect.messages if isinstance(m, RefDelivery))
        return resolve_deliver(effect, BODIES.__getitem__)


def holding_router() -> tuple[BodyReplica, EffectRouter, list[dict[str, Any]]]:
    """A router over a v4 state whose consumer holds ids 0 (a reference), 1 (an inline body
    from before v4) and 2 (a reference), after delivery 0 was held (the state not current)."""
    state = State(4)
    queue = Queue("q", QueueConfig(), 0)
    consumer = Consumer(1, "t", LIVE, 1)
    consumer.checked_out[0] = RefMessage(5 * 1024, 8, None)
    consumer.checked_out[1] = Message(b"inline", None)
    consumer.checked_out[2] = RefMessage(6 * 1024 + 3, 8, None)
    consumer.next_msg_id = 3
    queue.consumers[1] = consumer
    state.queues["q"] = queue
    replica = BodyReplica(state)
    router = EffectRouter("n1", incarnation=2)
    router.use_replica(replica)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    router.register(LIVE, sent.append)
    replica.current = False
    # (the replica hands the router resolved deliveries: Deliver, never RefDeliver)
    router.dispatch([Deliver(LIVE, "q", "t", 1, (Delivery(0, b"ref-zero", False, 0),))])
    assert sent == [] and router.held == 1
    return replica, router, sent


def test_reconciled_deliveries_of_references_carry_their_bodies() -> None:
    """Held deliveries of a v4 consumer come back, once current, with the bodies of their
    references (and an inline body from before v4 as it is), in id order."""
    replica, router, sent = holding_router()
    replica.current = True
    router.reconcile()
    effects = [fifo.decode(m["effect"]) for m in sent]
    bodies = [(d.msg_id, d.body) for e in effects if isinstance(e, Deliver) for d in e.messages]
    assert bodies == [(0, b"ref-zero"), (1, b"inline"), (2, b"ref-one!")]
    assert replica.resolved == [5 * 1024, 6 * 1024 + 3]


def test_a_reconciliation_ahead_of_waiting_hand_overs_sends_nothing_twice() -> None:
    """The v3 -> v4 rolling-upgrade test's duplicate (one run in seven): deliveries of entries
    already applied wait for their bodies (`Replica._in_order`) while a reconciliation reads
    the state, which holds them checked out already, and sends them; when the waiting
    hand-over came, it sent them again, unflagged, with the same ids."""
    replica, router, sent = holding_router()
    replica.current, replica.waiting = True, 1  # ids 1 and 2: applied, bodies being read
    router.reconcile()
    assert _ids(sent) == [0, 1, 2]
    replica.waiting = 0  # (the replica pops a hand-over before running it)
    router.dispatch([Deliver(LIVE, "q", "t", 1, (Delivery(1, b"inline", False, 0),
                                                 Delivery(2, b"ref-one!", False, 0)))])  # fmt: skip
    router.dispatch([Deliver(LIVE, "q", "t", 1, (Delivery(3, b"later", False, 0),))])
    assert _ids(sent) == [0, 1, 2, 3]


def _ids(sent: list[dict[str, Any]]) -> list[int]:
    effects = [fifo.decode(m["effect"]) for m in sent]
    return [d.msg_id for e in effects if isinstance(e, Deliver) for d in e.messages]
