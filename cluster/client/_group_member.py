"""What the threaded and the asyncio consumer-group members share: their state, the JoinGroup
and LeaveGroup commands, the round-robin pick over the partitions' buffers and the hook diff.

The I/O (sending, waiting, locking, calling hooks) stays in `groups.py` and `aio_groups.py`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypedDict, TypeVar

from fifo.commands import Cancel, ConnectionId, ConsumerId, JoinGroup, LeaveGroup, SimplePrefetch


class _PartitionConsumer(Protocol):
    """The part of a (threaded or asyncio) consumer a group member uses."""

    core_state: Any

    @property
    def active(self) -> bool: ...


C = TypeVar("C", bound=_PartitionConsumer)
H = TypeVar("H")  # a hook: a function (threaded) or a function or coroutine function (asyncio)


class GroupOptions(TypedDict, Generic[H], total=False):
    """The options of joining a consumer group: `member` (its name; default: a fresh tag),
    `prefetch` (per partition, default 10), and the `on_assign` / `on_revoke` hooks."""

    member: str | None
    prefetch: int
    on_assign: H | None
    on_revoke: H | None


class MemberState(Generic[C]):
    """One member's bookkeeping: who it is (member name, tag, epoch), its partitions and their
    consumers, what the hooks were last told."""

    def __init__(
        self, group: str, queue: str, new_tag: Callable[[], str], options: GroupOptions[Any]
    ) -> None:
        prefetch = options.get("prefetch", 10)
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        self.group = group
        self.queue = queue
        self.prefetch = prefetch
        self.on_assign = options.get("on_assign")
        self.on_revoke = options.get("on_revoke")
        self._base = options.get("member") or new_tag()
        self._incarnations = itertools.count(1)
        self.member = ""
        self.tag = ""
        self.epoch = 0
        self.partitions: list[str] = []
        self._consumers: dict[str, C] = {}
        self._assigned: list[str] = []
        self._turn = 0
        self._reconnects = -1
        self.closed = False

    @property
    def assigned(self) -> list[str]:
        """The partitions this member is active on, as the machine last said."""
        return [p for p in self.partitions if p in self._consumers and self._consumers[p].active]

    def _new_incarnation(self, partitions: int) -> None:
        """Name this (re)join: `member`, then `member.2`, ...; list the partitions."""
        incarnation = next(self._incarnations)
        self.member = self._base if incarnation == 1 else f"{self._base}.{incarnation}"
        self.tag = f"{self.group}/{self.member}"
        self.partitions = [f"{self.queue}.{i}" for i in range(partitions)]

    def _join_command(self, connection: ConnectionId) -> JoinGroup:
        return JoinGroup(
            self.queue, ConsumerId(self.tag, connection), SimplePrefetch(self.prefetch),
            group=self.group, member=self.member,
        )  # fmt: skip

    def _leave_command(self, connection: ConnectionId) -> LeaveGroup:
        return LeaveGroup(
            self.queue, ConsumerId(self.tag, connection), Cancel(),
            group=self.group, member=self.member, epoch=self.epoch,
        )  # fmt: skip

    def _changes(self) -> tuple[list[str], list[str]]:
        """(gained, lost) partitions since the hooks last ran; remembers the new assignment."""
        now = self.assigned
        gained = [p for p in now if p not in self._assigned]
        lost = [p for p in self._assigned if p not in now]
        self._assigned = now
        return gained, lost

    def _pick(self, core: Any) -> tuple[C, Any] | None:
        """The next buffered delivery, taking the partitions in turn (fair across them)."""
        count = len(self.partitions)
        for step in range(count):
            consumer = self._consumers.get(self.partitions[(self._turn + step) % count])
            item = core.next_delivery(consumer.core_state) if consumer is not None else None
            if consumer is not None and item is not None:
                self._turn = (self._turn + step + 1) % count
                return consumer, item
        return None

    def _all_cancelled(self) -> bool:
        """Every partition's consumer was cancelled: the machine deleted the partitioned
        queue (a group never cancels its members' consumers otherwise)."""
        states = [c.core_state for c in self._consumers.values()]
        return bool(states) and all(state.finished for state in states)

    def _close_if_deleted(self, core: Any) -> bool:
        """Close the member (and forget its buffers) when the partitioned queue was deleted;
        whether it was."""
        if not self._all_cancelled():
            return False
        self.closed = True  # nothing more comes
        self._forget_consumers(core)
        return True

    def _forget_consumers(self, core: Any) -> None:
        for consumer in self._consumers.values():
            core.remove_consumer(consumer.core_state)
        self._consumers = {}
        self._assigned = []
