"""Effect routing: the node that owns a connection executes the effects addressed to it.

A connection id carries its node and that node's incarnation, so effects replayed from the
journal after a restart (older incarnation) find no live connection and are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster import protocol
from fifo.commands import ConnectionId
from raft.fastcodec import encode_effect

Send = Callable[[dict[str, Any]], None]


class EffectRouter:
    """Live client connections of this node incarnation, by connection number."""

    def __init__(self, node_id: str, incarnation: int) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self._live: dict[int, Send] = {}
        self.sent = 0
        self.dropped = 0

    def register(self, connection: ConnectionId, send: Send) -> None:
        """Start routing effects for a connection to `send`."""
        self._live[connection.number] = send

    def unregister(self, connection: ConnectionId) -> None:
        """Stop routing effects for a closed connection."""
        self._live.pop(connection.number, None)

    def is_live(self, number: int) -> bool:
        """Whether the connection with this number (of this incarnation) has a session."""
        return number in self._live

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
            if send is None:
                self.dropped += 1  # replayed effect, or the client is gone
                continue
            send(protocol.effect(encode_effect(effect)))
            self.sent += 1
