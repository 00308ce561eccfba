"""The asyncio client: `ClientProtocol` driven on an event loop, with the threaded API's
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

import time
from pathlib import Path
from typing import Unpack, overload

from cluster import protocol
from cluster.client import _requests as calls
from cluster.client import results
from cluster.client._asyncio import AsyncShell
from cluster.client._group_member import GroupOptions
from cluster.client._options import (
    ConsumeOptions,
    DataDirOptions,
    PublishOptions,
    data_dir_connection,
)
from cluster.client._wire import Frame
from cluster.client.aio_consumer import AsyncConsumer, AsyncMessage
from cluster.client.aio_groups import AsyncGroupConsumer, AsyncHandler, AsyncHook
from cluster.client.aio_groups import declare_partitioned_queue as _declare_partitioned
from cluster.client.aio_groups import join_group as _join_group
from cluster.client.aio_publisher import AsyncPublisher
from fifo.codec import encode
from fifo.commands import Command, DeleteQueue, GroupConfig, QueueConfig, UpdateConfig
from fifo.queries import ConsumerInfo, GroupInfo, MessageInfo, QueueOverview
from fifo.replies import DeclareOk, DeleteOk, PurgeOk, Reply

QueryArgs = dict[str, str | int]


class AsyncClient(AsyncShell):
    """An asyncio connection to a quorumq cluster; `async with AsyncClient(...) as client`.

    The options are those of `Client` (`tls=`: the cluster CA's path or an `ssl.SSLContext`
    for a cluster with `tls = true`). Nothing connects until `connect()` (or `async with`).
    """

    @classmethod
    def from_data_dir(cls, data_dir: Path, **options: Unpack[DataDirOptions]) -> AsyncClient:
        """A client for the endpoints of `D/cluster.toml` and the key in `D/client.key`; over
        TLS with `D/tls/ca.crt` when cluster.toml says `tls = true` (`tls` overrides it)."""
        endpoints, key, chosen = data_dir_connection(data_dir, options)
        return cls(endpoints, key, **chosen)

    # --- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Connect (once) to the first node that answers, then to the leader it names."""
        await self._connect()
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush pending acks, close the connection and fail every request still in flight."""
        await self._shutdown()

    # --- requests --------------------------------------------------------------------------

    async def call(self, frame: Frame, timeout_s: float | None = None) -> Frame:
        """Send one request and wait for its answer frame (`reply` or `result`)."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        core = self.core
        answer = await self.request(
            lambda: core.submit(frame, timeout, now=time.monotonic()), timeout, str(frame.get("op"))
        )
        return dict(answer)

    async def command(self, command: Command, timeout_s: float | None = None) -> Reply:
        """Run one command through the log; CommandRefused for an error reply."""
        answer = await self.call(protocol.command(0, encode(command)), timeout_s)
        return calls.reply_of(answer)

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

    async def declare_queue(
        self, queue: str, config: QueueConfig | None = None, groups: GroupConfig | None = None
    ) -> DeclareOk:
        """Create `queue`, as `Client.declare_queue` does (with `groups`: message groups, machine
        v3); a dead-letter queue the config names and that is missing is declared first."""
        target, declaration = calls.declarations(queue, config, groups)
        if target is not None and await self.overview(target) is None:
            await self.declare_queue(target)
        return calls.expect(await self.command(declaration), DeclareOk)

    async def delete_queue(self, queue: str) -> DeleteOk:
        """Delete `queue` and everything in it."""
        return calls.expect(await self.command(DeleteQueue(queue)), DeleteOk)

    async def purge_queue(
        self, queue: str, *, group: str | None = None, default_group: bool = False
    ) -> PurgeOk:
        """Drop every ready message of `queue`; with `group` (or `default_group`), only those of
        that message group of a grouped queue."""
        return calls.expect(await self.command(calls.purging(queue, group, default_group)), PurgeOk)

    async def update_config(self, queue: str, config: QueueConfig) -> Reply:
        """Replace the config of `queue`."""
        return await self.command(UpdateConfig(queue, config))

    # --- publishing and consuming ----------------------------------------------------------

    def publisher(
        self, queue: str, *, window: int = 100, enqueuer: str | None = None
    ) -> AsyncPublisher:
        """A confirmed, pipelined publisher for `queue` with up to `window` unconfirmed messages."""
        return AsyncPublisher(self, queue, window=window, enqueuer=enqueuer)

    async def publish(self, queue: str, body: bytes, **options: Unpack[PublishOptions]) -> None:
        """Publish one message and wait for its confirm (a tracked enqueue, deduplicated);
        `group`: its message group (a grouped queue, machine v3)."""
        timeout_s = options.pop("timeout_s", None) or self.request_timeout_s
        async with self.publisher(queue, window=1) as publisher:
            await publisher.publish(body, **options)
            await publisher.wait_for_confirms(timeout_s)

    def consume(
        self,
        queue: str,
        **options: Unpack[ConsumeOptions],
    ) -> AsyncConsumer:
        """A consumer; `async for` over it, or `await` it to attach first (it attaches once)."""
        return AsyncConsumer(self, queue, **options)

    async def declare_partitioned_queue(
        self, queue: str, partitions: int, config: QueueConfig | None = None
    ) -> DeclareOk:
        """Create partitioned queue `queue` (machine v3): `queue.0` .. `queue.{partitions - 1}`,
        single active consumer each; publish to `queue` itself (routed by group or round
        robin), consume through `join_group`."""
        return await _declare_partitioned(self, queue, partitions, config)

    async def join_group(
        self,
        group: str,
        queue: str,
        *,
        handler: AsyncHandler | None = None,
        **options: Unpack[GroupOptions[AsyncHook]],
    ) -> AsyncGroupConsumer:
        """Join consumer group `group` on partitioned queue `queue` (machine v3): `async for`
        over the result, or pass `handler` to have a task call it per message; `on_assign` /
        `on_revoke` get the partitions that changed. See `cluster.client.aio_groups`."""
        return await _join_group(self, group, queue, handler=handler, **options)

    async def get(self, queue: str, *, settled: bool = False) -> AsyncMessage | None:
        """Take one ready message (basic.get); unless `settled`, ack or nack it like a delivery."""
        tag, connection = self.core.next_tag(), await self.connection_id()
        reply = await self.command(calls.dequeue(queue, tag, connection, settled))
        found = calls.dequeued(reply, tag, connection)
        if found is None:
            return None
        return AsyncMessage(queue, *found, consumer=None if settled else _AsyncSettler(self, queue))

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

    async def groups(self, queue: str, limit: int = 1000) -> list[GroupInfo]:
        """The tracked message groups of a grouped queue (machine v3), oldest waiting first."""
        return results.groups(await self.query("groups", {"queue": queue, "limit": limit}))

    async def messages(self, queue: str, limit: int = 100) -> list[MessageInfo]:
        """Up to `limit` messages of `queue` (ids, sizes, delivery counts; not the bodies)."""
        return results.messages(await self.query("messages", {"queue": queue, "limit": limit}))

    async def status(self, digest: bool = False) -> dict[str, object]:
        """The status map of the connected node (role, term, indexes, digest, versions, pid);
        `digest` as for `Client.status`."""
        return results.mapping(
            await self.query("status", {"digest": True} if digest else None), "status"
        )

    async def machine(self) -> dict[str, object]:
        """The machine-version status (effective version, per-node support, past switches)."""
        return results.mapping(await self.query("machine"), "machine")


class _AsyncSettler:
    """Settles a message taken with `AsyncClient.get` (the owner `message.ack()` calls)."""

    def __init__(self, client: AsyncClient, queue: str) -> None:
        self.client = client
        self.queue = queue

    async def ack(self, messages: list[AsyncMessage]) -> None:
        await self._settle(messages, "ack")

    async def nack(self, messages: list[AsyncMessage], requeue: bool = True) -> None:
        await self._settle(messages, "requeue" if requeue else "reject")

    async def reject(self, messages: list[AsyncMessage]) -> None:
        await self._settle(messages, "reject")

    async def _settle(self, messages: list[AsyncMessage], outcome: str) -> None:
        for message in messages:
            key = message.consumer_key
            await self.client.command(calls.settling(self.queue, key, message.msg_id, outcome))
