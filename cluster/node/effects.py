"""Effect routing: the node that owns a connection executes the effects addressed to it.

A connection id carries its node and that node's incarnation, so effects replayed from the
journal after a restart (older incarnation) find no live connection and are dropped.

Only current state is delivered (issue 24, DESIGN.md section 8): a delivery goes out only while
the node's applied state is current (`Replica.applied_state_current`, the rule in
raft/contact.py). A delivery applied while it is not (a paused or cut-off node catching up) is
held, never replayed: once current, each consumer it was for is reconciled from the state, which
says what that consumer still holds; only those messages, from the first one held, are sent.
Message ids grow per consumer and a consumer's deliveries are sent in order, so every id from
the first held one on was never sent. A follower applying a batch of committed entries holds
the deliveries of those before the leader's commit index (a later one may take them back):
the first hold asks for a reconciliation right after the current tick, when the batch is
applied, so a steady follower adds no wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import structlog

from cluster import protocol
from fifo.commands import ConnectionId, ConsumerKey
from fifo.effects import Deliver, Delivery, RefDeliver, RefDelivery
from fifo.state import Consumer, RefMessage
from raft.fastcodec import encode_effect
from raft.replica import Replica, ReplicaView

log = structlog.get_logger("cluster.effects")

Send = Callable[[dict[str, Any]], None]
Sink = Callable[[Any], None]  # takes one effect as it is (an AMQP connection translates it)
Slot = tuple[str, ConsumerKey]  # (queue, consumer key) of one consumer of a connection
# an effect frame's body must fit the frame limit with room for the frame's own map
EFFECT_BYTES_MAX = protocol.FRAME_BYTES_MAX_DEFAULT - 64 * 1024
# a hold at least this long is logged at info (shorter ones, a follower's batch, at debug)
HELD_LOG_S = 0.2


def split_delivery(effect: Deliver, limit: int = EFFECT_BYTES_MAX) -> list[Deliver]:
    """A delivery too large for one frame (a prefetch of large messages) as several, in order,
    each under `limit` (a message alone over it stays alone: publish bodies are smaller)."""
    parts: list[Deliver] = []
    chunk: list[Any] = []
    size = 0
    for message in effect.messages:
        cost = len(message.body) + 256  # the message's fields and annotations, generously
        if chunk and size + cost > limit:
            parts.append(dataclasses.replace(effect, messages=tuple(chunk)))
            chunk, size = [], 0
        chunk.append(message)
        size += cost
    if chunk:
        parts.append(dataclasses.replace(effect, messages=tuple(chunk)))
    return parts


class EffectRouter:
    """Live client connections of this node incarnation, by connection number; deliveries go
    out only while the replica's applied state is current (held and reconciled otherwise)."""

    def __init__(self, node_id: str, incarnation: int) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self._live: dict[int, Send] = {}
        self._handlers: dict[int, Sink] = {}  # AMQP connections: raw effects
        self._replica: Replica | None = None
        # connection number -> consumer -> the lowest message id held (never sent)
        self._held: dict[int, dict[Slot, int]] = {}
        self._held_since = 0.0  # monotonic time of the first hold since the last reconciliation
        # (connection, consumer) -> the highest id a reconciliation sent, kept while hand-overs
        # of entries applied before it still wait for their bodies (machine v4,
        # `Replica.handovers_waiting`): their deliveries were in the state it read, so sent
        self._reconciled: dict[tuple[int, Slot], int] = {}
        self._soon = False  # a reconciliation is asked for right after the current tick
        self.sent = 0
        self.dropped = 0
        self.held = 0  # deliveries held because the state was not current
        self.reconciled = 0  # messages sent by a reconciliation

    def use_replica(self, replica: Replica) -> None:
        """Gate deliveries on `replica`'s currency and reconcile them from its state."""
        self._replica = replica

    def register(self, connection: ConnectionId, send: Send) -> None:
        """Start routing effects for a connection to `send`."""
        self._live[connection.number] = send

    def register_effects(self, connection: ConnectionId, handler: Sink) -> None:
        """Start handing a connection's effects, as they are, to `handler` (AMQP connections:
        they translate effects themselves, never a native frame); deliveries are held and
        reconciled for them as for native sessions."""
        self._handlers[connection.number] = handler

    def unregister(self, connection: ConnectionId) -> None:
        """Stop routing effects for a closed connection."""
        self._live.pop(connection.number, None)
        self._handlers.pop(connection.number, None)
        self._held.pop(connection.number, None)
        for mark in [mark for mark in self._reconciled if mark[0] == connection.number]:
            del self._reconciled[mark]

    def is_live(self, number: int) -> bool:
        """Whether the connection with this number (of this incarnation) has a session."""
        return number in self._live or number in self._handlers

    def _sink(self, connection: ConnectionId) -> Sink | None:
        """Where `connection`'s effects go: its native session (framed, deliveries split to
        fit a frame), its AMQP handler, or nowhere (replayed, or the client is gone)."""
        if not self.owns(connection):
            return None
        send = self._live.get(connection.number)
        if send is not None:
            return lambda effect: self._send_native(effect, send)
        return self._handlers.get(connection.number)

    def owns(self, connection: ConnectionId) -> bool:
        """Whether `connection` belongs to this node incarnation."""
        return connection.node == self.node_id and connection.incarnation == self.incarnation

    def _current(self) -> bool:
        return self._replica is None or self._replica.applied_state_current()

    def dispatch(self, effects: list[Any]) -> None:
        """Send every effect addressed to one of our live connections, in order (deliveries
        only while the state is current: held otherwise)."""
        current: bool | None = None  # asked once per call: one entry's effects
        for effect in effects:
            connection = getattr(effect, "connection", None)
            if not isinstance(connection, ConnectionId) or connection.node != self.node_id:
                continue
            sink = self._sink(connection)
            if sink is None:
                self.dropped += 1  # replayed effect, or the client is gone
                continue
            if isinstance(effect, Deliver):
                if current is None:
                    current = self._current()
                    if current and self._held:  # what was held first: ids stay in order
                        self._reconcile()
                if not current:
                    self._hold(effect)
                    continue
                if self._reconciled:
                    effect = _unsent_part(effect, self._reconciled)
                    if effect is None:
                        continue
            sink(effect)
            self.sent += 1
        self._forget_reconciled()

    def reconcile(self) -> None:
        """If deliveries were held and the state is current now, send what the state says each
        of those consumers still holds (call periodically: the state may become current with
        no entry applied)."""
        if self._held and self._current():
            self._reconcile()
            self._forget_reconciled()

    def _hold(self, effect: Deliver) -> None:
        if not self._held:
            self._held_since = time.monotonic()
        if not self._soon:
            self._reconcile_soon()
        slots = self._held.setdefault(effect.connection.number, {})
        slot = (effect.queue, effect.consumer_key)
        first = effect.messages[0].msg_id if effect.messages else 0
        if not slots:
            log.debug("deliveries_held", connection=effect.connection.number, queue=effect.queue)
        slots[slot] = min(first, slots.get(slot, first))
        self.held += 1

    def _reconcile_soon(self) -> None:
        """Reconcile right after the current tick (its batch of entries applied), if on a loop;
        the node's periodic `reconcile` covers the rest."""
        with contextlib.suppress(RuntimeError):  # no loop: unit tests drive the router
            asyncio.get_running_loop().call_soon(self._reconcile_now)
            self._soon = True

    def _reconcile_now(self) -> None:
        self._soon = False
        self.reconcile()

    def _forget_reconciled(self) -> None:
        """Drop the reconciliation marks once no hand-over applied before it can come."""
        if self._reconciled and (self._replica is None or not self._replica.handovers_waiting()):
            self._reconciled = {}

    def _reconcile(self) -> None:
        """Send, per held consumer, the messages the state says it holds from the first held
        id on; mark the highest id sent per (connection, consumer)."""
        held, self._held = self._held, {}
        assert self._replica is not None  # only a replica-backed router holds
        deliveries = self._replica.read(lambda view: _still_held(view, held, self))
        for delivery in self._with_bodies(deliveries):
            sink = self._sink(delivery.connection)
            if sink is None:
                continue
            sink(delivery)
            self.sent += 1
            self.reconciled += len(delivery.messages)
            mark = (delivery.connection.number, (delivery.queue, delivery.consumer_key))
            upto = delivery.messages[-1].msg_id
            self._reconciled[mark] = max(upto, self._reconciled.get(mark, upto))
        held_s = time.monotonic() - self._held_since
        level = log.info if held_s >= HELD_LOG_S else log.debug
        level("deliveries_reconciled", consumers=len(deliveries), messages=self.reconciled,
              held_ms=round(held_s * 1000))  # fmt: skip

    def _with_bodies(self, deliveries: list[RefDeliver]) -> list[Deliver]:
        """The reconciled deliveries with their bodies: machine v4's references are read now
        (reconciliation is rare, once after catching up, bounded by the held prefetch)."""
        assert self._replica is not None
        out: list[Deliver] = []
        for delivery in deliveries:
            if any(type(m) is RefDelivery for m in delivery.messages):
                resolved = self._replica.resolve_now(delivery)
                if resolved is not None:
                    out.append(resolved)
            else:  # bodies held inline (v1-v3, or converted from v3)
                inline = tuple(m for m in delivery.messages if type(m) is Delivery)
                out.append(Deliver(delivery.connection, delivery.queue, delivery.tag,
                                   delivery.consumer_key, inline))  # fmt: skip
        return out

    @staticmethod
    def _send_native(effect: Any, send: Send) -> None:
        encoded = encode_effect(effect)
        if isinstance(effect, Deliver) and len(encoded) > EFFECT_BYTES_MAX:
            for part in split_delivery(effect):
                send(protocol.effect(encode_effect(part)))
        else:
            send(protocol.effect(encoded))


def _still_held(
    view: ReplicaView, held: dict[int, dict[Slot, int]], router: EffectRouter
) -> list[RefDeliver]:
    """Deliveries of what each held consumer still holds in the state, from its first held id."""
    out: list[RefDeliver] = []
    for number, slots in held.items():
        if not router.is_live(number):
            continue
        for (queue_name, key), first in slots.items():
            queue = view.state.queues.get(queue_name)
            consumer = queue.consumers.get(key) if queue is not None else None
            if consumer is None or consumer.connection.number != number:
                continue
            if not router.owns(consumer.connection):
                continue
            messages = _held_messages(consumer, first)
            if messages:
                out.append(
                    RefDeliver(consumer.connection, queue_name, consumer.tag, key, messages)
                )
    return out


def _held_messages(consumer: Consumer, first: int) -> tuple[Delivery | RefDelivery, ...]:
    """The consumer's checked-out messages from id `first` on, as the machine delivers them
    (machine v4: by body reference, resolved before sending)."""
    out: list[Delivery | RefDelivery] = []
    for mid, m in sorted(consumer.checked_out.items()):
        if mid < first:
            continue
        redelivered = m.acquired_count > 0 or m.delivery_count > 0
        if type(m) is RefMessage:
            out.append(RefDelivery(mid, m.ref, m.size, redelivered, m.delivery_count,
                                   m.annotations))  # fmt: skip
        else:
            out.append(Delivery(mid, m.body, redelivered, m.delivery_count, m.annotations))
    return tuple(out)


def _unsent_part(effect: Deliver, sent: dict[tuple[int, Slot], int]) -> Deliver | None:
    """`effect` without the messages a reconciliation sent (None when nothing is left)."""
    upto = sent.get((effect.connection.number, (effect.queue, effect.consumer_key)))
    if upto is None:
        return effect
    rest = tuple(m for m in effect.messages if m.msg_id > upto)
    return dataclasses.replace(effect, messages=rest) if rest else None
