"""Consuming with the asyncio client: `async for message in consumer`, `await message.ack()`.

Settling works as in `cluster.client.consumer` (acks batched, the rest sent at once); the state
lives in `ClientProtocol`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Protocol, Unpack

from cluster.client import _views as views
from cluster.client._asyncio import AsyncShell
from cluster.client._options import ConsumerOptions
from cluster.client._requests import reply_of
from cluster.client._state import Buffered, ConsumerState
from cluster.client._views import ConsumerView, Delivery, Modification
from cluster.client.workpool_consumer import AsyncProcessing, ProcessOptions
from fifo.commands import Cancel, ConsumerKey, Remove
from fifo.replies import CancelOk


class AsyncSettles(Protocol):
    """What an async message is settled through: its consumer (or the client, for a get)."""

    async def ack(self, messages: list[AsyncMessage]) -> None: ...

    async def nack(self, messages: list[AsyncMessage], requeue: bool = True) -> None: ...

    async def reject(self, messages: list[AsyncMessage]) -> None: ...


@dataclass(frozen=True, slots=True)
class AsyncMessage(Delivery):
    """One delivered message; settle it with `await message.ack()` (or nack, reject)."""

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


class AsyncConsumer(ConsumerView):
    """A consumer of one queue (prefetch or AMQP 1.0 credit); attaches on first use."""

    def __init__(self, client: AsyncShell, queue: str, **options: Unpack[ConsumerOptions]) -> None:
        self.client = client
        self.core_state: ConsumerState = client.core.add_consumer(queue, **options)
        self._attach: asyncio.Future[None] | None = None

    # --- attach ---------------------------------------------------------------------------

    async def start(self) -> AsyncConsumer:
        """Attach to the queue (once; later calls wait for the same checkout)."""
        if self._attach is None:
            self._attach = asyncio.ensure_future(self._checkout())
        await asyncio.shield(self._attach)
        return self

    async def _checkout(self) -> None:
        core, timeout = self.client.core, self.client.request_timeout_s
        try:
            answer = await self.client.request(
                lambda: core.attach(self.core_state, timeout, now=time.monotonic()),
                timeout,
                "checkout",
            )
            reply_of(answer)
        except BaseException:
            core.remove_consumer(self.core_state)
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

    async def messages(self, idle_timeout_s: float) -> AsyncIterator[AsyncMessage]:
        """The messages as they come, until none came for `idle_timeout_s` (the queue stayed
        empty) or the consumer was cancelled. Iterating the consumer itself waits forever.

        Example: `async for message in client.consume("jobs").messages(idle_timeout_s=2.0):`
        """
        while (message := await self.get(timeout_s=idle_timeout_s)) is not None:
            yield message

    async def get(self, timeout_s: float | None = None) -> AsyncMessage | None:
        """The next message, waiting up to `timeout_s` (None: until cancelled or closed)."""
        attach = self._attach
        if attach is None or not attach.done():
            await self.start()
        else:
            attach.result()  # raises if the checkout failed
        client, core, state = self.client, self.client.core, self.core_state
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            item = core.next_delivery(state)
            client.flush()
            if item is not None:
                return self.wrap(item)
            if state.finished:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            await client.wait_until(lambda: bool(state.buffer) or state.finished, left)

    def wrap(self, item: Buffered) -> AsyncMessage:
        """A buffered delivery as a `AsyncMessage` of this consumer."""
        return self._message(AsyncMessage, item)

    def take_buffered(self) -> list[AsyncMessage]:
        """Remove and return the messages received but not yet handed out (not acked)."""
        return [self.wrap(item) for item in self.client.core.take_buffered(self.core_state)]

    async def process(
        self,
        handler: Callable[[AsyncMessage], Awaitable[object]],
        **options: Unpack[ProcessOptions[AsyncMessage]],
    ) -> AsyncProcessing[AsyncMessage]:
        """Attach, then run `await handler(message)` on `workers` tasks, in order per key, in
        parallel across keys; ack when it returns, nack (`on_error`: requeue | dead_letter) when
        it raises. `key` defaults to the message's group (no group: one shared key). `backlog`
        caps the messages waiting per key. Stop with `await .stop(drain=...)`."""
        await self.start()
        return AsyncProcessing(self, handler, **options)

    # --- settling ---------------------------------------------------------------------------

    async def ack(self, messages: Iterable[AsyncMessage | int]) -> None:
        """Settle messages (batched: sent once `ack_batch` are waiting or on `flush_acks`)."""
        self.client.core.ack(self.core_state, _pairs(messages))
        self.client.flush()

    async def flush_acks(self) -> None:
        """Send every buffered ack now."""
        self.client.core.flush_acks(self.core_state)
        self.client.flush()

    async def nack(self, messages: Iterable[AsyncMessage | int], requeue: bool = True) -> None:
        """Return messages (`requeue`, no failed delivery) or reject them."""
        self._settle(messages, views.returning(self.queue, requeue))

    async def reject(self, messages: Iterable[AsyncMessage | int]) -> None:
        """Discard messages: a failed delivery; dead-lettered when the queue has a target."""
        self._settle(messages, views.discarding(self.queue))

    async def modify(
        self,
        messages: Iterable[AsyncMessage | int],
        **outcome: Unpack[Modification],
    ) -> None:
        """AMQP 1.0 modified outcome (machine v2): return or dead-letter with annotations."""
        self._settle(messages, views.modifying(self.queue, outcome))

    async def renew(self, messages: Iterable[AsyncMessage | int]) -> None:
        """Extend the consumer-timeout locks of checked-out messages (machine v2)."""
        self._settle(messages, views.renewing(self.queue))

    async def grant(self, credit: int, drain: bool = False) -> None:
        """Credited mode: grant `credit` more deliveries (AMQP 1.0 flow)."""
        await self.start()
        self.client.core.grant(self.core_state, credit, drain)
        self.client.flush()

    def _settle(self, messages: Iterable[AsyncMessage | int], build: views.Build) -> None:
        self.client.core.settle(self.core_state, _pairs(messages), build)
        self.client.flush()

    async def wait_settled(self, timeout_s: float = 10.0) -> bool:
        """Flush acks and wait until every settle sent so far is answered; False on timeout."""
        await self.flush_acks()
        state = self.core_state
        return await self.client.wait_until(lambda: state.outstanding <= 0, timeout_s)

    # --- leaving ----------------------------------------------------------------------------

    async def cancel(self) -> CancelOk | None:
        """Soft cancel: nothing new; pending messages can still be settled. A no-op (None) on a
        consumer already cancelled (by `process(...).stop()`, say)."""
        if self.core_state.cancelled:
            return None
        return await self._leave(Cancel())

    async def remove(self) -> CancelOk | None:
        """Hard cancel (machine v2): pending messages return to the queue at once."""
        return await self._leave(Remove())

    async def _leave(self, spec: Cancel | Remove) -> CancelOk | None:
        core, timeout = self.client.core, self.client.request_timeout_s
        answer = await self.client.request(
            lambda: core.leave(self.core_state, spec, timeout, now=time.monotonic()),
            timeout,
            "cancel",
        )
        reply = reply_of(answer)
        core.left(self.core_state)
        self.client.notify()
        return reply if isinstance(reply, CancelOk) else None

    def close(self) -> None:
        """Flush acks and stop iterating (the consumer stays attached until its connection ends)."""
        self.client.core.close_consumer(self.core_state)
        self.client.flush()
        self.client.notify()
