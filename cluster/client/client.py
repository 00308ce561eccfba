"""The synchronous client: one connection at a time, pipelined requests, reconnect and resend.

Requests are sent with an id and kept until answered; when the connection breaks, the client
connects to another node and resends every unanswered request in order (publishes carry their
enqueuer id and sequence number, so the queue drops the duplicates). All of that is
`ClientProtocol` (sans-IO); this module is its blocking, thread-based shell.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Unpack, overload

from cluster import protocol
from cluster.client import _requests as calls
from cluster.client import results
from cluster.client._options import (
    ClientOptions,
    ConsumeOptions,
    DataDirOptions,
    PublishOptions,
    Settings,
    data_dir_connection,
)
from cluster.client._threaded import ThreadedShell
from cluster.client._wire import Frame
from cluster.client.consumer import Consumer, Message
from cluster.client.errors import ClientClosed
from cluster.client.publisher import Publisher
from cluster.client.sansio import ClientProtocol
from fifo.codec import encode
from fifo.commands import Command, ConnectionId, DeleteQueue, GroupConfig, QueueConfig, UpdateConfig
from fifo.queries import ConsumerInfo, GroupInfo, MessageInfo, QueueOverview
from fifo.replies import DeclareOk, DeleteOk, PurgeOk, Reply

QueryArgs = dict[str, str | int]


class Client(ThreadedShell):
    """A connection to a quorumq cluster through any of its nodes.

    `connect_timeout_s` bounds one connection attempt, `connect_retry_s` how long the first
    connect keeps trying (default: `connect_timeout_s`; the cluster may still be starting),
    `reconnect_timeout_s` how long a reconnect keeps trying, `silence_timeout_s` how long a node
    may stay silent while requests wait before the client moves to another one. With
    `prefer_leader`, the first connection moves to the leader the node names (saving a hop).

    `no_leader_fail_s`: a request the nodes keep refusing for want of a leader (no quorum)
    fails with `Unavailable` after this long instead of at its timeout (None: the timeout).

    `tls`: for a cluster with `tls = true`, the path of its CA file (`D/tls/ca.crt`) or an
    `ssl.SSLContext`; every connection (reconnects and moves to the leader too) is TLS and
    checks the node's certificate against it and the host dialed (None: plaintext). A mismatch
    (a TLS port dialed without it, a plaintext port with it, another cluster's CA) raises
    `TlsError` at once, saying what to pass instead (cluster/client/tls.py).

    Example: `with Client.from_data_dir(Path("D")) as client: client.declare_queue("jobs")`,
    or `Client(["10.0.0.1:5701"], key, tls="/etc/quorumq/ca.crt")`.
    """

    def __init__(
        self, endpoints: Sequence[str], client_key: bytes, **options: Unpack[ClientOptions]
    ) -> None:
        super().__init__(endpoints, client_key, Settings(**options))

    @classmethod
    def from_data_dir(cls, data_dir: Path, **options: Unpack[DataDirOptions]) -> Client:
        """Connect with the endpoints of `D/cluster.toml` and the key in `D/client.key`; over
        TLS with `D/tls/ca.crt` when cluster.toml says `tls = true` (`tls` overrides it)."""
        endpoints, key, chosen = data_dir_connection(data_dir, options)
        return cls(endpoints, key, **chosen)

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush pending acks, close the connection and fail every request still in flight."""
        core = self.core
        if not core.closed and core.failure is None:
            with self.lock:
                consumers = core.consumers()
                for consumer in consumers:
                    core.flush_acks(consumer)
            self.flush()
            self.wait_until(lambda: all(c.outstanding <= 0 for c in consumers), _in(2.0))
        self._shutdown()

    @property
    def connection_id(self) -> ConnectionId:
        """This client's current ConnectionId, as assigned by its node (waits while away)."""
        core = self.core
        core.check_usable()
        self.wait_until(lambda: core.connection_id is not None or not _usable(core), None)
        core.check_usable()
        connection = core.connection_id
        if connection is None:
            raise ClientClosed("the client was closed")
        return connection

    # --- requests --------------------------------------------------------------------------

    def call(self, frame: Frame, timeout_s: float | None = None) -> Frame:
        """Send one request and wait for its answer frame (`reply` or `result`)."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        core = self.core
        return self.request(
            lambda: core.submit(frame, timeout, now=time.monotonic()), timeout, str(frame.get("op"))
        )

    def command(self, command: Command, timeout_s: float | None = None) -> Reply:
        """Run one command through the log; CommandRefused for an error reply."""
        return calls.reply_of(self.call(protocol.command(0, encode(command)), timeout_s))

    def query(
        self, name: str, args: QueryArgs | None = None, timeout_s: float | None = None
    ) -> object:
        """A read-only query answered from the connected node's state, as plain data."""
        return self.call(protocol.query(0, name, dict(args or {})), timeout_s)["result"]

    def admin(
        self, action: str, args: QueryArgs | None = None, timeout_s: float | None = None
    ) -> dict[str, object]:
        """An admin action (machine_upgrade, snapshot, ...); its result map."""
        result = self.call(protocol.admin(0, action, dict(args or {})), timeout_s)["result"]
        return results.mapping(result, action)

    # --- queue management ------------------------------------------------------------------

    def declare_queue(
        self, queue: str, config: QueueConfig | None = None, groups: GroupConfig | None = None
    ) -> DeclareOk:
        """Create `queue` (a no-op when it exists with an equal config). With `groups`, a queue
        with message groups (machine v3; a cluster still on v2 refuses it). A dead-letter queue
        the config names is declared first (default config) when it does not exist: the machine
        drops what it would dead-letter into a missing queue."""
        target, declaration = calls.declarations(queue, config, groups)
        if target is not None and self.overview(target) is None:
            self.declare_queue(target)
        return calls.expect(self.command(declaration), DeclareOk)

    def delete_queue(self, queue: str) -> DeleteOk:
        """Delete `queue` and everything in it."""
        return calls.expect(self.command(DeleteQueue(queue)), DeleteOk)

    def purge_queue(self, queue: str, *, group: str | None = None,
                    default_group: bool = False) -> PurgeOk:  # fmt: skip
        """Drop every ready message of `queue`; with `group` (or `default_group`), only those of
        that message group of a grouped queue."""
        return calls.expect(self.command(calls.purging(queue, group, default_group)), PurgeOk)

    def update_config(self, queue: str, config: QueueConfig) -> Reply:
        """Replace the config of `queue`."""
        return self.command(UpdateConfig(queue, config))

    # --- publishing and consuming ----------------------------------------------------------

    def publisher(self, queue: str, *, window: int = 100, enqueuer: str | None = None) -> Publisher:
        """A confirmed, pipelined publisher for `queue` with up to `window` unconfirmed messages."""
        return Publisher(self, queue, window=window, enqueuer=enqueuer)

    def publish(self, queue: str, body: bytes, **options: Unpack[PublishOptions]) -> None:
        """Publish one message and wait for its confirm (a tracked enqueue, deduplicated);
        `group`: its message group (a grouped queue, machine v3)."""
        timeout_s = options.pop("timeout_s", None) or self.request_timeout_s
        with self.reading(), self.publisher(queue, window=1) as publisher:
            publisher.publish(body, **options)
            publisher.wait_for_confirms(timeout_s)

    def consume(
        self,
        queue: str,
        *,
        on_message: Callable[[Message], None] | None = None,
        **options: Unpack[ConsumeOptions],
    ) -> Consumer:
        """Attach a consumer; iterate it, or pass `on_message` to get a callback per message."""
        consumer = Consumer(self, queue, **options)
        consumer.start(on_message)
        return consumer

    def get(self, queue: str, *, settled: bool = False) -> Message | None:
        """Take one ready message (basic.get); unless `settled`, ack or nack it like a delivery."""
        tag, connection = self.core.next_tag(), self.connection_id
        found = calls.dequeued(
            self.command(calls.dequeue(queue, tag, connection, settled)), tag, connection
        )
        if found is None:
            return None
        return Message(queue, *found, consumer=None if settled else _Settler(self, queue))

    # --- queries ---------------------------------------------------------------------------

    @overload
    def overview(self, queue: str) -> QueueOverview | None: ...

    @overload
    def overview(self, queue: None = None) -> list[QueueOverview]: ...

    def overview(self, queue: str | None = None) -> QueueOverview | list[QueueOverview] | None:
        """The overview of one queue (None: no such queue), or of every queue when None."""
        if queue is None:
            return results.overviews(self.query("overview"))
        return results.overview(self.query("overview", {"queue": queue}))

    def queues(self) -> list[str]:
        """Every queue's name, sorted."""
        return results.names(self.query("queues"))

    def consumers(self, queue: str | None = None) -> dict[str, list[ConsumerInfo]]:
        """The consumers of `queue` (of every queue when None), by queue name."""
        return results.consumers(self.query("consumers", {"queue": queue} if queue else {}))

    def groups(self, queue: str, limit: int = 1000) -> list[GroupInfo]:
        """The tracked message groups of a grouped queue (machine v3), oldest waiting first."""
        return results.groups(self.query("groups", {"queue": queue, "limit": limit}))

    def messages(self, queue: str, limit: int = 100) -> list[MessageInfo]:
        """Up to `limit` messages of `queue` (ids, sizes, delivery counts; not the bodies)."""
        return results.messages(self.query("messages", {"queue": queue, "limit": limit}))

    def status(self, digest: bool = False, timeout_s: float | None = None) -> dict[str, object]:
        """The status map of the connected node (role, term, indexes, digest, versions, pid).
        A node holding more than 50,000 messages leaves the digest out (`digest_skipped` says
        why: it encodes the whole state, stalling the node about 2 us per message) unless
        `digest` is true."""
        args: QueryArgs | None = {"digest": True} if digest else None
        return results.mapping(self.query("status", args, timeout_s), "status")

    def machine(self) -> dict[str, object]:
        """The machine-version status (effective version, per-node support, past switches)."""
        return results.mapping(self.query("machine"), "machine")


def _in(seconds: float) -> float:
    return time.monotonic() + seconds


def _usable(core: ClientProtocol) -> bool:
    return not core.closed and core.failure is None


class _Settler:
    """Settles a dequeued message (the consumer-like owner `Message.ack()` calls)."""

    def __init__(self, client: Client, queue: str) -> None:
        self.client = client
        self.queue = queue

    def ack(self, messages: list[Message]) -> None:
        self._settle(messages, "ack")

    def nack(self, messages: list[Message], requeue: bool = True) -> None:
        self._settle(messages, "requeue" if requeue else "reject")

    def reject(self, messages: list[Message]) -> None:
        self._settle(messages, "reject")

    def _settle(self, messages: list[Message], outcome: str) -> None:
        for message in messages:
            self.client.command(
                calls.settling(self.queue, message.consumer_key, message.msg_id, outcome)
            )
