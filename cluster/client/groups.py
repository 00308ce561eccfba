"""Consumer groups (machine v3): `join_group(client, group, queue)` and its `GroupConsumer`.

The machine decides which partitions of the partitioned queue a member consumes: it checks the
member's consumer out on a partition (the tag this member joined with) when it assigns it, and
stops it when it revokes it (the member settles what it holds; the next member starts only
then). The member registers a receive buffer per partition before joining (deliveries are
routed by queue and tag) and never checks out by itself. `on_assign` / `on_revoke` get the
partitions that changed and run in the thread that calls `get` (or iterates), before the next
message. A member whose connection ends is ended by the machine; after a reconnect `get` joins
again as a new member (`member.2`, ...): the old one's unsettled messages went back to the
partitions.
"""

from __future__ import annotations

import binascii
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar, Unpack

from cluster.client._group_member import GroupOptions, MemberState
from cluster.client.client import Client
from cluster.client.consumer import Consumer, Message
from cluster.client.errors import CommandRefused
from fifo.commands import ConnectionId, DeclarePartitionedQueue, QueueConfig
from fifo.replies import DeclareOk, Error, JoinGroupOk, Reply

Hook = Callable[[list[str]], None]
WAIT_SLICE_S = 0.5


def declare_partitioned_queue(
    client: Client, queue: str, partitions: int, config: QueueConfig | None = None
) -> DeclareOk:
    """Create `queue.0` .. `queue.{partitions - 1}` (single active consumer each)."""
    config = config or QueueConfig(single_active_consumer=True)
    reply = client.command(DeclarePartitionedQueue(queue, config, partitions))
    return _expect(reply, DeclareOk)


def partition_of(key: bytes | str | int, partitions: int) -> int:
    """The partition a publish to a partitioned queue's base name goes to when its partition
    key (its message group, `publish(..., group=key)`) is `key`: CRC-32 of the key's UTF-8 bytes
    (an int as its decimal text) modulo the partition count, as the machine routes it (stable
    across processes, versions and languages; never Python's `hash`)."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    if isinstance(key, int):
        key = str(key)
    if isinstance(key, str):
        key = key.encode("utf-8", "surrogatepass")
    return binascii.crc32(key) % partitions


class GroupConsumer(MemberState[Consumer]):
    """One member of a consumer group: iterate it (or `get`) for messages of its partitions."""

    def __init__(
        self, client: Client, group: str, queue: str, **options: Unpack[GroupOptions[Hook]]
    ) -> None:
        super().__init__(group, queue, client.core.next_tag, options)
        self.client = client

    # --- membership ---------------------------------------------------------------------------

    def join(self) -> None:
        """Join (again, as a new member after a reconnect): buffers first, then JoinGroup.
        A rejoin first revokes (hook) what the ended membership had."""
        lost, self._assigned = self._assigned, []
        if lost and self.on_revoke is not None:
            self.on_revoke(lost)
        self._drop_buffers()
        self._reconnects = self.client.reconnects
        count = self.client.query("partitions", {"queue": self.queue})
        if not isinstance(count, int):
            raise CommandRefused("unknown_queue", f"no partitioned queue {self.queue!r}")
        self._new_incarnation(count)
        for partition in self.partitions:
            consumer = Consumer(self.client, partition, prefetch=self.prefetch, tag=self.tag)
            with self.client.lock:  # inactive until the machine says GroupAssigned
                consumer.core_state.active, consumer.core_state.status = False, "waiting"
            self._consumers[partition] = consumer
        reply = self.client.command(self._join_command(self._connection()))
        if isinstance(reply, Error):
            self._drop_buffers()
            raise CommandRefused(reply.code, reply.message)
        self.epoch = _expect(reply, JoinGroupOk).epoch

    def leave(self) -> None:
        """Leave the group: what this member did not settle goes back to its partitions."""
        if self.closed:
            return
        self.closed = True
        try:
            for consumer in self._consumers.values():
                consumer.flush_acks()
            self.client.command(self._leave_command(self._connection()))
        finally:
            self._drop_buffers()

    close = leave

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()

    # --- receiving ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.get(timeout_s=None)
        if message is None:
            raise StopIteration
        return message

    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next message of any of its partitions (in turn), after running the hooks if the
        assignment changed; None at the timeout or once left."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        client = self.client
        while not self.closed:
            if client.reconnects != self._reconnects:
                self.join()
            self._run_hooks()
            message = self._next_buffered()
            if message is not None:
                return message
            if self._deleted():
                return None
            with client.changed:
                if any(c.core_state.buffer for c in self._consumers.values()):
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                client.changed.wait(WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S))
        return None

    def _next_buffered(self) -> Message | None:
        with self.client.lock:
            found = self._pick(self.client.core)
        self.client.flush()
        return None if found is None else found[0].wrap(found[1])

    def _deleted(self) -> bool:
        """The partitioned queue was deleted: the member is closed now."""
        with self.client.lock:
            return self._close_if_deleted(self.client.core)

    def _run_hooks(self) -> None:
        gained, lost = self._changes()
        if lost and self.on_revoke is not None:
            self.on_revoke(lost)
        if gained and self.on_assign is not None:
            self.on_assign(gained)

    # --- helpers ------------------------------------------------------------------------------

    def _connection(self) -> ConnectionId:
        # the node binds every command to the caller's own connection anyway
        return self.client.connection_id

    def _drop_buffers(self) -> None:
        with self.client.lock:
            self._forget_consumers(self.client.core)


def join_group(
    client: Client,
    group: str,
    queue: str,
    *,
    handler: Callable[[Message], None] | None = None,
    **options: Unpack[GroupOptions[Hook]],
) -> GroupConsumer:
    """Join `group` on partitioned queue `queue` (created by `declare_partitioned_queue` or
    `quorumq queue declare NAME --partitions P`); iterate the result for messages, or pass
    `handler` to have a thread call it for each message (hooks then run in that thread)."""
    consumer = GroupConsumer(client, group, queue, **options)
    consumer.join()
    if handler is not None:
        threading.Thread(
            target=_handle_all, args=(consumer, handler), name=f"qq-group-{group}", daemon=True
        ).start()
    return consumer


def _handle_all(consumer: GroupConsumer, handler: Callable[[Message], None]) -> None:
    for message in consumer:
        handler(message)


_R = TypeVar("_R", DeclareOk, JoinGroupOk)


def _expect(reply: Reply, kind: type[_R]) -> _R:
    if isinstance(reply, Error):
        raise CommandRefused(reply.code, reply.message)
    if not isinstance(reply, kind):
        raise CommandRefused("unexpected_reply", f"expected {kind.__name__}, got {reply!r}")
    return reply
