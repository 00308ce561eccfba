"""`AsyncOrderedWorkPool`: the ordered work pool for asyncio (N worker tasks, one event loop).

The same guarantees as `OrderedWorkPool` (see `workpool_core`): items of one key never run at
the same time nor overtake each other, a free worker task never waits while a key has work, and
`submit` waits while the item's key already has `backlog` items waiting.

Example:
    async with AsyncOrderedWorkPool(handle, workers=16, key=lambda job: job.customer) as pool:
        for job in jobs:
            await pool.submit(job)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

from cluster.client._log import get_logger
from cluster.client.workpool import PoolBase, PoolClosed, group_of

log = get_logger("quorumq.workpool")

T = TypeVar("T")

AsyncOnDone = Callable[[T, BaseException | None], Awaitable[None]]


class AsyncOrderedWorkPool(PoolBase[T]):
    """An asyncio worker pool that keeps per-key order; build it inside a running loop.

    `await handler(item)` runs on one of `workers` tasks; then `await on_done(item, error)`
    (error: the handler's exception, or None) before the next item of that key may start.
    """

    def __init__(
        self,
        handler: Callable[[T], Awaitable[object]],
        *,
        workers: int,
        key: Callable[[T], Hashable] = group_of,
        backlog: int | None = None,
        on_done: AsyncOnDone[T] | None = None,
    ) -> None:
        super().__init__(workers, backlog, key)
        self._loop = asyncio.get_running_loop()
        self._handler = handler
        self._on_done = on_done
        self._idle: deque[asyncio.Future[None]] = deque()  # one per sleeping worker
        self._space: list[asyncio.Future[None]] = []  # submitters waiting for backlog room
        self._closing = False
        self.completed = 0
        self.failed = 0
        self._tasks = [asyncio.ensure_future(self._work()) for _ in range(workers)]

    # --- feeding ------------------------------------------------------------------------------

    async def submit(self, item: T) -> None:
        """Queue `item` on its key's channel; waits while that channel has `backlog` items
        waiting. PoolClosed after close or stop."""
        channel = self._key(item)
        while not self._closing and self._core.backlog(channel) >= self.backlog:
            waiter = self._loop.create_future()
            self._space.append(waiter)
            await waiter
        if self._closing:
            raise PoolClosed("the work pool is closed")
        if self._core.submit(channel, item):
            self._wake_one()

    def waiting(self) -> int:
        """Items submitted and not started yet."""
        return self._core.waiting

    def busy(self) -> int:
        """Items running now (one per channel in progress)."""
        return len(self._core.in_progress)

    def _wake_one(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _wake_all(self) -> None:
        waiters, self._space = self._space, []
        waiters.extend(self._idle)
        self._idle.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- the workers --------------------------------------------------------------------------

    async def _work(self) -> None:
        core = self._core
        while True:
            started = core.start_work()
            if started is None:
                if self._closing:
                    return
                waiter = self._loop.create_future()
                self._idle.append(waiter)
                await waiter
                continue
            if self._space:
                waiters, self._space = self._space, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            channel, item = started
            try:
                error: BaseException | None = None
                try:
                    await self._handler(item)
                except Exception as failure:  # a failing item must not take its worker down
                    error = failure
                if error is not None or self._on_done is not None:
                    await self._report(item, error)
                self.completed += 1
                self.failed += error is not None
            finally:
                core.finish(channel)

    async def _report(self, item: T, error: BaseException | None) -> None:
        if self._on_done is None:
            log.error("work_failed", error=repr(error))
            return
        try:
            await self._on_done(item, error)
        except Exception:
            log.exception("work_on_done_failed")

    # --- ending -------------------------------------------------------------------------------

    def close(self) -> None:
        """Take nothing more; the workers run every item already submitted, then exit."""
        self._closing = True
        self._wake_all()

    def stop(self) -> list[T]:
        """Take nothing more and start nothing more: the items not started yet are returned
        (in submission order); running items finish, then the workers exit."""
        self._closing = True
        waiting = self._core.take_waiting()
        self._wake_all()
        return waiting

    async def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the workers to exit (after `close` or `stop`); False on timeout."""
        done, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("work_task_failed", error=repr(task.exception()))
        return not pending

    async def __aenter__(self) -> AsyncOrderedWorkPool[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.join()
