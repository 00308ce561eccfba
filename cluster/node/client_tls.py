"""The client port of a `tls = true` node: accept, tell plaintext clients apart, TLS handshake.

A TLS client speaks first (its ClientHello: a record starting with byte 0x16); a quorumq client
without TLS waits in silence for the node's challenge. So each accepted socket is watched for
its first byte: 0x16 starts the TLS handshake (asyncio's, in the background, bounded by
TLS_HANDSHAKE_TIMEOUT_S); any other byte, or silence for FIRST_BYTE_WAIT_S, gets a
`tls_required` error frame in the clear saying what to do, then the socket is closed. Either
failure is logged once per connection; the loop never waits on a stranger's bytes.

Connections between accept and the end of their handshake are bounded (PENDING_TLS_MAX, and
PENDING_TLS_PER_SOURCE_MAX per source address): past a bound the node closes the OLDEST such
connection, not the new one. An honest client finishes its handshake in milliseconds, so a
stranger holding slots open (a ClientHello cut short, then silence) is what gets closed, and a
flood of them cannot keep honest clients out; a client whose handshake was cut retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable

import structlog

from cluster import protocol

log = structlog.get_logger("cluster.client_tls")

TLS_RECORD_HANDSHAKE = b"\x16"
# a TLS client sends its ClientHello as soon as it is connected; a plaintext one never does
FIRST_BYTE_WAIT_S = 1.0
TLS_HANDSHAKE_TIMEOUT_S = 5.0
TLS_SHUTDOWN_TIMEOUT_S = 2.0
# connections between accept and the end of their TLS handshake; more are closed at once
PENDING_TLS_MAX = 64
PENDING_TLS_PER_SOURCE_MAX = 16  # of them from one source address (host, without the port)
LISTEN_BACKLOG = 100
DISCARD_BYTES_MAX = 64 * 1024  # read (and dropped) before closing a plaintext connection
ACCEPT_RETRY_S = 0.1  # after accept failed (out of file descriptors, ...)
EVICTED_LOG_EVERY = 100  # a flood logs its first closed handshake, then every this many

ClientHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class TlsClientListener:
    """Listens on the client port and hands each TLS connection that completed its handshake
    to `on_client` as an asyncio (reader, writer) pair, like `asyncio.start_server`."""

    def __init__(
        self, context: ssl.SSLContext, node_id: str, address: str, on_client: ClientHandler
    ) -> None:
        self._context = context
        self._on_client = on_client
        self._refusal = protocol.encode_frame(
            protocol.error(
                protocol.TLS_REQUIRED,
                f"{node_id} at {address} speaks TLS (tls = true in its cluster.toml): connect "
                "with tls=<the cluster CA, D/tls/ca.crt> (CLI: --tls-ca FILE, or --data-dir D)",
            )
        )
        self._listeners: list[socket.socket] = []
        self.evicted = 0  # pending handshakes closed to make room (the slowest first)
        self._tasks: set[asyncio.Task[None]] = set()  # accept loops, connections in handshake
        self._sessions: set[asyncio.Task[None]] = set()  # left running by close(), like
        # asyncio.Server's: the node closes its sessions itself
        # connections before the end of their handshake -> source host, oldest first
        self._pending: dict[asyncio.Task[None], str] = {}

    async def start(self, host: str, port: int) -> None:
        """Bind and listen on every address of `host` (OSError when the port is taken)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, proto, _name, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self._listeners.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(LISTEN_BACKLOG)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        for sock in self._listeners:
            self._spawn(self._accept_loop(sock))

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets (one per address of the host it was started on)."""
        return tuple(self._listeners)

    def close(self) -> None:
        """Stop listening and drop the connections still before or in their TLS handshake
        (sessions already handed to `on_client` go on until the node closes them)."""
        for task in list(self._tasks):
            task.cancel()
        for sock in self._listeners:
            sock.close()
        self._listeners.clear()

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as err:
                log.error("client_accept_failed", error=str(err))
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            source = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            self._make_room(source)
            task: asyncio.Task[None] = asyncio.ensure_future(self._serve(sock, str(peer)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._pending[task] = source
            task.add_done_callback(self._forget_pending)

    def _make_room(self, source: str) -> None:
        """Close the oldest pending handshake of `source` when it holds its share of the
        slots, else the oldest of all when every slot is taken (see the module docstring)."""
        mine = [task for task, host in self._pending.items() if host == source]
        if len(mine) >= PENDING_TLS_PER_SOURCE_MAX:
            oldest = mine[0]
        elif len(self._pending) >= PENDING_TLS_MAX:
            oldest = next(iter(self._pending))
        else:
            return
        self._forget_pending(oldest)
        oldest.cancel()  # its _handshake closes the socket
        self.evicted += 1
        if self.evicted == 1 or self.evicted % EVICTED_LOG_EVERY == 0:
            log.warning(
                "client_tls_slowest_closed",
                source=source,
                pending=len(self._pending),
                closed_so_far=self.evicted,
            )

    def _forget_pending(self, task: asyncio.Task[None]) -> None:
        self._pending.pop(task, None)

    async def _serve(self, sock: socket.socket, peer: str) -> None:
        """One accepted connection: the TLS handshake, then the session (closed on failure)."""
        opened = await self._handshake(sock, peer)
        task = asyncio.current_task()
        if task is not None:
            self._forget_pending(task)
        if opened is None:
            return
        if task is not None:  # from now on a session: close() must not cancel it
            self._tasks.discard(task)
            self._sessions.add(task)
            task.add_done_callback(self._sessions.discard)
        await self._on_client(*opened)

    async def _handshake(
        self, sock: socket.socket, peer: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        loop = asyncio.get_running_loop()
        try:
            first = await _first_byte(sock)
            if first != TLS_RECORD_HANDSHAKE:
                if first != b"":  # (a connection closed at once is no client: not logged)
                    log.warning("client_without_tls", peer=peer, first_byte=first)
                    _refuse(sock, self._refusal)
                sock.close()
                return None
            reader = asyncio.StreamReader(loop=loop)
            stream = asyncio.StreamReaderProtocol(reader, loop=loop)
            transport, _ = await loop.connect_accepted_socket(
                lambda: stream,
                sock,
                ssl=self._context,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
                ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT_S,
            )
        except (OSError, ssl.SSLError, EOFError) as err:  # a bad certificate, garbage, a timeout
            log.warning("client_tls_failed", peer=peer, error=str(err) or type(err).__name__)
            sock.close()
            return None
        except BaseException:
            sock.close()
            raise
        return reader, asyncio.StreamWriter(transport, stream, reader, loop)


async def _first_byte(sock: socket.socket) -> bytes | None:
    """The first byte the peer sent (left in the socket), b"" at EOF, None after
    FIRST_BYTE_WAIT_S of silence."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await asyncio.wait_for(readable, FIRST_BYTE_WAIT_S)
    except TimeoutError:
        return None
    finally:
        loop.remove_reader(sock.fileno())
    try:
        return sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _refuse(sock: socket.socket, frame: bytes) -> None:
    """Send the `tls_required` frame and drop what the peer sent (closing a socket with unread
    bytes resets it, and the reset could destroy the frame before the peer reads it)."""
    with contextlib.suppress(OSError):
        sock.send(frame)
        sock.recv(DISCARD_BYTES_MAX)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
