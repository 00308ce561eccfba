"""The asyncio client: `ClientProtocol` driven by an asyncio.Protocol, with the threaded API's
features as coroutines.

Example:
    async with AsyncClient.from_data_dir(Path("D")) as client:
        await client.declare_queue("jobs")
        async with client.publisher("jobs", window=1000) as publisher:
            await publisher.publish_many(b"job %d" % i for i in range(10_000))
        async for message in client.consume("jobs", prefetch=100):
            await message.ack()

Everything runs on the event loop that connected the client; no call is thread-safe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, overload

from cluster import config as cluster_config
from cluster import protocol
from cluster.client import results
from cluster.client._state import Buffered, ConsumerState
from cluster.client._wire import AnyFrame, Frame, Handshake, Welcome
from cluster.client.errors import (
    AuthError,
    ClientClosed,
    ClusterError,
    CommandRefused,
    RequestTimeout,
    Unavailable,
)
from cluster.client.sansio import (
    TICK_S,
    Answered,
    ClientProtocol,
    CloseConnection,
    Event,
    ReconnectNeeded,
)
from fifo.codec import decode, encode
from fifo.commands import (
    Cancel,
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    DeclareQueue,
    DeleteQueue,
    Dequeue,
    Discard,
    Modify,
    Purge,
    QueueConfig,
    Remove,
    RenewLocks,
    Return,
    Settle,
    UpdateConfig,
)
from fifo.effects import CreditReply
from fifo.queries import ConsumerInfo, MessageInfo, QueueOverview
from fifo.replies import CancelOk, DeclareOk, DeleteOk, DequeueOk, Error, PurgeOk, Reply

_T = TypeVar("_T")
QueryArgs = dict[str, str | int]
_Answer = tuple[AnyFrame | None, ClusterError | None]


class _Link(asyncio.Protocol):
    """One TCP connection: the handshake first, then every byte goes to the client's protocol."""

    def __init__(self, client: AsyncClient, handshake: Handshake) -> None:
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
            self.client._on_data(self, data)
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
            self.client._on_lost(self, exc)

    def pause_writing(self) -> None:
        self.client._pause_writing()

    def resume_writing(self) -> None:
        self.client._resume_writing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class AsyncClient:
    """An asyncio connection to a quorumq cluster; `async with AsyncClient(...) as client`.

    The options are those of `Client`. Nothing connects until `connect()` (or `async with`).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        client_key: bytes,
        *,
        name: str = "quorumq-client",
        connect_timeout_s: float = 2.0,
        request_timeout_s: float = 30.0,
        reconnect_timeout_s: float = 30.0,
        reconnect: bool = True,
        silence_timeout_s: float = 5.0,
        connect_retry_s: float | None = None,
        prefer_leader: bool = True,
    ) -> None:
        self._core = ClientProtocol(
            endpoints, name=name, reconnect=reconnect, silence_timeout_s=silence_timeout_s
        )
        self._client_key = client_key
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.silence_timeout_s = silence_timeout_s
        self.connect_retry_s = connect_timeout_s if connect_retry_s is None else connect_retry_s
        self.prefer_leader = prefer_leader
        self._link: _Link | None = None
        self._waiters: dict[int, asyncio.Future[_Answer]] = {}
        self._change: asyncio.Future[None] | None = None
        self._write_paused: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connected = False

    @classmethod
    def from_data_dir(
        cls,
        data_dir: Path,
        *,
        name: str = "quorumq-client",
        connect_timeout_s: float = 2.0,
        request_timeout_s: float = 30.0,
        reconnect_timeout_s: float = 30.0,
        reconnect: bool = True,
        silence_timeout_s: float = 5.0,
        connect_retry_s: float | None = None,
        prefer_leader: bool = True,
    ) -> AsyncClient:
        """A client for the endpoints of `D/cluster.toml` and the key in `D/client.key`."""
        config = cluster_config.load(Path(data_dir))
        key = cluster_config.read_client_key(Path(data_dir) / cluster_config.CLIENT_KEY_FILE)
        return cls(
            list(config.endpoints().values()),
            key,
            name=name,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            reconnect_timeout_s=reconnect_timeout_s,
            reconnect=reconnect,
            silence_timeout_s=silence_timeout_s,
            connect_retry_s=connect_retry_s,
            prefer_leader=prefer_leader,
        )

    # --- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Connect (once) to the first node that answers, then to the leader it names."""
        if self._connected:
            return self
        self._core.check_usable()
        self._core.tick(time.monotonic())
        link = await self._connect_any(self._core.endpoints, self.connect_retry_s)
        if self.prefer_leader:
            link = await self._leader_instead(link)
        self._attach(link)
        self._connected = True
        self._spawn(self._tick_loop())
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush pending acks, close the connection and fail every request still in flight."""
        core = self._core
        if not core.closed and core.failure is None and self._link is not None:
            consumers = core.consumers()
            for consumer in consumers:
                core.flush_acks(consumer)
            self._flush()
            await self._wait_until(lambda: all(c.outstanding <= 0 for c in consumers), 2.0)
        events = core.close()
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self._handle(events)
        for task in list(self._tasks):
            task.cancel()

    @property
    def reconnects(self) -> int:
        """How many times the client connected again after losing a connection."""
        return self._core.reconnects

    @property
    def node(self) -> str | None:
        """The node this client is connected to now (None while reconnecting)."""
        welcome = self._core.welcome
        return welcome.node if welcome else None

    @property
    def endpoints(self) -> list[str]:
        """The endpoints known to this client (those given plus those learnt from nodes)."""
        return list(self._core.endpoints)

    async def connection_id(self) -> ConnectionId:
        """This client's current ConnectionId, as assigned by its node (waits while away)."""
        core = self._core
        core.check_usable()
        await self._wait_until(lambda: core.connection_id is not None or _unusable(core), None)
        core.check_usable()
        if core.connection_id is None:
            raise ClientClosed("the client was closed")
        return core.connection_id

    # --- connecting ------------------------------------------------------------------------

    async def _open(self, address: str) -> _Link:
        loop = asyncio.get_running_loop()
        host, _, port = address.rpartition(":")
        handshake = Handshake(address, self._client_key, self.name)
        link: _Link | None = None

        async def connect() -> _Link:
            nonlocal link
            _, link = await loop.create_connection(lambda: _Link(self, handshake), host, int(port))
            await link.ready
            return link

        try:
            return await asyncio.wait_for(connect(), self.connect_timeout_s)
        except BaseException:
            if link is not None:
                link.close()
            raise

    async def _connect_any(self, endpoints: list[str], retry_s: float) -> _Link:
        deadline = time.monotonic() + retry_s
        errors: list[str] = []
        while True:
            self._core.check_usable()
            for address in endpoints:
                try:
                    return await self._open(address)
                except AuthError:
                    raise
                except (OSError, ClusterError, ValueError, TimeoutError) as err:
                    errors.append(f"{address}: {err!r}")
            if time.monotonic() >= deadline:
                tried = "; ".join(errors[-len(endpoints) :])
                raise Unavailable(f"no quorumq node reachable ({tried})")
            await asyncio.sleep(0.1)

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
        if self._core.closed:
            link.close()
            return
        if link.lost:
            raise ConnectionError("the connection closed right after its handshake")
        self._link, link.attached = link, True
        events = self._core.connection_made(link.ready.result())
        events += self._core.receive_data(link.early)
        link.early = b""
        self._flush()
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
                self._handle(self._core.fail(err))
                return

    def _on_data(self, link: _Link, data: bytes) -> None:
        if link is not self._link:
            return
        try:
            events = self._core.receive_data(data)
        except ClusterError as err:  # a broken stream: drop the connection, reconnect
            link.close()
            self._on_lost(link, err)
            return
        self._flush()
        self._handle(events)

    def _on_lost(self, link: _Link, error: BaseException | None) -> None:
        if link is not self._link:
            return
        self._link = None
        self._resume_writing()
        self._handle(self._core.connection_lost(error))

    async def _tick_loop(self) -> None:
        core = self._core
        while not core.closed and core.failure is None:
            await asyncio.sleep(TICK_S)
            events = core.tick(time.monotonic())
            self._flush()
            self._handle(events)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- bytes, events and waiting ------------------------------------------------------------

    def _flush(self) -> None:
        data = self._core.data_to_send()
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
        self._notify()

    def _notify(self) -> None:
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)

    async def _wait_until(self, ready: Callable[[], bool], timeout_s: float | None) -> bool:
        """Wait until `ready()` holds (checked after every event) or the timeout; False then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not ready():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if self._change is None:
                self._change = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._change], timeout=1.0 if left is None else min(left, 1.0))
        return True

    def _pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = asyncio.get_running_loop().create_future()

    def _resume_writing(self) -> None:
        paused, self._write_paused = self._write_paused, None
        if paused is not None and not paused.done():
            paused.set_result(None)

    async def _writable(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if self._write_paused is not None:
            await asyncio.shield(self._write_paused)

    async def _request(self, send: Callable[[], int], timeout_s: float, what: str) -> AnyFrame:
        request_id = send()
        waiter: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        self._flush()
        try:
            answer, error = await asyncio.wait_for(waiter, timeout_s + 1.0)
        except TimeoutError:
            self._core.forget([request_id])
            self._waiters.pop(request_id, None)
            raise RequestTimeout(f"no answer to {what} within {timeout_s:.1f}s") from None
        if error is not None:
            raise error
        assert answer is not None
        return answer

    # --- requests --------------------------------------------------------------------------

    async def call(self, frame: Frame, timeout_s: float | None = None) -> Frame:
        """Send one request and wait for its answer frame (`reply` or `result`)."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        core = self._core
        answer = await self._request(
            lambda: core.submit(frame, timeout), timeout, str(frame.get("op"))
        )
        return dict(answer)

    async def command(self, command: Command, timeout_s: float | None = None) -> Reply:
        """Run one command through the log; CommandRefused for an error reply."""
        answer = await self.call(protocol.command(0, encode(command)), timeout_s)
        return _reply(answer)

    async def query(
        self, name: str, args: QueryArgs | None = None, timeout_s: float | None = None
    ) -> object:
        """A read-only query answered from the connected node's state, as plain data."""
        return (await self.call(protocol.query(0, name, dict(args or {})), timeout_s))["result"]

    async def admin(
        self, action: str, args: QueryArgs | None = None, timeout_s: float | None = None
    ) -> dict[str, object]:
        """An admin action (machine_upgrade, snapshot, ...); its result map."""
        answer = await self.call(protocol.admin(0, action, dict(args or {})), timeout_s)
        return results.mapping(answer["result"], action)

    # --- queue management ------------------------------------------------------------------

    async def declare_queue(self, queue: str, config: QueueConfig | None = None) -> DeclareOk:
        """Create `queue` (a no-op when it exists with an equal config)."""
        return _expect(await self.command(DeclareQueue(queue, config or QueueConfig())), DeclareOk)

    async def delete_queue(self, queue: str) -> DeleteOk:
        """Delete `queue` and everything in it."""
        return _expect(await self.command(DeleteQueue(queue)), DeleteOk)

    async def purge_queue(self, queue: str) -> PurgeOk:
        """Drop every ready message of `queue`."""
        return _expect(await self.command(Purge(queue)), PurgeOk)

    async def update_config(self, queue: str, config: QueueConfig) -> Reply:
        """Replace the config of `queue`."""
        return await self.command(UpdateConfig(queue, config))

    # --- publishing and consuming ----------------------------------------------------------

    def publisher(
        self, queue: str, *, window: int = 100, enqueuer: str | None = None
    ) -> AsyncPublisher:
        """A confirmed, pipelined publisher for `queue` with up to `window` unconfirmed messages."""
        return AsyncPublisher(self, queue, window=window, enqueuer=enqueuer)

    async def publish(
        self, queue: str, body: bytes, *, ttl_ms: int | None = None, timeout_s: float | None = None
    ) -> None:
        """Publish one message and wait for its confirm (a tracked enqueue, deduplicated)."""
        async with self.publisher(queue, window=1) as publisher:
            await publisher.publish(body, ttl_ms=ttl_ms)
            await publisher.wait_for_confirms(timeout_s or self.request_timeout_s)

    def consume(
        self,
        queue: str,
        *,
        prefetch: int = 100,
        credited: bool = False,
        priority: int = 0,
        timeout_ms: int | None = None,
        auto_ack: bool = False,
    ) -> AsyncConsumer:
        """A consumer; `async for` over it, or `await` it to attach first (it attaches once)."""
        return AsyncConsumer(
            self,
            queue,
            prefetch=prefetch,
            credited=credited,
            priority=priority,
            timeout_ms=timeout_ms,
            auto_ack=auto_ack,
        )

    async def get(self, queue: str, *, settled: bool = False) -> AsyncMessage | None:
        """Take one ready message (basic.get); unless `settled`, ack or nack it like a delivery."""
        tag = self._core.next_tag()
        conn_id = await self.connection_id()
        reply = await self.command(Checkout(queue, ConsumerId(tag, conn_id), Dequeue(settled)))
        if not isinstance(reply, DequeueOk):
            raise CommandRefused("unexpected_reply", f"dequeue answered {reply!r}")
        if reply.message is None:
            return None
        found = reply.message
        key = reply.consumer_key if reply.consumer_key is not None else ConsumerId(tag, conn_id)
        return AsyncMessage(
            queue,
            found.msg_id,
            found.body,
            found.redelivered,
            found.delivery_count,
            key,
            (),
            None if settled else _AsyncSettler(self, queue),
        )

    # --- queries ---------------------------------------------------------------------------

    @overload
    async def overview(self, queue: str) -> QueueOverview | None: ...

    @overload
    async def overview(self, queue: None = None) -> list[QueueOverview]: ...

    async def overview(
        self, queue: str | None = None
    ) -> QueueOverview | list[QueueOverview] | None:
        """The overview of one queue (None: no such queue), or of every queue when None."""
        if queue is None:
            return results.overviews(await self.query("overview"))
        return results.overview(await self.query("overview", {"queue": queue}))

    async def queues(self) -> list[str]:
        """Every queue's name, sorted."""
        return results.names(await self.query("queues"))

    async def consumers(self, queue: str | None = None) -> dict[str, list[ConsumerInfo]]:
        """The consumers of `queue` (of every queue when None), by queue name."""
        return results.consumers(await self.query("consumers", {"queue": queue} if queue else {}))

    async def messages(self, queue: str, limit: int = 100) -> list[MessageInfo]:
        """Up to `limit` messages of `queue` (ids, sizes, delivery counts; not the bodies)."""
        return results.messages(await self.query("messages", {"queue": queue, "limit": limit}))

    async def status(self) -> dict[str, object]:
        """The status map of the connected node (role, term, indexes, digest, versions, pid)."""
        return results.mapping(await self.query("status"), "status")

    async def machine(self) -> dict[str, object]:
        """The machine-version status (effective version, per-node support, past switches)."""
        return results.mapping(await self.query("machine"), "machine")


class AsyncPublisher:
    """Publishes to one queue as one enqueuer; `async with` waits for confirms at the end."""

    def __init__(
        self, client: AsyncClient, queue: str, *, window: int = 100, enqueuer: str | None = None
    ) -> None:
        self.client = client
        self._state = client._core.add_publisher(queue, window, enqueuer)

    @property
    def queue(self) -> str:
        """The queue published to."""
        return self._state.queue

    @property
    def window(self) -> int:
        """The most unconfirmed messages at a time."""
        return self._state.window

    @property
    def enqueuer(self) -> str:
        """The enqueuer id the queue deduplicates on."""
        return self._state.enqueuer

    @property
    def confirmed(self) -> int:
        """Messages confirmed so far."""
        return self._state.confirmed

    @property
    def resent(self) -> int:
        """Messages sent again after a sequence gap."""
        return self._state.resent

    @property
    def blocked(self) -> bool:
        """True while the queue refuses publishes (overflow `reject_publish`)."""
        return self._state.blocked

    @property
    def unconfirmed(self) -> int:
        """Messages sent (or queued to send) and not yet confirmed."""
        return len(self._state.pending)

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                await self.wait_for_confirms()
        finally:
            self.close()

    def close(self) -> None:
        """Stop tracking this publisher (unconfirmed messages are no longer resent)."""
        self.client._core.remove_publisher(self._state)

    async def publish(
        self, body: bytes, *, ttl_ms: int | None = None, timeout_s: float | None = None
    ) -> int:
        """Send one message (waits while the window is full); returns its sequence number."""
        return (await self.publish_many([body], ttl_ms=ttl_ms, timeout_s=timeout_s))[0]

    async def publish_many(
        self, bodies: Iterable[bytes], *, ttl_ms: int | None = None, timeout_s: float | None = None
    ) -> list[int]:
        """Send many messages, as many per write as the window allows; returns their seqs."""
        timeout = self.client.request_timeout_s if timeout_s is None else timeout_s
        core, state = self.client._core, self._state
        seqs: list[int] = []
        batch: list[bytes] = []
        room = 0
        for body in bodies:
            if not batch:
                room = core.room(state)
                if room <= 0:
                    room = await self._wait_for_room(timeout)
            batch.append(body)
            if len(batch) >= room:
                seqs += core.publish(state, batch, ttl_ms)
                self.client._flush()
                batch = []
                await self.client._writable()
        if batch:
            seqs += core.publish(state, batch, ttl_ms)
            self.client._flush()
        return seqs

    async def _wait_for_room(self, timeout_s: float) -> int:
        core, state = self.client._core, self._state
        if not await self.client._wait_until(lambda: core.room(state) > 0, timeout_s):
            raise RequestTimeout(f"the publish window stayed full for {timeout_s:.1f}s")
        return core.room(state)

    async def wait_for_confirms(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is confirmed; raises the first failure."""
        timeout = self.client.request_timeout_s if timeout_s is None else timeout_s
        state = self._state
        done = await self.client._wait_until(
            lambda: not state.pending or state.error is not None, timeout
        )
        if state.error is not None:
            raise state.error
        if not done:
            raise RequestTimeout(
                f"{len(state.pending)} messages still unconfirmed after {timeout:.1f}s"
            )


class AsyncSettles(Protocol):
    """What an async message is settled through: its consumer (or the client, for a get)."""

    async def ack(self, messages: list[AsyncMessage]) -> None: ...

    async def nack(self, messages: list[AsyncMessage], requeue: bool = True) -> None: ...

    async def reject(self, messages: list[AsyncMessage]) -> None: ...


@dataclass(frozen=True, slots=True)
class AsyncMessage:
    """One delivered message; settle it with `await message.ack()` (or nack, reject)."""

    queue: str
    msg_id: int
    body: bytes
    redelivered: bool
    delivery_count: int
    consumer_key: ConsumerKey
    annotations: tuple[tuple[str, str | int], ...] = ()
    consumer: AsyncSettles | None = field(default=None, repr=False, compare=False)

    async def ack(self) -> None:
        """Settle: the message is done."""
        await self._owner().ack([self])

    async def nack(self, requeue: bool = True) -> None:
        """Return it to the queue (`requeue`), or reject it (dead-letter / drop)."""
        await self._owner().nack([self], requeue=requeue)

    async def reject(self) -> None:
        """Discard it: a failed delivery, dead-lettered if the queue has a target."""
        await self._owner().reject([self])

    def _owner(self) -> AsyncSettles:
        if self.consumer is None:
            raise ValueError("this message has no consumer to settle it with")
        return self.consumer


def _pairs(messages: Iterable[AsyncMessage | int]) -> list[tuple[ConsumerKey | None, int]]:
    return [
        (item.consumer_key, item.msg_id) if isinstance(item, AsyncMessage) else (None, item)
        for item in messages
    ]


class AsyncConsumer:
    """A consumer of one queue (prefetch or AMQP 1.0 credit); attaches on first use."""

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        *,
        prefetch: int = 100,
        credited: bool = False,
        priority: int = 0,
        timeout_ms: int | None = None,
        auto_ack: bool = False,
        ack_batch: int | None = None,
    ) -> None:
        self.client = client
        self._state: ConsumerState = client._core.add_consumer(
            queue,
            prefetch=prefetch,
            credited=credited,
            priority=priority,
            timeout_ms=timeout_ms,
            auto_ack=auto_ack,
            ack_batch=ack_batch,
        )
        self._attach: asyncio.Future[None] | None = None

    @property
    def queue(self) -> str:
        """The queue consumed from."""
        return self._state.queue

    @property
    def tag(self) -> str:
        """This consumer's tag, unique to the client."""
        return self._state.tag

    @property
    def consumer_key(self) -> ConsumerKey | None:
        """The key of the current checkout (a new one after every reconnect)."""
        return self._state.consumer_key

    @property
    def active(self) -> bool:
        """SAC: this is the active consumer; competing: it can receive."""
        return self._state.active

    @property
    def status(self) -> str:
        """up | waiting | timeout | suspected_down | single_active, as the queue last said."""
        return self._state.status

    @property
    def cancelled(self) -> bool:
        """Cancelled (by us or the queue): nothing new comes."""
        return self._state.cancelled

    @property
    def released(self) -> set[int]:
        """Ids taken back on a consumer timeout and not yet named in a settle."""
        return self._state.released

    @property
    def settle_errors(self) -> int:
        """Settles the queue refused."""
        return self._state.settle_errors

    @property
    def delivered(self) -> int:
        """Messages received."""
        return self._state.delivered

    @property
    def delivery_count(self) -> int:
        """The receiver's serial delivery count (credited mode)."""
        return self._state.delivery_count

    @property
    def last_credit_reply(self) -> CreditReply | None:
        """The last AMQP 1.0 flow the queue sent back."""
        return self._state.last_credit_reply

    # --- attach ---------------------------------------------------------------------------

    async def start(self) -> AsyncConsumer:
        """Attach to the queue (once; later calls wait for the same checkout)."""
        if self._attach is None:
            self._attach = asyncio.ensure_future(self._checkout())
        await asyncio.shield(self._attach)
        return self

    async def _checkout(self) -> None:
        core, timeout = self.client._core, self.client.request_timeout_s
        try:
            answer = await self.client._request(
                lambda: core.attach(self._state, timeout), timeout, "checkout"
            )
            _reply(answer)
        except BaseException:
            core.remove_consumer(self._state)
            raise

    def __await__(self) -> Generator[object, None, AsyncConsumer]:
        return self.start().__await__()

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> AsyncMessage:
        message = await self.get(timeout_s=None)
        if message is None:
            raise StopAsyncIteration
        return message

    # --- receiving ------------------------------------------------------------------------

    async def get(self, timeout_s: float | None = None) -> AsyncMessage | None:
        """The next message, waiting up to `timeout_s` (None: until cancelled or closed)."""
        attach = self._attach
        if attach is None or not attach.done():
            await self.start()
        else:
            attach.result()  # raises if the checkout failed
        client, core, state = self.client, self.client._core, self._state
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            item = core.next_delivery(state)
            client._flush()
            if item is not None:
                return self._wrap(item)
            if state.finished:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            await client._wait_until(lambda: bool(state.buffer) or state.finished, left)

    def _wrap(self, item: Buffered) -> AsyncMessage:
        key, delivery = item
        return AsyncMessage(
            self._state.queue,
            delivery.msg_id,
            delivery.body,
            delivery.redelivered,
            delivery.delivery_count,
            key,
            delivery.annotations,
            self,
        )

    def take_buffered(self) -> list[AsyncMessage]:
        """Remove and return the messages received but not yet handed out (not acked)."""
        return [self._wrap(item) for item in self.client._core.take_buffered(self._state)]

    # --- settling ---------------------------------------------------------------------------

    async def ack(self, messages: Iterable[AsyncMessage | int]) -> None:
        """Settle messages (batched: sent once `ack_batch` are waiting or on `flush_acks`)."""
        self.client._core.ack(self._state, _pairs(messages))
        self.client._flush()

    async def flush_acks(self) -> None:
        """Send every buffered ack now."""
        self.client._core.flush_acks(self._state)
        self.client._flush()

    async def nack(self, messages: Iterable[AsyncMessage | int], requeue: bool = True) -> None:
        """Return messages (`requeue`, no failed delivery) or reject them."""
        kind = Return if requeue else Discard
        self._settle(messages, lambda key, ids: kind(self._state.queue, key, ids))

    async def reject(self, messages: Iterable[AsyncMessage | int]) -> None:
        """Discard messages: a failed delivery; dead-lettered when the queue has a target."""
        self._settle(messages, lambda key, ids: Discard(self._state.queue, key, ids))

    async def modify(
        self,
        messages: Iterable[AsyncMessage | int],
        *,
        delivery_failed: bool = True,
        undeliverable_here: bool = False,
        annotations: tuple[tuple[str, str | int], ...] = (),
    ) -> None:
        """AMQP 1.0 modified outcome (machine v2): return or dead-letter with annotations."""
        self._settle(
            messages,
            lambda key, ids: Modify(
                self._state.queue, key, ids, delivery_failed, undeliverable_here, annotations
            ),
        )

    async def renew(self, messages: Iterable[AsyncMessage | int]) -> None:
        """Extend the consumer-timeout locks of checked-out messages (machine v2)."""
        self._settle(messages, lambda key, ids: RenewLocks(self._state.queue, key, ids))

    async def grant(self, credit: int, drain: bool = False) -> None:
        """Credited mode: grant `credit` more deliveries (AMQP 1.0 flow)."""
        await self.start()
        self.client._core.grant(self._state, credit, drain)
        self.client._flush()

    def _settle(
        self,
        messages: Iterable[AsyncMessage | int],
        build: Callable[[ConsumerKey, tuple[int, ...]], Command],
    ) -> None:
        self.client._core.settle(self._state, _pairs(messages), build)
        self.client._flush()

    async def wait_settled(self, timeout_s: float = 10.0) -> bool:
        """Flush acks and wait until every settle sent so far is answered; False on timeout."""
        await self.flush_acks()
        state = self._state
        return await self.client._wait_until(lambda: state.outstanding <= 0, timeout_s)

    # --- leaving ----------------------------------------------------------------------------

    async def cancel(self) -> CancelOk | None:
        """Soft cancel: nothing new; pending messages can still be settled."""
        return await self._leave(Cancel())

    async def remove(self) -> CancelOk | None:
        """Hard cancel (machine v2): pending messages return to the queue at once."""
        return await self._leave(Remove())

    async def _leave(self, spec: Cancel | Remove) -> CancelOk | None:
        core, timeout = self.client._core, self.client.request_timeout_s
        answer = await self.client._request(
            lambda: core.leave(self._state, spec, timeout), timeout, "cancel"
        )
        reply = _reply(answer)
        core.left(self._state)
        self.client._notify()
        return reply if isinstance(reply, CancelOk) else None

    def close(self) -> None:
        """Flush acks and stop iterating (the consumer stays attached until its connection ends)."""
        self.client._core.close_consumer(self._state)
        self.client._flush()
        self.client._notify()


class _AsyncSettler:
    """Settles a message taken with `AsyncClient.get` (the owner `message.ack()` calls)."""

    def __init__(self, client: AsyncClient, queue: str) -> None:
        self.client = client
        self.queue = queue

    async def ack(self, messages: list[AsyncMessage]) -> None:
        for message in messages:
            await self.client.command(Settle(self.queue, message.consumer_key, (message.msg_id,)))

    async def nack(self, messages: list[AsyncMessage], requeue: bool = True) -> None:
        kind = Return if requeue else Discard
        for message in messages:
            await self.client.command(kind(self.queue, message.consumer_key, (message.msg_id,)))

    async def reject(self, messages: list[AsyncMessage]) -> None:
        await self.nack(messages, requeue=False)


def _reply(answer: AnyFrame) -> Reply:
    raw = answer.get("reply")
    if not isinstance(raw, bytes):
        raise CommandRefused(protocol.BAD_FRAME, f"expected an encoded reply, got {raw!r}")
    reply: Reply = decode(raw)
    if isinstance(reply, Error):
        raise CommandRefused(reply.code, reply.message)
    return reply


def _unusable(core: ClientProtocol) -> bool:
    return core.closed or core.failure is not None


def _expect(reply: Reply, kind: type[_T]) -> _T:
    if not isinstance(reply, kind):
        raise CommandRefused("unexpected_reply", f"expected {kind.__name__}, got {reply!r}")
    return reply
