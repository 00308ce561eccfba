"""Consumer groups with the asyncio client (machine v3): `await client.join_group(group, queue)`.

The asyncio face of `cluster.client.groups`: the machine assigns the partitions of the
partitioned queue and checks this member's consumer out on each (the tag it joined with); the
member keeps a receive buffer per partition and never checks out by itself. `on_assign` /
`on_revoke` get the partitions that changed (plain functions or coroutines) and run in the task
that iterates (or `get`s), before the next message. After a reconnect the machine has ended the
old membership (its unsettled messages went back to the partitions): the next `get` joins again
as a new member (`member.2`, ...). Iteration ends when the member leaves or the partitioned
queue is deleted.

Example:
    async with AsyncClient.from_data_dir(Path("D")) as client:
        async with await client.join_group("billing", "orders") as member:
            async for message in member:
                await message.ack()
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Unpack

from cluster import protocol
from cluster.client._asyncio import AsyncShell
from cluster.client._group_member import GroupOptions, MemberState
from cluster.client._requests import reply_of
from cluster.client.aio_consumer import AsyncConsumer, AsyncMessage
from cluster.client.errors import CommandRefused
from fifo.codec import encode
from fifo.commands import DeclarePartitionedQueue, QueueConfig
from fifo.replies import DeclareOk, JoinGroupOk, Reply

AsyncHook = Callable[[list[str]], Awaitable[None] | None]
AsyncHandler = Callable[[AsyncMessage], Awaitable[None] | None]
WAIT_SLICE_S = 0.5


class AsyncGroupConsumer(MemberState[AsyncConsumer]):
    """One member of a consumer group: `async for` over it (or `await get()`) for the messages
    of its partitions; `await leave()` (or `async with`) to leave."""

    def __init__(
        self, client: AsyncShell, group: str, queue: str, **options: Unpack[GroupOptions[AsyncHook]]
    ) -> None:
        super().__init__(group, queue, client.core.next_tag, options)
        self.client = client
        self.task: asyncio.Task[None] | None = None  # the handler task, if joined with one

    # --- membership ---------------------------------------------------------------------------

    async def join(self) -> AsyncGroupConsumer:
        """Join (again, as a new member after a reconnect): buffers first, then JoinGroup. A
        rejoin first revokes (hook) what the ended membership had."""
        lost, self._assigned = self._assigned, []
        if lost:
            await _invoke(self.on_revoke, lost)
        self._drop_buffers()
        client = self.client
        self._reconnects = client.reconnects
        self._new_incarnation(await self._query_partitions())
        for partition in self.partitions:
            consumer = AsyncConsumer(client, partition, prefetch=self.prefetch, tag=self.tag)
            consumer.core_state.active, consumer.core_state.status = False, "waiting"
            self._consumers[partition] = consumer
        command = self._join_command(await client.connection_id())
        try:
            reply = await _command(client, command)
        except BaseException:
            self._drop_buffers()
            raise
        if not isinstance(reply, JoinGroupOk):
            self._drop_buffers()
            raise CommandRefused("unexpected_reply", f"expected JoinGroupOk, got {reply!r}")
        self.epoch = reply.epoch
        return self

    async def leave(self) -> None:
        """Leave the group: what this member did not settle goes back to its partitions; the
        handler task, if any, is cancelled."""
        if self.closed:
            return
        self.closed = True
        self.client.notify()
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        try:
            for consumer in self._consumers.values():
                await consumer.flush_acks()
            await _command(self.client, self._leave_command(await self.client.connection_id()))
        finally:
            self._drop_buffers()

    close = leave

    async def __aenter__(self) -> AsyncGroupConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.leave()

    # --- receiving ----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[AsyncMessage]:
        return self

    async def __anext__(self) -> AsyncMessage:
        message = await self.get(timeout_s=None)
        if message is None:
            raise StopAsyncIteration
        return message

    async def get(self, timeout_s: float | None = None) -> AsyncMessage | None:
        """The next message of any of its partitions (in turn), after running the hooks if the
        assignment changed; None at the timeout or once left."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        client = self.client
        while not self.closed:
            if client.reconnects != self._reconnects:
                await self.join()
            await self._run_hooks()
            message = self._next_buffered()
            if message is not None:
                return message
            if self._close_if_deleted(client.core):  # the partitioned queue was deleted
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            await client.wait_until(
                self._anything_new, WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S)
            )
        return None

    def _anything_new(self) -> bool:
        if self.closed or self.client.reconnects != self._reconnects or self._all_cancelled():
            return True
        if self.assigned != self._assigned:
            return True
        return any(c.core_state.buffer for c in self._consumers.values())

    def _next_buffered(self) -> AsyncMessage | None:
        found = self._pick(self.client.core)
        self.client.flush()
        return None if found is None else found[0].wrap(found[1])

    async def _run_hooks(self) -> None:
        gained, lost = self._changes()
        if lost:
            await _invoke(self.on_revoke, lost)
        if gained:
            await _invoke(self.on_assign, gained)

    # --- helpers ------------------------------------------------------------------------------

    async def _query_partitions(self) -> int:
        answer = await _call(self.client, protocol.query(0, "partitions", {"queue": self.queue}))
        count = answer.get("result")
        if not isinstance(count, int):
            raise CommandRefused("unknown_queue", f"no partitioned queue {self.queue!r}")
        return count

    def _drop_buffers(self) -> None:
        self._forget_consumers(self.client.core)


async def declare_partitioned_queue(
    client: AsyncShell, queue: str, partitions: int, config: QueueConfig | None = None
) -> DeclareOk:
    """Create `queue.0` .. `queue.{partitions - 1}` (single active consumer each)."""
    config = config or QueueConfig(single_active_consumer=True)
    reply = await _command(client, DeclarePartitionedQueue(queue, config, partitions))
    if not isinstance(reply, DeclareOk):
        raise CommandRefused("unexpected_reply", f"expected DeclareOk, got {reply!r}")
    return reply


async def join_group(
    client: AsyncShell,
    group: str,
    queue: str,
    *,
    handler: AsyncHandler | None = None,
    **options: Unpack[GroupOptions[AsyncHook]],
) -> AsyncGroupConsumer:
    """Join `group` on partitioned queue `queue`; `async for` over the result, or pass `handler`
    (a function or coroutine function) to have a task call it for each message (the hooks then
    run in that task; `leave()` cancels it)."""
    consumer = AsyncGroupConsumer(client, group, queue, **options)
    await consumer.join()
    if handler is not None:
        consumer.task = asyncio.ensure_future(_handle_all(consumer, handler))
    return consumer


async def _handle_all(consumer: AsyncGroupConsumer, handler: AsyncHandler) -> None:
    async for message in consumer:
        await _invoke(handler, message)


async def _invoke(function: Callable[[Any], object] | None, argument: object) -> None:
    """Call a hook or handler; await it if it is a coroutine."""
    if function is None:
        return
    result = function(argument)
    if inspect.isawaitable(result):
        await result


async def _call(client: AsyncShell, frame: dict[str, Any]) -> dict[str, Any]:
    """One request and its answer frame (what `AsyncClient.call` does; this module is below
    `cluster.client.aio`, which imports it)."""
    timeout, core = client.request_timeout_s, client.core
    answer = await client.request(
        lambda: core.submit(frame, timeout, now=time.monotonic()), timeout, str(frame.get("op"))
    )
    return dict(answer)


async def _command(client: AsyncShell, command: object) -> Reply:
    """Run one command through the log; CommandRefused for an error reply."""
    return reply_of(await _call(client, protocol.command(0, encode(command))))
