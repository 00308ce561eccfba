"""The asyncio shell around `ClientProtocol`: an asyncio.Protocol feeds it bytes, a task ticks it.

Everything runs on the event loop that connected the client; nothing here is thread-safe.
Waiters wait on a future that the next event resolves, then re-check their condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Unpack

from cluster.client._options import ClientOptions, Settings, ShellView
from cluster.client._requests import Dialing, core_for, no_answer, status_probe
from cluster.client._wire import AnyFrame, Handshake, Welcome
from cluster.client.errors import ClientClosed, ClusterError
from cluster.client.sansio import (
    Answered,
    ClientProtocol,
    CloseConnection,
    Event,
    ReconnectNeeded,
)
from cluster.client.tls import client_context, handshake_failed, server_hostname
from fifo.commands import ConnectionId

_Answer = tuple[AnyFrame | None, ClusterError | None]


class _Link(asyncio.Protocol):
    """One TCP connection: the handshake first, then every byte goes to the client's protocol."""

    def __init__(self, client: AsyncShell, handshake: Handshake) -> None:
        self.client = client
        self.handshake = handshake
        self.ready: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.early = b""  # bytes after the welcome, before the client took the link
        self.attached = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.attached:
            self.client.on_data(self, data)
        elif self.ready.done():
            self.early += data
        else:
            self._handshake(data)

    def _handshake(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            welcome = self.handshake.receive_data(data)
        except ClusterError as err:
            self.ready.set_exception(err)
            self.transport.close()
            return
        out = self.handshake.data_to_send()
        if out:
            self.transport.write(out)
        if welcome is not None:
            self.early = self.handshake.leftover
            self.ready.set_result(welcome)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.ready.done():
            self.ready.set_exception(self.handshake.connection_closed())
        elif self.attached:
            self.client.on_lost(self, exc)

    def pause_writing(self) -> None:
        self.client.on_pause_writing()

    def resume_writing(self) -> None:
        self.client.on_resume_writing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class AsyncShell(ShellView):
    """Drives a `ClientProtocol` on an event loop; `AsyncClient` adds the user-facing calls."""

    def __init__(
        self, endpoints: Sequence[str], client_key: bytes, **options: Unpack[ClientOptions]
    ) -> None:
        self.settings = settings = Settings(**options)
        self._tls = client_context(settings.tls)
        self.core = core_for(endpoints, settings)
        self._client_key = client_key
        self._link: _Link | None = None
        self._waiters: dict[int, asyncio.Future[_Answer]] = {}
        self._waiting: list[asyncio.Future[None]] = []  # woken by the next event
        self._write_paused: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tick_wake = asyncio.Event()  # cut the ticker's wait short (a retry to send)
        self._connected = False

    # --- lifecycle -------------------------------------------------------------------------

    async def _connect(self) -> None:
        """Connect (once) to the first node that answers, then to the leader it names."""
        if self._connected:
            return
        self.core.check_usable()
        self.core.tick(time.monotonic())
        link = await self._connect_any(self.core.endpoints, self.settings.retry_s)
        if self.prefer_leader:
            link = await self._leader_instead(link)
        self._attach(link)
        self._connected = True
        self._spawn(self._tick_loop())

    async def _shutdown(self) -> None:
        """Flush pending acks, close the connection and fail every request still in flight."""
        core = self.core
        if not core.closed and core.failure is None and self._link is not None:
            consumers = core.consumers()
            for consumer in consumers:
                core.flush_acks(consumer)
            self.flush()
            await self.wait_until(lambda: all(c.outstanding <= 0 for c in consumers), 2.0)
        events = core.close()
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self._handle(events)
        for task in list(self._tasks):
            task.cancel()

    async def connection_id(self) -> ConnectionId:
        """This client's current ConnectionId, as assigned by its node (waits while away)."""
        core = self.core
        core.check_usable()
        await self.wait_until(lambda: core.connection_id is not None or _unusable(core), None)
        core.check_usable()
        if core.connection_id is None:
            raise ClientClosed("the client was closed")
        return core.connection_id

    # --- connecting ------------------------------------------------------------------------

    async def _open(self, address: str) -> _Link:
        loop = asyncio.get_running_loop()
        host, port = server_hostname(address), address.rpartition(":")[2]
        handshake = Handshake(address, self._client_key, self.name)
        link: _Link | None = None
        tls = self._tls

        async def connect() -> _Link:
            nonlocal link
            try:
                _, link = await loop.create_connection(
                    lambda: _Link(self, handshake),
                    host,
                    int(port),
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                    ssl_handshake_timeout=self.connect_timeout_s if tls is not None else None,
                )
            except ssl.SSLError as err:
                raise handshake_failed(address, err) from err
            await link.ready
            return link

        try:
            return await asyncio.wait_for(connect(), self.connect_timeout_s)
        except BaseException:
            if link is not None:
                link.close()
            raise

    async def _connect_any(self, endpoints: list[str], retry_s: float) -> _Link:
        dialing = Dialing(endpoints, time.monotonic() + retry_s)
        while True:
            self.core.check_usable()
            for address in dialing.endpoints:
                try:
                    return await self._open(address)
                except Exception as err:  # (Dialing re-raises what must not be retried)
                    dialing.failed(address, err)
            await asyncio.sleep(dialing.pause_after_round(time.monotonic()))

    async def _leader_instead(self, link: _Link) -> _Link:
        address = link.ready.result().leader_address()
        if address is None:
            return link
        try:
            leader = await self._open(address)
        except (OSError, ClusterError, ValueError, TimeoutError):
            return link
        link.close()
        return leader

    def _attach(self, link: _Link) -> None:
        if self.core.closed:
            link.close()
            return
        if link.lost:
            raise ConnectionError("the connection closed right after its handshake")
        self._link, link.attached = link, True
        events = self.core.connection_made(link.ready.result(), now=time.monotonic())
        events += self.core.receive_data(link.early)
        link.early = b""
        self.flush()
        self._handle(events)

    async def _reconnect(self, endpoints: tuple[str, ...]) -> None:
        while True:
            try:
                link = await self._connect_any(list(endpoints), self.reconnect_timeout_s)
                self._attach(link)
                return
            except ConnectionError:
                continue
            except ClusterError as err:
                self._handle(self.core.fail(err))
                return

    def on_data(self, link: _Link, data: bytes) -> None:
        if link is not self._link:
            return
        try:
            events = self.core.receive_data(data)
        except ClusterError as err:  # a broken stream: drop the connection, reconnect
            link.close()
            self.on_lost(link, err)
            return
        if self.core.retrying:  # the ticker may be in its idle wait
            self._tick_wake.set()
        self.flush()
        self._handle(events)

    def on_lost(self, link: _Link, error: BaseException | None) -> None:
        if link is not self._link:
            return
        self._link = None
        self.on_resume_writing()
        self._handle(self.core.connection_lost(error))

    async def _tick_loop(self) -> None:
        core = self.core
        while not core.closed and core.failure is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._tick_wake.wait(), core.tick_wait_s())
            self._tick_wake.clear()
            events = core.tick(time.monotonic())
            self.flush()
            self._handle(events)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- bytes, events and waiting ------------------------------------------------------------

    def flush(self) -> None:
        data = self.core.data_to_send()
        link = self._link
        if data and link is not None and link.transport is not None:
            link.transport.write(data)

    def _handle(self, events: list[Event]) -> None:
        if not events:
            return
        for event in events:
            if isinstance(event, Answered):
                waiter = self._waiters.pop(event.request_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result((event.answer, event.error))
            elif isinstance(event, CloseConnection) and self._link is not None:
                self._link.close()
            elif isinstance(event, ReconnectNeeded):
                self._spawn(self._reconnect(event.endpoints))
        self.notify()

    def notify(self) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            _wake(waiter)

    async def wait_until(self, ready: Callable[[], bool], timeout_s: float | None) -> bool:
        """Wait until `ready()` holds (checked after every event) or the timeout; False then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        loop = asyncio.get_running_loop()
        while not ready():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiting.append(waiter)
            timer = loop.call_later(1.0 if left is None else min(left, 1.0), _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
        return True

    def on_pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = asyncio.get_running_loop().create_future()

    def on_resume_writing(self) -> None:
        paused, self._write_paused = self._write_paused, None
        if paused is not None and not paused.done():
            paused.set_result(None)

    async def writable(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if self._write_paused is not None:
            await asyncio.shield(self._write_paused)

    async def request(
        self, send: Callable[[], int], timeout_s: float, what: str, *, explain: bool = True
    ) -> AnyFrame:
        request_id = send()
        waiter: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        self.flush()
        try:
            answer, error = await asyncio.wait_for(waiter, timeout_s + 1.0)
        except TimeoutError:
            self.core.forget([request_id])
            self._waiters.pop(request_id, None)
            answer, error = None, no_answer(what, timeout_s)
        if error is not None:
            raise (await self.explain(error)) if explain else error
        assert answer is not None
        return answer

    async def explain(self, error: ClusterError) -> ClusterError:
        """A timeout becomes Unavailable when the node says it has no quorum (a status query,
        answered without the log); any other error, or no answer, stays as it is."""
        probe = status_probe(self.core, error, time.monotonic)
        if probe is None:
            return error
        try:
            answer = await self.request(probe.send, probe.timeout_s, "status", explain=False)
        except ClusterError:
            return error
        return probe.explain(answer, error)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _unusable(core: ClientProtocol) -> bool:
    return core.closed or core.failure is not None
