"""The virtual clock: one event heap for the whole simulated cluster, and a loop per node.

`RaftNode` is driven by an asyncio loop (`raft.ticker`): it asks it for `call_soon`,
`call_later`, `call_at`, `time()` and reader/writer registrations. `VirtualLoop` answers those
from a shared `Scheduler` whose time only moves when the simulator runs the next event, so no
callback ever sleeps or reads the wall clock, and a seed replays exactly. While a node's callback
runs, its loop is asyncio's running loop (as in production, where `LoopTicker` checks it).
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Any

# the scheduler refuses to run more events than this in one `run_until` (a livelock: some
# callback rescheduling itself at the same instant for ever)
EVENTS_PER_RUN_MAX = 5_000_000
# pending events at once (a run has a few hundred): more is a runaway (seed 62 of the 60 s
# campaign multiplied its events after a heal until the Spark worker died of it); the seed fails
PENDING_EVENTS_MAX = 1_000_000


class SimulationError(RuntimeError):
    """The simulation itself went wrong (a livelock, a callback scheduled in the past)."""


class Handle:
    """A scheduled callback (asyncio's TimerHandle surface that `raft.ticker` uses)."""

    __slots__ = ("_when", "args", "callback", "cancelled", "loop")

    def __init__(
        self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: VirtualLoop
    ) -> None:
        self._when = when
        self.callback = callback
        self.args = args
        self.loop = loop
        self.cancelled = False

    def when(self) -> float:
        """The virtual time it runs at."""
        return self._when

    def cancel(self) -> None:
        """It will not run."""
        self.cancelled = True


class Scheduler:
    """The virtual time and every pending callback of every node, in (time, order) order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Handle]] = []
        self._seq = 0
        self.events = 0

    def schedule(self, when: float, handle: Handle) -> None:
        """Run `handle` at `when` (never before now)."""
        if len(self._heap) >= PENDING_EVENTS_MAX:
            raise SimulationError(f"more than {PENDING_EVENTS_MAX} events pending at {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, handle))

    def run_until(self, deadline: float) -> None:
        """Run every event due up to `deadline`, then set the clock to it."""
        ran = 0
        while self._heap and self._heap[0][0] <= deadline:
            when, _seq, handle = heapq.heappop(self._heap)
            if handle.cancelled or not handle.loop.alive:
                continue
            self.now = when
            ran += 1
            if ran > EVENTS_PER_RUN_MAX:
                raise SimulationError(f"more than {EVENTS_PER_RUN_MAX} events before {deadline}")
            handle.loop.run_handle(handle)
        self.events += ran
        self.now = max(self.now, deadline)


class VirtualLoop:
    """The part of an asyncio loop a RaftNode uses, on the shared virtual clock.

    A crashed node's loop is killed (`alive = False`): nothing it scheduled runs again."""

    def __init__(self, scheduler: Scheduler, name: str) -> None:
        self.scheduler = scheduler
        self.name = name
        self.alive = True

    def time(self) -> float:
        """The virtual time."""
        return self.scheduler.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Handle:
        """Run `callback(*args)` at virtual time `when`."""
        handle = Handle(when, callback, args, self)
        self.scheduler.schedule(when, handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Handle:
        """Run `callback(*args)` after `delay` virtual seconds."""
        return self.call_at(self.scheduler.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Handle:
        """Run `callback(*args)` now, after what is already due now."""
        return self.call_at(self.scheduler.now, callback, *args)

    call_soon_threadsafe = call_soon

    def run_handle(self, handle: Handle) -> None:
        """Run one callback with this loop as asyncio's running loop."""
        previous = asyncio._get_running_loop()
        asyncio._set_running_loop(self)  # type: ignore[arg-type]
        try:
            handle.callback(*handle.args)
        finally:
            asyncio._set_running_loop(previous)

    def run_now(self, callback: Callable[..., Any], *args: Any) -> Any:
        """Run `callback` now, as if on this loop (the simulator's own calls into a node)."""
        previous = asyncio._get_running_loop()
        asyncio._set_running_loop(self)  # type: ignore[arg-type]
        try:
            return callback(*args)
        finally:
            asyncio._set_running_loop(previous)

    # no file descriptors in a simulation: the transport is simulated (raft.sim.network)
    def add_reader(self, *_args: Any) -> None:
        """No sockets here."""

    def add_writer(self, *_args: Any) -> None:
        """No sockets here."""

    def remove_reader(self, *_args: Any) -> bool:
        """No sockets here."""
        return False

    def remove_writer(self, *_args: Any) -> bool:
        """No sockets here."""
        return False

    def is_closed(self) -> bool:
        """Whether the node crashed."""
        return not self.alive
