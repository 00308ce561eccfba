"""`OrderedWorkPool`: run items on N threads, in order per key, in parallel across keys.

Items with the same key (a "channel") never run at the same time and never overtake each other;
a free worker never idles while some channel has work waiting (see `workpool_core`). `submit`
waits while the item's channel already has `backlog` items waiting: that is the back-pressure.

Example:
    with OrderedWorkPool(handle, workers=16, key=lambda job: job.customer) as pool:
        for job in jobs:
            pool.submit(job)
    # leaving the block waits until every submitted job ran
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from cluster.client._log import get_logger
from cluster.client.workpool_core import CHANNEL_BACKLOG_DEFAULT, ChannelPool

log = get_logger("quorumq.workpool")

T = TypeVar("T")

OnDone = Callable[[T, BaseException | None], None]


class PoolClosed(RuntimeError):
    """Raised by `submit` once the pool was closed or stopped."""


def group_of(item: Any) -> Hashable:
    """The default key: the message's group (None, one channel, when it has none)."""
    group: Hashable = getattr(item, "group", None)
    return group


def check_options(workers: int, backlog: int | None) -> int:
    """Validate the pool options; the backlog to use."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if backlog is not None and backlog < 1:
        raise ValueError("backlog must be at least 1")
    return CHANNEL_BACKLOG_DEFAULT if backlog is None else backlog


class PoolBase(Generic[T]):
    """What the threaded and the asyncio pool share: their checked options, the key that names
    an item's channel and the sans-IO `ChannelPool` that decides what runs next."""

    def __init__(self, workers: int, backlog: int | None, key: Callable[[T], Hashable]) -> None:
        self.backlog = check_options(workers, backlog)
        self.workers = workers
        self._key = key
        self._core: ChannelPool[Hashable, T] = ChannelPool()


class OrderedWorkPool(PoolBase[T]):
    """A thread pool that keeps per-key order.

    `handler(item)` runs on one of `workers` threads; then `on_done(item, error)` runs on the
    same thread (error is the handler's exception, or None) before the next item of that key
    may start, so completions are reported in per-key order. `key(item)` names the channel
    (default: the item's `group` attribute; items without one share one channel).
    """

    def __init__(
        self,
        handler: Callable[[T], object],
        *,
        workers: int,
        key: Callable[[T], Hashable] = group_of,
        backlog: int | None = None,
        on_done: OnDone[T] | None = None,
        name: str = "qq-workpool",
    ) -> None:
        super().__init__(workers, backlog, key)
        self._handler = handler
        self._on_done = on_done
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._has_space = threading.Condition(self._lock)
        self._blocked_submitters = 0
        self._closing = False
        self._completed = 0
        self._failed = 0
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # --- feeding ------------------------------------------------------------------------------

    def submit(self, item: T, timeout_s: float | None = None) -> bool:
        """Queue `item` on its key's channel; waits while that channel has `backlog` items
        waiting (False if `timeout_s` passes first). PoolClosed after close or stop."""
        channel = self._key(item)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while not self._closing and self._core.backlog(channel) >= self.backlog:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._blocked_submitters += 1
                try:
                    self._has_space.wait(left)
                finally:
                    self._blocked_submitters -= 1
            if self._closing:
                raise PoolClosed("the work pool is closed")
            if self._core.submit(channel, item):
                self._has_work.notify()
        return True

    def waiting(self) -> int:
        """Items submitted and not started yet."""
        with self._lock:
            return self._core.waiting

    def busy(self) -> int:
        """Items running now (one per channel in progress)."""
        with self._lock:
            return len(self._core.in_progress)

    @property
    def completed(self) -> int:
        """Items whose handler returned or raised."""
        with self._lock:
            return self._completed

    @property
    def failed(self) -> int:
        """Items whose handler raised."""
        with self._lock:
            return self._failed

    # --- the workers --------------------------------------------------------------------------

    def _work(self) -> None:
        core = self._core
        with self._lock:
            while True:
                started = core.start_work()
                if started is None:
                    if self._closing:
                        return  # nothing ready and nothing more can come: drained
                    self._has_work.wait()
                    continue
                if self._blocked_submitters:
                    self._has_space.notify_all()
                channel, item = started
                self._lock.release()
                try:
                    self._run(item)
                finally:
                    self._lock.acquire()
                core.finish(channel)

    def _run(self, item: T) -> None:
        error: BaseException | None = None
        try:
            self._handler(item)
        except Exception as failure:  # a failing item must not take its worker down
            error = failure
        if self._on_done is None:
            if error is not None:
                log.error("work_failed", error=repr(error))
        else:
            try:
                self._on_done(item, error)
            except Exception:
                log.exception("work_on_done_failed")
        with self._lock:
            self._completed += 1
            self._failed += error is not None

    # --- ending -------------------------------------------------------------------------------

    def close(self) -> None:
        """Take nothing more; the workers run every item already submitted, then exit."""
        with self._lock:
            self._closing = True
            self._has_work.notify_all()
            self._has_space.notify_all()

    def stop(self) -> list[T]:
        """Take nothing more and start nothing more: the items not started yet are returned
        (in submission order); running items finish, then the workers exit."""
        with self._lock:
            self._closing = True
            waiting = self._core.take_waiting()
            self._has_work.notify_all()
            self._has_space.notify_all()
        return waiting

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the workers to exit (after `close` or `stop`); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def __enter__(self) -> OrderedWorkPool[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.join()
