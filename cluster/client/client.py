"""The synchronous client: one connection at a time, pipelined requests, reconnect and resend.

Requests are sent with an id and kept until answered; when the connection breaks, the client
connects to another node and resends every unanswered request in order (publishes carry their
enqueuer id and sequence number, so the queue drops the duplicates). A reader thread per
connection dispatches replies and pushes; a ticker thread retries and expires requests.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from cluster import config as cluster_config
from cluster import protocol
from cluster.client._connection import Connection, Message
from cluster.client.errors import (
    AuthError,
    ClientClosed,
    ClusterError,
    CommandRefused,
    RequestTimeout,
    Unavailable,
)
from fifo.codec import decode, encode
from fifo.commands import (
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    DeleteQueue,
    Dequeue,
    Discard,
    Purge,
    QueueConfig,
    Return,
    Settle,
    UpdateConfig,
)
from fifo.effects import Effect, QueueStatus
from fifo.replies import DeclareOk, DeleteOk, DequeueOk, Error, PurgeOk, Reply

if TYPE_CHECKING:
    from cluster.client.consumer import Consumer
    from cluster.client.consumer import Message as Delivered
    from cluster.client.publisher import Publisher

log = structlog.get_logger("quorumq.client")

Callback = Callable[[Message | None, BaseException | None], None]
RETRY_CODES = frozenset({protocol.NOT_LEADER_TIMEOUT, protocol.UNAVAILABLE})
RETRY_DELAY_S = 0.1
SWITCH_NODE_AFTER_S = 3.0  # only "unavailable" answers for this long: reconnect elsewhere
_T = TypeVar("_T")
TICK_S = 0.05
SCAN_S = 0.5  # request deadlines and the silence check


class _Request:
    """A request in flight: its frame (with id), its callback and when it gives up."""

    __slots__ = ("callback", "deadline", "frame", "retry_at", "sent_at")

    def __init__(self, frame: Message, callback: Callback, deadline: float | None) -> None:
        self.frame = frame
        self.callback = callback
        self.deadline = deadline
        self.retry_at = 0.0
        self.sent_at = time.monotonic()


class _Waiter:
    """A one-shot result slot for a synchronous call."""

    __slots__ = ("answer", "error", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.answer: Message | None = None
        self.error: BaseException | None = None

    def __call__(self, answer: Message | None, error: BaseException | None) -> None:
        self.answer, self.error = answer, error
        self.event.set()


class Client:
    """A connection to a quorumq cluster through any of its nodes.

    `connect_timeout_s` bounds one connection attempt, `connect_retry_s` how long the first
    connect keeps trying (default: `connect_timeout_s`; the cluster may still be starting),
    `reconnect_timeout_s` how long a reconnect keeps trying, `silence_timeout_s` how long a node
    may stay silent while requests wait before the client moves to another one. With
    `prefer_leader`, the first connection moves to the leader the node names (saving a hop).

    Example: `with Client.from_data_dir(Path("D")) as client: client.declare_queue("jobs")`.
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
        if not endpoints:
            raise ValueError("at least one endpoint host:port is required")
        self._endpoints = list(dict.fromkeys(endpoints))
        self._client_key = client_key
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self._reconnect = reconnect
        self.silence_timeout_s = silence_timeout_s
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._inflight: dict[int, _Request] = {}
        self._retries: list[_Request] = []
        self._consumers: dict[tuple[str, str], Consumer] = {}
        self._publishers: dict[tuple[str, str], Publisher] = {}
        self._tags = itertools.count(1)
        self._conn: Connection | None = None
        self._closed = False
        self._failure: ClusterError | None = None
        self._connected = threading.Condition(self._lock)
        self.reconnects = 0
        self._unavailable_since = 0.0  # first of an unbroken run of retryable errors
        self.prefer_leader = prefer_leader
        retry_s = connect_timeout_s if connect_retry_s is None else connect_retry_s
        first = self._connect_any(self._endpoints, deadline=time.monotonic() + retry_s)
        self._attach(self._leader_instead(first) if prefer_leader else first)
        self._ticker = threading.Thread(target=self._tick_loop, name="qq-ticker", daemon=True)
        self._ticker.start()

    @classmethod
    def from_data_dir(cls, data_dir: Path, **kwargs: Any) -> Client:
        """Connect with the endpoints of `D/cluster.toml` and the key in `D/client.key`."""
        config = cluster_config.load(Path(data_dir))
        key = cluster_config.read_client_key(Path(data_dir) / cluster_config.CLIENT_KEY_FILE)
        return cls(list(config.endpoints().values()), key, **kwargs)

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush pending acks, close the connection and fail every request still in flight."""
        if not self._closed and self._failure is None:
            for consumer in list(self._consumers.values()):
                consumer.wait_settled(timeout_s=2.0)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
            pending = list(self._inflight.values())
            self._inflight.clear()
            self._connected.notify_all()
        if conn is not None:
            conn.close(by_us=True)
        for request in pending:
            request.callback(None, ClientClosed("the client was closed"))
        for consumer in list(self._consumers.values()):
            consumer._on_client_closed()

    @property
    def node(self) -> str | None:
        """The node this client is connected to now (None while reconnecting)."""
        conn = self._conn
        return conn.node if conn else None

    @property
    def connection_id(self) -> ConnectionId:
        """This client's current ConnectionId, as assigned by its node."""
        conn = self._require_conn()
        value = decode(conn.connection)
        assert isinstance(value, ConnectionId)
        return value

    @property
    def endpoints(self) -> list[str]:
        """The endpoints known to this client (those given plus those learnt from nodes)."""
        return list(self._endpoints)

    def _require_conn(self) -> Connection:
        with self._lock:
            if self._closed:
                raise ClientClosed("the client was closed")
            while self._conn is None and self._failure is None and not self._closed:
                self._connected.wait(1.0)
            if self._failure is not None:
                raise self._failure
            if self._conn is None:
                raise ClientClosed("the client was closed")
            return self._conn

    # --- connecting ------------------------------------------------------------------------

    def _connect_any(self, endpoints: list[str], deadline: float) -> Connection:
        errors: list[str] = []
        while True:
            if self._closed:
                raise ClientClosed("the client was closed")
            for address in endpoints:
                try:
                    return Connection(address, self._client_key, self.name, self.connect_timeout_s)
                except AuthError:
                    raise
                except (OSError, ClusterError, ValueError) as err:
                    errors.append(f"{address}: {err}")
            if time.monotonic() >= deadline:
                tried = "; ".join(errors[-len(endpoints) :])
                raise Unavailable(f"no quorumq node reachable ({tried})")
            time.sleep(0.1)

    def _leader_instead(self, conn: Connection) -> Connection:
        """A connection to the leader the node named, if it differs and answers; else `conn`.

        Commands reach the log through the leader anyway; going there directly saves the
        forwarding hop. Any failure keeps the connection we have.
        """
        address = conn.endpoints.get(conn.leader or "")
        if not address or conn.leader == conn.node:
            return conn
        try:
            leader = Connection(address, self._client_key, self.name, self.connect_timeout_s)
        except (OSError, ClusterError, ValueError):
            return conn
        conn.close(by_us=True)
        return leader

    def _attach(self, conn: Connection) -> list[_Request]:
        """Make `conn` current; returns the requests in flight at that moment, to resend.

        Both happen under the lock, so a request submitted meanwhile is either in the list or
        sent by `submit` on the new connection, never neither.
        """
        for address in conn.endpoints.values():
            if address not in self._endpoints:
                self._endpoints.append(address)
        with self._lock:
            self._conn = conn
            pending = list(self._inflight.values())
            self._connected.notify_all()
        conn.start(self._on_frames, self._on_close)
        return pending

    def _on_close(self, conn: Connection, error: BaseException | None) -> None:
        with self._lock:
            if self._closed or conn is not self._conn:
                return
            self._conn = None
        log.info("connection_lost", node=conn.node, address=conn.address, error=str(error))
        if not self._reconnect:
            self._fail(Unavailable(f"lost the connection to {conn.address}: {error}"))
            return
        threading.Thread(
            target=self._reconnect_from, args=(conn,), name="qq-reconnect", daemon=True
        ).start()

    def _reconnect_from(self, lost: Connection) -> None:
        start = self._endpoints.index(lost.address) + 1 if lost.address in self._endpoints else 0
        order = self._endpoints[start:] + self._endpoints[:start]
        try:
            conn = self._connect_any(order, time.monotonic() + self.reconnect_timeout_s)
        except ClusterError as err:
            self._fail(err)
            return
        with self._lock:
            if self._closed:
                conn.close(by_us=True)
                return
            self.reconnects += 1
            pending = self._attach(conn)
        log.info("reconnected", node=conn.node, resend=len(pending))
        for request in pending:
            request.sent_at = time.monotonic()
        self._send([request.frame for request in pending])
        for consumer in list(self._consumers.values()):
            consumer._on_reconnected()

    def _fail(self, error: ClusterError) -> None:
        with self._lock:
            self._failure = error
            pending = list(self._inflight.values())
            self._inflight.clear()
            self._connected.notify_all()
        for request in pending:
            request.callback(None, error)
        for consumer in list(self._consumers.values()):
            consumer._on_client_closed()

    # --- requests --------------------------------------------------------------------------

    def submit(
        self,
        frames: Iterable[Message],
        callbacks: Iterable[Callback],
        timeout_s: float | None = None,
    ) -> list[int]:
        """Send frames (without ids) in one write; each callback gets its answer frame once."""
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        ids: list[int] = []
        with self._lock:
            if self._closed:
                raise ClientClosed("the client was closed")
            if self._failure is not None:
                raise self._failure
            sendable: list[Message] = []
            for frame, callback in zip(frames, callbacks, strict=True):
                request_id = next(self._ids)
                frame["id"] = request_id
                self._inflight[request_id] = _Request(frame, callback, deadline)
                ids.append(request_id)
                sendable.append(frame)
        self._send(sendable)
        return ids

    def forget(self, request_ids: Iterable[int]) -> None:
        """Stop tracking requests (a resend supersedes them); their late answers are ignored."""
        with self._lock:
            for request_id in request_ids:
                self._inflight.pop(request_id, None)

    def _send(self, frames: list[Message]) -> None:
        conn = self._conn
        if conn is None or not frames:
            return  # sent by the reconnect, which resends everything in flight
        data = b"".join(protocol.encode_frame(frame, conn.frame_bytes_max) for frame in frames)
        try:
            conn.send(data)
        except OSError:
            conn.close()  # the reader thread reports it and the reconnect resends

    def call(self, frame: Message, timeout_s: float | None = None) -> Message:
        """Send one request and wait for its answer frame (`reply` or `result`)."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        waiter = _Waiter()
        (request_id,) = self.submit([frame], [waiter], timeout)
        if not waiter.event.wait(timeout + 1.0):
            self.forget([request_id])
            raise RequestTimeout(f"no answer to {frame.get('op')} within {timeout:.1f}s")
        if waiter.error is not None:
            raise waiter.error
        assert waiter.answer is not None
        return waiter.answer

    def command(self, command: Command, timeout_s: float | None = None) -> Reply:
        """Run one command through the log; CommandRefused for an error reply."""
        answer = self.call(protocol.command(0, encode(command)), timeout_s)
        reply = decode(answer["reply"])
        if isinstance(reply, Error):
            raise CommandRefused(reply.code, reply.message)
        return reply  # type: ignore[no-any-return]

    def query(
        self, name: str, args: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> Any:
        """A read-only query answered from the connected node's state."""
        return self.call(protocol.query(0, name, args), timeout_s)["result"]

    def admin(
        self, action: str, args: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> Any:
        """An admin action (member_add, member_remove, machine_upgrade)."""
        return self.call(protocol.admin(0, action, args), timeout_s)["result"]

    # --- incoming frames -------------------------------------------------------------------

    def _on_frames(self, conn: Connection, frames: list[Message]) -> None:
        done: list[tuple[_Request, Message | None, BaseException | None]] = []
        effects: list[bytes] = []
        with self._lock:
            for frame in frames:
                op = frame.get("op")
                if op == protocol.EFFECT:
                    effects.append(frame["effect"])
                    continue
                request = self._inflight.pop(frame.get("id", -1), None)
                if request is None:
                    if op == protocol.ERROR:
                        log.warning(
                            "error_frame", code=frame.get("code"), message=frame.get("message")
                        )
                    continue
                if op == protocol.ERROR:
                    code = str(frame.get("code"))
                    if code in RETRY_CODES and not self._expired(request):
                        request.retry_at = time.monotonic() + RETRY_DELAY_S
                        self._inflight[request.frame["id"]] = request
                        self._retries.append(request)
                        self._unavailable_since = self._unavailable_since or time.monotonic()
                        continue
                    done.append((request, None, _frame_error(frame)))
                else:
                    self._unavailable_since = 0.0
                    done.append((request, frame, None))
            stuck = self._unavailable_since and (
                time.monotonic() - self._unavailable_since > SWITCH_NODE_AFTER_S
            )
        if stuck and len(self._endpoints) > 1:
            # this node cannot get anything committed (cut off from the majority?): try another
            log.info("switching_node", node=conn.node, after_s=SWITCH_NODE_AFTER_S)
            self._unavailable_since = 0.0
            conn.close()
        for request, answer, error in done:
            request.callback(answer, error)
        for data in effects:
            self._dispatch_effect(decode(data))

    @staticmethod
    def _expired(request: _Request) -> bool:
        return request.deadline is not None and time.monotonic() >= request.deadline

    def _dispatch_effect(self, effect: Effect) -> None:
        if isinstance(effect, QueueStatus):
            publisher = self._publishers.get((effect.queue, effect.enqueuer))
            if publisher is not None:
                publisher._on_queue_status(effect.status)
            return
        tag = getattr(effect, "tag", None)
        consumer = self._consumers.get((effect.queue, tag)) if isinstance(tag, str) else None
        if consumer is not None:
            consumer._on_effect(effect)

    def _tick_loop(self) -> None:
        last_scan = 0.0
        while not self._closed:
            time.sleep(TICK_S)
            now = time.monotonic()
            with self._lock:
                due = [r for r in self._retries if r.retry_at <= now]
                self._retries = [r for r in self._retries if r.retry_at > now]
            due = [r for r in due if r.frame["id"] in self._inflight]
            self._send([request.frame for request in due])
            if now - last_scan >= SCAN_S:
                last_scan = now
                self._expire(now)
                self._check_silence(now)

    def _expire(self, now: float) -> None:
        expired: list[_Request] = []
        with self._lock:
            for request_id, request in list(self._inflight.items()):
                if request.deadline is not None and now >= request.deadline:
                    del self._inflight[request_id]
                    expired.append(request)
        for request in expired:
            request.callback(None, RequestTimeout("the cluster did not answer in time"))

    def _check_silence(self, now: float) -> None:
        """A node that answers nothing while requests wait (paused, wedged): go elsewhere."""
        conn = self._conn
        with self._lock:
            oldest = next(iter(self._inflight.values()), None)
        if conn is None or oldest is None:
            return
        waiting_s, silent_s = now - oldest.sent_at, now - conn.last_recv
        if waiting_s > self.silence_timeout_s and silent_s > self.silence_timeout_s:
            log.info("node_silent", node=conn.node, silent_s=round(now - conn.last_recv, 1))
            conn.close()

    # --- registries used by publishers and consumers -------------------------------------

    def _register_consumer(self, consumer: Consumer) -> None:
        with self._lock:
            self._consumers[(consumer.queue, consumer.tag)] = consumer

    def _unregister_consumer(self, consumer: Consumer) -> None:
        with self._lock:
            self._consumers.pop((consumer.queue, consumer.tag), None)

    def _register_publisher(self, publisher: Publisher) -> None:
        with self._lock:
            self._publishers[(publisher.queue, publisher.enqueuer)] = publisher

    def _unregister_publisher(self, publisher: Publisher) -> None:
        with self._lock:
            self._publishers.pop((publisher.queue, publisher.enqueuer), None)

    def _next_tag(self) -> str:
        return f"{self.name}-{uuid.uuid4().hex[:8]}-{next(self._tags)}"

    # --- queue management ------------------------------------------------------------------

    def declare_queue(self, queue: str, config: QueueConfig | None = None) -> DeclareOk:
        """Create `queue` (a no-op when it exists with an equal config)."""
        reply = self.command(DeclareQueue(queue, config or QueueConfig()))
        return _expect(reply, DeclareOk)

    def delete_queue(self, queue: str) -> DeleteOk:
        """Delete `queue` and everything in it."""
        return _expect(self.command(DeleteQueue(queue)), DeleteOk)

    def purge_queue(self, queue: str) -> PurgeOk:
        """Drop every ready message of `queue`."""
        return _expect(self.command(Purge(queue)), PurgeOk)

    def update_config(self, queue: str, config: QueueConfig) -> Reply:
        """Replace the config of `queue`."""
        return self.command(UpdateConfig(queue, config))

    # --- publishing and consuming ----------------------------------------------------------

    def publisher(self, queue: str, *, window: int = 100, enqueuer: str | None = None) -> Publisher:
        """A confirmed, pipelined publisher for `queue` with up to `window` unconfirmed messages."""
        from cluster.client.publisher import Publisher

        return Publisher(self, queue, window=window, enqueuer=enqueuer)

    def publish(
        self, queue: str, body: bytes, *, ttl_ms: int | None = None, timeout_s: float | None = None
    ) -> None:
        """Publish one message and wait for its confirm (a tracked enqueue, deduplicated)."""
        with self.publisher(queue, window=1) as publisher:
            publisher.publish(body, ttl_ms=ttl_ms)
            publisher.wait_for_confirms(timeout_s or self.request_timeout_s)

    def consume(
        self,
        queue: str,
        *,
        prefetch: int = 100,
        credited: bool = False,
        priority: int = 0,
        timeout_ms: int | None = None,
        auto_ack: bool = False,
        on_message: Callable[[Any], None] | None = None,
    ) -> Consumer:
        """Attach a consumer; iterate it, or pass `on_message` to get a callback per message."""
        from cluster.client.consumer import Consumer

        consumer = Consumer(
            self,
            queue,
            prefetch=prefetch,
            credited=credited,
            priority=priority,
            timeout_ms=timeout_ms,
            auto_ack=auto_ack,
        )
        consumer.start(on_message)
        return consumer

    def get(self, queue: str, *, settled: bool = False) -> Delivered | None:
        """Take one ready message (basic.get); unless `settled`, ack or nack it like a delivery."""
        from cluster.client.consumer import Message as Delivered

        tag = self._next_tag()
        conn_id = self.connection_id
        reply = self.command(Checkout(queue, ConsumerId(tag, conn_id), Dequeue(settled)))
        if not isinstance(reply, DequeueOk):
            raise CommandRefused("unexpected_reply", f"dequeue answered {reply!r}")
        if reply.message is None:
            return None
        found = reply.message
        key = reply.consumer_key if reply.consumer_key is not None else ConsumerId(tag, conn_id)
        return Delivered(
            queue,
            found.msg_id,
            found.body,
            found.redelivered,
            found.delivery_count,
            key,
            (),
            None if settled else _Settler(self, queue),
        )

    # --- queries ---------------------------------------------------------------------------

    def overview(self, queue: str | None = None) -> Any:
        """The overview of one queue (or of every queue when `queue` is None)."""
        return self.query("overview", {"queue": queue} if queue else {})

    def queues(self) -> Any:
        """Every queue with its counters."""
        return self.query("queues")

    def consumers(self, queue: str | None = None) -> Any:
        """The consumers of `queue` (of every queue when None)."""
        return self.query("consumers", {"queue": queue} if queue else {})

    def messages(self, queue: str, limit: int = 100) -> Any:
        """Up to `limit` messages of `queue` (ids, sizes, delivery counts; not the bodies)."""
        return self.query("messages", {"queue": queue, "limit": limit})

    def status(self) -> Any:
        """The status map of the connected node (role, term, indexes, digest, versions, pid)."""
        return self.query("status")

    def machine(self) -> Any:
        """The machine-version status (effective version, per-node support, past switches)."""
        return self.query("machine")


def _frame_error(frame: Message) -> ClusterError:
    code, message = str(frame.get("code")), str(frame.get("message", ""))
    if code in RETRY_CODES:
        return Unavailable(f"{code}: {message}")
    if code in (protocol.AUTH_FAILED, protocol.NOT_AUTHENTICATED):
        return AuthError(message)
    return CommandRefused(code, message)


def _expect(reply: Reply, kind: type[_T]) -> _T:
    if not isinstance(reply, kind):
        raise CommandRefused("unexpected_reply", f"expected {kind.__name__}, got {reply!r}")
    return reply


class _Settler:
    """Settles a dequeued message (the consumer-like owner `Message.ack()` calls)."""

    def __init__(self, client: Client, queue: str) -> None:
        self.client = client
        self.queue = queue

    def ack(self, messages: list[Delivered]) -> None:
        for message in messages:
            self.client.command(Settle(self.queue, message.consumer_key, (message.msg_id,)))

    def nack(self, messages: list[Delivered], requeue: bool = True) -> None:
        kind = Return if requeue else Discard
        for message in messages:
            self.client.command(kind(self.queue, message.consumer_key, (message.msg_id,)))

    def reject(self, messages: list[Delivered]) -> None:
        self.nack(messages, requeue=False)
