"""Message groups (machine v4, copied from v3): the group index, independent of any handler.

A grouped queue keeps its waiting messages per group (`fifo.state.Group`), each group's returned
messages first (in position order), then its never-delivered ones. Dispatch takes, among the
groups that have no owner or are owned by the asking consumer, the one whose head message is
oldest (lowest position): the heaps of `fifo.state.Grouping` give it in O(log groups), with
stale entries dropped lazily (an entry is valid while it names the group's current head and the
heap is the one of the group's current owner). Nothing here scans the queue.
"""

from __future__ import annotations

import heapq

from fifo.commands import ConsumerKey, GroupConfig
from fifo.state import Annotations, Group, GroupId, Grouping, HeapEntry, Message

REBUILD_SLACK = 256  # heap pushes allowed beyond 4 per tracked group before a rebuild


def group_of(config: GroupConfig, annotations: Annotations) -> GroupId:
    """The group a message belongs to: its `group_key` annotation (an int as its decimal text),
    or None (the queue's default group) without one. The last pair with the key counts."""
    gid: GroupId = None
    key = config.group_key
    for k, value in annotations:
        if k == key:
            gid = value if type(value) is str else str(value)
    return gid


def head(group: Group) -> Message | None:
    """The next message the group hands out (a returned one first), or None."""
    if group.returns:
        return group.returns[0]
    if group.ready:
        return group.ready[0]
    return None


def push(grouping: Grouping, group: Group) -> None:
    """Index the group's current head under its owner (or as free); rebuild when stale piles up."""
    message = head(group)
    if message is None:
        return
    entry: HeapEntry = (message.pos, group.gid)
    heapq.heappush(grouping.heads, entry)
    if group.owner is None:
        heapq.heappush(grouping.free, entry)
    else:
        heap = grouping.owned.get(group.owner)
        if heap is None:
            grouping.owned[group.owner] = [entry]
        else:
            heapq.heappush(heap, entry)
    grouping.pushes += 2
    if grouping.pushes > 4 * len(grouping.groups) + REBUILD_SLACK:
        grouping.rebuild()


def _top(grouping: Grouping, heap: list[HeapEntry], owner: ConsumerKey | None, any_owner: bool) -> (
        Group | None):  # fmt: skip
    """The valid group at the top of a heap (popping stale entries), or None."""
    groups = grouping.groups
    while heap:
        pos, gid = heap[0]
        group = groups.get(gid)
        if group is not None and (any_owner or group.owner == owner):
            message = (
                group.returns[0] if group.returns else (group.ready[0] if group.ready else None)
            )
            if message is not None and message.pos == pos:
                return group
        heapq.heappop(heap)
    return None


def pick(grouping: Grouping, key: ConsumerKey | None) -> Group | None:
    """The group a consumer takes from next: the oldest head among free groups and the groups
    it owns (`key` None: free groups only, as for a dequeue)."""
    free = _top(grouping, grouping.free, None, False)
    heap = grouping.owned.get(key) if key is not None else None
    if heap is None:
        return free
    mine = _top(grouping, heap, key, False)
    if mine is None:
        if not heap:
            del grouping.owned[key]  # type: ignore[arg-type]
        return free
    if free is None:
        return mine
    free_head, mine_head = head(free), head(mine)
    assert free_head is not None and mine_head is not None
    return free if free_head.pos < mine_head.pos else mine


def oldest(grouping: Grouping) -> Group | None:
    """The group holding the oldest waiting message, whoever owns it (expiry, drop-head)."""
    return _top(grouping, grouping.heads, None, True)


def tidy(grouping: Grouping, group: Group) -> None:
    """After a change: forget an empty unowned group; an empty owned one is idle (exclusive)."""
    if group.checked_out or group.returns or group.ready:
        if grouping.idle:
            grouping.idle.pop(group.gid, None)
        return
    if group.owner is None:
        del grouping.groups[group.gid]
        grouping.idle.pop(group.gid, None)
    elif group.gid not in grouping.idle:
        grouping.idle[group.gid] = None


def assign(grouping: Grouping, group: Group, key: ConsumerKey) -> None:
    """A consumer takes a message of the group: it owns the group (if it did not already)."""
    group.checked_out += 1
    if group.owner is None:
        group.owner = key
        owned = grouping.by_owner.get(key)
        if owned is None:
            grouping.by_owner[key] = {group.gid: None}
        else:
            owned[group.gid] = None
    if grouping.idle:
        grouping.idle.pop(group.gid, None)


def take_head(grouping: Grouping, group: Group) -> Message:
    """Remove the group's head message from the waiting ones (the caller fixes byte counters)."""
    message = group.returns.pop(0) if group.returns else group.ready.popleft()
    grouping.waiting -= 1
    if group.returns or group.ready:
        push(grouping, group)
    else:
        tidy(grouping, group)
    return message


def add_ready(grouping: Grouping, group: Group, message: Message) -> None:
    """Append a never-delivered message to its group."""
    group.ready.append(message)
    grouping.waiting += 1
    if len(group.ready) == 1 and not group.returns:
        push(grouping, group)
    elif grouping.idle:
        grouping.idle.pop(group.gid, None)


def add_returned(grouping: Grouping, group: Group, message: Message) -> None:
    """Put a returned message back in its group, before the never-delivered ones, by position."""
    returns = group.returns
    if not returns or returns[-1].pos < message.pos:
        returns.append(message)
    else:
        lo, hi = 0, len(returns)
        while lo < hi:
            mid = (lo + hi) // 2
            if returns[mid].pos < message.pos:
                lo = mid + 1
            else:
                hi = mid
        returns.insert(lo, message)
    grouping.waiting += 1
    if returns[0] is message:
        push(grouping, group)


def release(grouping: Grouping, group: Group) -> None:
    """The group has no owner any more: it is free for every consumer."""
    owner = group.owner
    if owner is None:
        return
    owned = grouping.by_owner.get(owner)
    if owned is not None:
        owned.pop(group.gid, None)
        if not owned:
            del grouping.by_owner[owner]
    group.owner = None
    grouping.idle.pop(group.gid, None)
    if group.returns or group.ready:
        push(grouping, group)
    else:
        tidy(grouping, group)


def move(grouping: Grouping, group: Group, key: ConsumerKey) -> None:
    """Give an owned group with nothing checked out to another consumer (rebalancing)."""
    old = group.owner
    if old is not None:
        owned = grouping.by_owner.get(old)
        if owned is not None:
            owned.pop(group.gid, None)
            if not owned:
                del grouping.by_owner[old]
    group.owner = key
    grouping.by_owner.setdefault(key, {})[group.gid] = None
    if group.returns or group.ready:
        push(grouping, group)
    else:
        grouping.idle[group.gid] = None


def release_idle(grouping: Grouping, key: ConsumerKey) -> None:
    """A consumer stops being a sticky owner: its groups with nothing checked out are freed (in
    group-id order; the groups it still holds messages of follow as those come back)."""
    owned = grouping.by_owner.get(key)
    if not owned:
        return
    for gid in sorted(owned, key=sort_key):
        group = grouping.groups[gid]
        if group.checked_out == 0:
            release(grouping, group)


def sort_key(gid: GroupId) -> tuple[int, str]:
    """A total order on group ids (the default group first), for deterministic choices."""
    return (0, "") if gid is None else (1, gid)


def has_room(grouping: Grouping, gid: GroupId, groups_max: int) -> bool:
    """Whether a message of `gid` may be stored: a tracked group, the default group, below the
    limit, or an idle group can be evicted to make room."""
    return (
        gid is None
        or gid in grouping.groups
        or len(grouping.groups) < groups_max
        or bool(grouping.idle)
    )


def make_room(grouping: Grouping, gid: GroupId, groups_max: int) -> None:
    """Evict the longest-idle group if a new group would exceed the limit (see `has_room`)."""
    if (
        gid is None
        or gid in grouping.groups
        or len(grouping.groups) < groups_max
        or not grouping.idle
    ):
        return
    victim = grouping.groups[next(iter(grouping.idle))]
    release(grouping, victim)  # untracks it: nothing waiting, nothing checked out


def group_for(grouping: Grouping, gid: GroupId) -> Group:
    """The tracked group of that id, created if new."""
    group = grouping.groups.get(gid)
    if group is None:
        group = grouping.groups[gid] = Group(gid)
    return group
