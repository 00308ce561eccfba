"""The ordered work pool's state, sans I/O: channels that are dormant, ready or in progress.

This is the "Channeling Work" specification of the RabbitMQ Java client's work pool, as data:
every known channel has a sequence of work items, and the known channels are partitioned into
`dormant` (no work), `ready` (a FIFO queue of channels with work, waiting for a worker) and
`in_progress` (a worker runs one of its items). A worker takes the channel at the head of the
ready queue and that channel's first item; when it ends, the channel goes to the back of the
ready queue if it has more work, else it becomes dormant. So items of one channel never run at
the same time nor overtake each other, and a free worker finds work whenever a channel is ready.

The methods named after the specification's operations (`register`, `unregister`, `deliver`,
`start_work`, `end_work`) check their preconditions and raise `ChannelStateError` when one does
not hold. The thread and asyncio shells (`workpool.py`, `workpool_aio.py`) use `submit` and
`finish`, which register a channel on its first item and unregister it when it falls dormant, so
memory is bounded by the channels that have work. Not thread-safe: the shells hold a lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from enum import Enum
from typing import Generic, TypeVar

ChannelT = TypeVar("ChannelT", bound=Hashable)
WorkT = TypeVar("WorkT")

CHANNEL_BACKLOG_DEFAULT = 1_000  # items waiting per channel before `submit` must wait


class ChannelStateError(ValueError):
    """Raised when an operation's precondition does not hold (a programming error in a shell)."""


class Partition(Enum):
    """Which part of the known channels a channel is in."""

    DORMANT = "dormant"
    READY = "ready"
    IN_PROGRESS = "in_progress"


class ChannelPool(Generic[ChannelT, WorkT]):
    """The specification's state: `pool`, `dormant`, `ready`, `in_progress`.

    `pool[channel]` holds (arrival number, item) pairs; the arrival number only lets `take_waiting`
    hand back unstarted work in the order it came. `dormant` and `in_progress` are dicts used as
    insertion-ordered sets.
    """

    def __init__(self) -> None:
        self.pool: dict[ChannelT, deque[tuple[int, WorkT]]] = {}
        self.dormant: dict[ChannelT, None] = {}
        self.ready: deque[ChannelT] = deque()
        self.in_progress: dict[ChannelT, None] = {}
        self.waiting = 0  # items in the pool not started yet, over all channels
        self._arrivals = 0

    # --- the specification's operations ------------------------------------------------------

    def register(self, channel: ChannelT) -> None:
        """A new channel: known, dormant, with no work."""
        if channel in self.pool:
            raise ChannelStateError(f"channel {channel!r} is already known")
        self.pool[channel] = deque()
        self.dormant[channel] = None

    def unregister(self, channel: ChannelT) -> None:
        """Forget a dormant channel (one with work, or being worked on, cannot go)."""
        if channel not in self.dormant:
            raise ChannelStateError(f"channel {channel!r} is not dormant")
        del self.dormant[channel]
        del self.pool[channel]

    def deliver(self, channel: ChannelT, work: WorkT) -> Partition:
        """Append `work` to a known channel; a dormant channel joins the back of the ready
        queue, a ready or in-progress one stays where it is. Returns where it was."""
        items = self.pool.get(channel)
        if items is None:
            raise ChannelStateError(f"channel {channel!r} is not known")
        self._arrivals += 1
        items.append((self._arrivals, work))
        self.waiting += 1
        if channel in self.dormant:
            del self.dormant[channel]
            self.ready.append(channel)
            return Partition.DORMANT
        if channel in self.in_progress:
            return Partition.IN_PROGRESS
        return Partition.READY

    def start_work(self) -> tuple[ChannelT, WorkT] | None:
        """Take the channel at the head of the ready queue and its first item; the channel is
        then in progress. None when no channel is ready."""
        if not self.ready:
            return None
        channel = self.ready.popleft()
        _, work = self.pool[channel].popleft()
        self.waiting -= 1
        self.in_progress[channel] = None
        return channel, work

    def end_work(self, channel: ChannelT) -> bool:
        """The channel's running item is done: back of the ready queue if it has more work
        (True), else dormant (False)."""
        if channel not in self.in_progress:
            raise ChannelStateError(f"channel {channel!r} is not in progress")
        del self.in_progress[channel]
        if self.pool[channel]:
            self.ready.append(channel)
            return True
        self.dormant[channel] = None
        return False

    # --- what the shells use -----------------------------------------------------------------

    def submit(self, channel: ChannelT, work: WorkT) -> bool:
        """Deliver `work`, registering the channel first if it is new; True when the channel
        just became ready (a sleeping worker should be woken)."""
        if channel not in self.pool:
            self.register(channel)
        return self.deliver(channel, work) is Partition.DORMANT

    def finish(self, channel: ChannelT) -> bool:
        """End the channel's work; a channel left dormant is unregistered. True if it has more."""
        more = self.end_work(channel)
        if not more:
            self.unregister(channel)
        return more

    def backlog(self, channel: ChannelT) -> int:
        """Items of `channel` waiting to start (0 for an unknown channel)."""
        items = self.pool.get(channel)
        return 0 if items is None else len(items)

    def partition_of(self, channel: ChannelT) -> Partition | None:
        """Where a channel is; None if it is not known."""
        if channel in self.dormant:
            return Partition.DORMANT
        if channel in self.in_progress:
            return Partition.IN_PROGRESS
        return Partition.READY if channel in self.pool else None

    def take_waiting(self) -> list[WorkT]:
        """Remove every item not started yet and return them in arrival order (for a stop):
        ready channels fall dormant, in-progress ones stay until their item ends."""
        taken = [pair for items in self.pool.values() for pair in items]
        for items in self.pool.values():
            items.clear()
        while self.ready:
            self.dormant[self.ready.popleft()] = None
        self.waiting = 0
        taken.sort(key=lambda pair: pair[0])
        return [work for _, work in taken]

    def work_of(self, channel: ChannelT) -> list[WorkT]:
        """The items of `channel` waiting to start, in order."""
        return [work for _, work in self.pool.get(channel, ())]
