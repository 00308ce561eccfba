"""The node's AMQP 0-9-1 port: accepts connections (TLS, amqps, when the cluster has
`tls = true`), bounds how many are open, and closes them all when the node stops or resets."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from pamqp import commands

from cluster.amqp import frames, limits
from cluster.amqp.connection import AmqpConnection
from cluster.amqp.errors import NOT_ALLOWED, reply_text
from cluster.node.listening import log_sockets

if TYPE_CHECKING:
    from cluster.node.server import NodeServer

log = structlog.get_logger("cluster.amqp")


class AmqpListener:
    """Serves `amqp_port` for one node."""

    def __init__(self, server: NodeServer, port: int, guest_allowed: bool) -> None:
        self.server = server
        self.port = port
        self.guest_allowed = guest_allowed
        self.connections: set[AmqpConnection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str) -> None:
        """Listen (OSError when the port is taken: the node fails to start, as for its client
        port)."""
        self._server = await asyncio.start_server(
            self._accepted, host=host, port=self.port, ssl=self.server.client_tls
        )
        log_sockets("amqp", self._server.sockets, tls=self.server.client_tls is not None)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= limits.connections_per_node_max:
            await _refuse(reader, writer)
            return
        connection = AmqpConnection(self.server, reader, writer, self.guest_allowed)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    def close_all(self) -> None:
        """Close every connection (the node resets its sessions or stops)."""
        for connection in list(self.connections):
            connection.shutdown()

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        if self._server is not None:
            self._server.close()
        self.close_all()


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Past the connection limit: answer the protocol header with 530 and close."""
    try:
        await asyncio.wait_for(reader.readexactly(8), limits.handshake_timeout_s)
        text = reply_text(NOT_ALLOWED, "access to vhost '/' refused: too many connections")
        close = commands.Connection.Close(reply_code=NOT_ALLOWED, reply_text=text)
        writer.write(frames.encode_method(0, close))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()
