"""A consumer's messages through the ordered work pool: what `Consumer.process` and
`AsyncConsumer.process` start (see docs/workpool.md).

A feeder takes deliveries from the consumer and submits them to the pool; when a handler
returns, its message is acked, when it raises, the message is returned (`on_error="requeue"`)
or rejected (`"dead_letter"`: dead-lettered if the queue has a target, else dropped), and the
key goes on. Settles leave in per-key completion order. The pool holds unacked messages only,
so the consumer's prefetch bounds it; a key with `backlog` messages waiting blocks the feeder,
and the queue then stops delivering once prefetch messages are unacked: back-pressure.
Stopping cancels the consumer; `drain` runs what was delivered, otherwise what did not start is
returned to the queue. Either way every message is acked, or returned, or given back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Literal, Protocol, TypedDict, TypeVar, Unpack

from cluster.client._log import get_logger
from cluster.client._state import ConsumerState
from cluster.client.errors import ClusterError
from cluster.client.workpool import OrderedWorkPool, PoolClosed, group_of
from cluster.client.workpool_aio import AsyncOrderedWorkPool

log = get_logger("quorumq.workpool")

OnError = Literal["requeue", "dead_letter"]
ON_ERRORS: tuple[OnError, ...] = ("requeue", "dead_letter")
FEED_POLL_S = 0.1  # how often a waiting feeder looks whether it was asked to stop
STOP_TIMEOUT_S_DEFAULT = 60.0


class Delivered(Protocol):
    """What the pool needs of a message: its id (for the logs)."""

    @property
    def msg_id(self) -> int: ...


M = TypeVar("M", bound=Delivered)


class ThreadedSource(Protocol[M]):
    """The parts of `Consumer` that `Processing` uses (the consumer's own state included)."""

    core_state: ConsumerState

    @property
    def queue(self) -> str: ...

    @property
    def tag(self) -> str: ...

    def get(self, timeout_s: float | None = None) -> M | None: ...

    def ack(self, messages: list[M]) -> None: ...

    def nack(self, messages: list[M], requeue: bool = True) -> None: ...

    def reject(self, messages: list[M]) -> None: ...

    def flush_acks(self) -> None: ...

    def cancel(self) -> object: ...

    def take_buffered(self) -> list[M]: ...

    def wait_settled(self, timeout_s: float = 10.0) -> bool: ...


class AsyncSource(Protocol[M]):
    """The parts of `AsyncConsumer` that `AsyncProcessing` uses."""

    core_state: ConsumerState

    @property
    def queue(self) -> str: ...

    async def get(self, timeout_s: float | None = None) -> M | None: ...

    async def ack(self, messages: list[M]) -> None: ...

    async def nack(self, messages: list[M], requeue: bool = True) -> None: ...

    async def reject(self, messages: list[M]) -> None: ...

    async def flush_acks(self) -> None: ...

    async def cancel(self) -> object: ...

    def take_buffered(self) -> list[M]: ...

    async def wait_settled(self, timeout_s: float = 10.0) -> bool: ...


def _check(credited: bool, on_error: str) -> None:
    if on_error not in ON_ERRORS:
        raise ValueError(f"on_error must be one of {ON_ERRORS}, not {on_error!r}")
    if credited:
        raise ValueError("process() needs a prefetch consumer: its prefetch bounds the pool")


class PoolCounts(Protocol):
    """The counters both work pools keep."""

    @property
    def completed(self) -> int: ...

    @property
    def failed(self) -> int: ...

    def waiting(self) -> int: ...

    def busy(self) -> int: ...


class ProcessOptions(TypedDict, Generic[M], total=False):
    """The options of `process(...)`: `workers` (default 8), `key` (names a message's channel;
    default: its group), `on_error` (default "requeue"), `backlog` (per key; default: the
    pool's)."""

    workers: int
    key: Callable[[M], Hashable] | None
    on_error: OnError
    backlog: int | None


class PoolOptions(TypedDict, Generic[M]):
    """What both work pools are built with, from the process options."""

    workers: int
    key: Callable[[M], Hashable]
    backlog: int | None


class ProcessingView(Generic[M]):
    """What both shells' running `process` share: its checked options and its pool's counters."""

    _pool: PoolCounts

    def __init__(self, credited: bool, options: ProcessOptions[M]) -> None:
        self.on_error: OnError = options.get("on_error", "requeue")
        _check(credited, self.on_error)
        self.pool_options: PoolOptions[M] = {
            "workers": options.get("workers", 8),
            "key": options.get("key") or group_of,
            "backlog": options.get("backlog"),
        }

    @property
    def processed(self) -> int:
        """Messages whose handler ran (returned or raised)."""
        return self._pool.completed

    @property
    def failed(self) -> int:
        """Messages whose handler raised (returned or rejected)."""
        return self._pool.failed

    def waiting(self) -> int:
        """Messages in the pool not started yet."""
        return self._pool.waiting()

    def running(self) -> int:
        """Messages whose handler runs now."""
        return self._pool.busy()


Outcome = Literal["ack", "requeue", "reject"]


def outcome_of(queue: str, msg_id: int, error: BaseException | None, on_error: OnError) -> Outcome:
    """How a handled message is settled: acked when its handler returned; else returned
    (`on_error="requeue"`) or rejected, and the failure logged."""
    if error is None:
        return "ack"
    log.warning(
        "process_handler_failed", queue=queue, msg_id=msg_id, on_error=on_error, error=repr(error)
    )
    return "requeue" if on_error == "requeue" else "reject"


class Processing(ProcessingView[M]):
    """`Consumer.process` running: a feeder thread and an `OrderedWorkPool` of worker threads."""

    def __init__(
        self,
        consumer: ThreadedSource[M],
        handler: Callable[[M], object],
        **options: Unpack[ProcessOptions[M]],
    ) -> None:
        super().__init__(consumer.core_state.credited, options)
        self.consumer = consumer
        self._pool: OrderedWorkPool[M] = OrderedWorkPool(
            handler, on_done=self._settle, name=f"qq-process-{consumer.tag}", **self.pool_options
        )
        self._stop_feeding = threading.Event()
        self._leftover: list[M] = []  # taken by the feeder, never submitted
        self._feeder = threading.Thread(
            target=self._feed, name=f"qq-feeder-{consumer.tag}", daemon=True
        )
        self._feeder.start()

    def _feed(self) -> None:
        consumer, pool = self.consumer, self._pool
        while not self._stop_feeding.is_set():
            message = consumer.get(timeout_s=FEED_POLL_S)
            if message is None:
                if consumer.core_state.finished:
                    break  # cancelled or closed, and everything buffered was handed out
                continue
            try:
                while not pool.submit(message, timeout_s=FEED_POLL_S):
                    if self._stop_feeding.is_set():
                        self._leftover.append(message)
                        return
            except PoolClosed:
                self._leftover.append(message)
                return
            except Exception as error:  # the key function raised: the message fails alone
                self._settle(message, error)
        pool.close()

    def _settle(self, message: M, error: BaseException | None) -> None:
        consumer = self.consumer
        outcome = outcome_of(consumer.queue, message.msg_id, error, self.on_error)
        if outcome == "ack":
            consumer.ack([message])
        elif outcome == "requeue":
            consumer.nack([message], requeue=True)
        else:
            consumer.reject([message])
        if self._pool.waiting() == 0:
            consumer.flush_acks()  # workers are about to idle: let the queue refill credit now

    def stop(self, drain: bool = True, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> bool:
        """Cancel the consumer and end. `drain`: run every message already delivered; else
        finish only the running ones and return the rest to the queue. True when everything
        ended and every settle was answered within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        try:
            self.consumer.cancel()  # soft: nothing new comes, what we hold still settles
        except ClusterError as error:
            log.warning("process_cancel_failed", queue=self.consumer.queue, error=str(error))
        if not drain:
            self._stop_feeding.set()
        self._feeder.join(max(0.0, deadline - time.monotonic()))
        give_back: list[M] = []
        if not drain:
            unstarted = self._pool.stop()
            give_back = unstarted + self._leftover + self.consumer.take_buffered()
            self._leftover = []
        ended = self._pool.join(max(0.0, deadline - time.monotonic()))
        if give_back:  # after the running ones were acked: no key's later message runs earlier
            self.consumer.nack(give_back, requeue=True)
        settled = self.consumer.wait_settled(max(0.0, deadline - time.monotonic()))
        return ended and settled and not self._feeder.is_alive()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until processing ends by itself (the consumer was cancelled or closed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._feeder.join(timeout_s)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._pool.join(left) and not self._feeder.is_alive()

    def __enter__(self) -> Processing[M]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=True)


class AsyncProcessing(ProcessingView[M]):
    """`AsyncConsumer.process` running: a feeder task and an `AsyncOrderedWorkPool`."""

    def __init__(
        self,
        consumer: AsyncSource[M],
        handler: Callable[[M], Awaitable[object]],
        **options: Unpack[ProcessOptions[M]],
    ) -> None:
        super().__init__(consumer.core_state.credited, options)
        self.consumer = consumer
        self._pool: AsyncOrderedWorkPool[M] = AsyncOrderedWorkPool(
            handler, on_done=self._settle, **self.pool_options
        )
        self._stop_feeding = False
        self._leftover: list[M] = []
        self._feeder = asyncio.ensure_future(self._feed())

    async def _feed(self) -> None:
        consumer, pool = self.consumer, self._pool
        while not self._stop_feeding:
            message = await consumer.get(timeout_s=FEED_POLL_S)
            if message is None:
                if consumer.core_state.finished:
                    break
                continue
            try:
                await pool.submit(message)
            except PoolClosed:
                self._leftover.append(message)
                return
            except Exception as error:  # the key function raised: the message fails alone
                await self._settle(message, error)
        pool.close()

    async def _settle(self, message: M, error: BaseException | None) -> None:
        consumer = self.consumer
        outcome = outcome_of(consumer.queue, message.msg_id, error, self.on_error)
        if outcome == "ack":
            await consumer.ack([message])
        elif outcome == "requeue":
            await consumer.nack([message], requeue=True)
        else:
            await consumer.reject([message])
        if self._pool.waiting() == 0:
            await consumer.flush_acks()

    async def stop(self, drain: bool = True, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> bool:
        """Cancel the consumer and end. `drain`: run every message already delivered; else
        finish only the running ones and return the rest to the queue. True when everything
        ended and every settle was answered within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        try:
            await self.consumer.cancel()
        except ClusterError as error:
            log.warning("process_cancel_failed", queue=self.consumer.queue, error=str(error))
        give_back: list[M] = []
        if not drain:
            self._stop_feeding = True
            unstarted = self._pool.stop()  # wakes a feeder waiting for backlog room
            await asyncio.wait([self._feeder], timeout=max(0.0, deadline - time.monotonic()))
            give_back = unstarted + self._leftover + self.consumer.take_buffered()
            self._leftover = []
        else:
            await asyncio.wait([self._feeder], timeout=max(0.0, deadline - time.monotonic()))
        ended = await self._pool.join(max(0.0, deadline - time.monotonic()))
        if give_back:  # after the running ones were acked: no key's later message runs earlier
            await self.consumer.nack(give_back, requeue=True)
        settled = await self.consumer.wait_settled(max(0.0, deadline - time.monotonic()))
        return ended and settled and self._feeder.done()

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until processing ends by itself (the consumer was cancelled or closed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        await asyncio.wait([self._feeder], timeout=timeout_s)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return await self._pool.join(left) and self._feeder.done()

    async def __aenter__(self) -> AsyncProcessing[M]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(drain=True)
