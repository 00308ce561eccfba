"""Effect routing: the node that owns a connection executes the effects addressed to it.

A connection id carries its node and that node's incarnation, so effects replayed from the
journal after a restart (older incarnation) find no live connection and are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cluster import protocol
from fifo.commands import ConnectionId
from fifo.effects import Deliver
from raft.fastcodec import encode_effect

Send = Callable[[dict[str, Any]], None]
# an effect frame's body must fit the frame limit with room for the frame's own map
EFFECT_BYTES_MAX = protocol.FRAME_BYTES_MAX_DEFAULT - 64 * 1024


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
    """Live client connections of this node incarnation, by connection number."""

    def __init__(self, node_id: str, incarnation: int) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self._live: dict[int, Send] = {}
        self._handlers: dict[int, Callable[[Any], None]] = {}  # AMQP connections: raw effects
        self.sent = 0
        self.dropped = 0

    def register(self, connection: ConnectionId, send: Send) -> None:
        """Start routing effects for a connection to `send`."""
        self._live[connection.number] = send

    def register_effects(self, connection: ConnectionId, handler: Callable[[Any], None]) -> None:
        """Start handing a connection's effects, as they are, to `handler` (AMQP connections:
        they translate effects themselves, never a native frame)."""
        self._handlers[connection.number] = handler

    def unregister(self, connection: ConnectionId) -> None:
        """Stop routing effects for a closed connection."""
        self._live.pop(connection.number, None)
        self._handlers.pop(connection.number, None)

    def is_live(self, number: int) -> bool:
        """Whether the connection with this number (of this incarnation) has a session."""
        return number in self._live or number in self._handlers

    def owns(self, connection: ConnectionId) -> bool:
        """Whether `connection` belongs to this node incarnation."""
        return connection.node == self.node_id and connection.incarnation == self.incarnation

    def dispatch(self, effects: list[Any]) -> None:
        """Send every effect addressed to one of our live connections, in order."""
        for effect in effects:
            connection = getattr(effect, "connection", None)
            if not isinstance(connection, ConnectionId) or connection.node != self.node_id:
                continue
            send = self._live.get(connection.number) if self.owns(connection) else None
            if send is None and self._handlers and self.owns(connection):
                handler = self._handlers.get(connection.number)
                if handler is not None:
                    handler(effect)
                    self.sent += 1
                    continue
            if send is None:
                self.dropped += 1  # replayed effect, or the client is gone
                continue
            encoded = encode_effect(effect)
            if len(encoded) > EFFECT_BYTES_MAX and isinstance(effect, Deliver):
                for part in split_delivery(effect):
                    send(protocol.effect(encode_effect(part)))
            else:
                send(protocol.effect(encoded))
            self.sent += 1
