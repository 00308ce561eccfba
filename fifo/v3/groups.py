"""Message groups (machine v3): the group index, independent of any handler.

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


def head(g: Group) -> Message | None:
    """The next message the group hands out (a returned one first), or None."""
    if g.returns:
        return g.returns[0]
    if g.ready:
        return g.ready[0]
    return None


def push(gr: Grouping, g: Group) -> None:
    """Index the group's current head under its owner (or as free); rebuild when stale piles up."""
    m = head(g)
    if m is None:
        return
    entry: HeapEntry = (m.pos, g.gid)
    heapq.heappush(gr.heads, entry)
    if g.owner is None:
        heapq.heappush(gr.free, entry)
    else:
        heap = gr.owned.get(g.owner)
        if heap is None:
            gr.owned[g.owner] = [entry]
        else:
            heapq.heappush(heap, entry)
    gr.pushes += 2
    if gr.pushes > 4 * len(gr.groups) + REBUILD_SLACK:
        gr.rebuild()


def _top(gr: Grouping, heap: list[HeapEntry], owner: ConsumerKey | None, any_owner: bool) -> (
        Group | None):  # fmt: skip
    """The valid group at the top of a heap (popping stale entries), or None."""
    groups = gr.groups
    while heap:
        pos, gid = heap[0]
        g = groups.get(gid)
        if g is not None and (any_owner or g.owner == owner):
            m = g.returns[0] if g.returns else (g.ready[0] if g.ready else None)
            if m is not None and m.pos == pos:
                return g
        heapq.heappop(heap)
    return None


def pick(gr: Grouping, key: ConsumerKey | None) -> Group | None:
    """The group a consumer takes from next: the oldest head among free groups and the groups
    it owns (`key` None: free groups only, as for a dequeue)."""
    free = _top(gr, gr.free, None, False)
    heap = gr.owned.get(key) if key is not None else None
    if heap is None:
        return free
    mine = _top(gr, heap, key, False)
    if mine is None:
        if not heap:
            del gr.owned[key]  # type: ignore[arg-type]
        return free
    if free is None:
        return mine
    fm, mm = head(free), head(mine)
    assert fm is not None and mm is not None
    return free if fm.pos < mm.pos else mine


def oldest(gr: Grouping) -> Group | None:
    """The group holding the oldest waiting message, whoever owns it (expiry, drop-head)."""
    return _top(gr, gr.heads, None, True)


def tidy(gr: Grouping, g: Group) -> None:
    """After a change: forget an empty unowned group; an empty owned one is idle (exclusive)."""
    if g.checked_out or g.returns or g.ready:
        if gr.idle:
            gr.idle.pop(g.gid, None)
        return
    if g.owner is None:
        del gr.groups[g.gid]
        gr.idle.pop(g.gid, None)
    elif g.gid not in gr.idle:
        gr.idle[g.gid] = None


def assign(gr: Grouping, g: Group, key: ConsumerKey) -> None:
    """A consumer takes a message of the group: it owns the group (if it did not already)."""
    g.checked_out += 1
    if g.owner is None:
        g.owner = key
        owned = gr.by_owner.get(key)
        if owned is None:
            gr.by_owner[key] = {g.gid: None}
        else:
            owned[g.gid] = None
    if gr.idle:
        gr.idle.pop(g.gid, None)


def take_head(gr: Grouping, g: Group) -> Message:
    """Remove the group's head message from the waiting ones (the caller fixes byte counters)."""
    m = g.returns.pop(0) if g.returns else g.ready.popleft()
    gr.waiting -= 1
    if g.returns or g.ready:
        push(gr, g)
    else:
        tidy(gr, g)
    return m


def add_ready(gr: Grouping, g: Group, m: Message) -> None:
    """Append a never-delivered message to its group."""
    g.ready.append(m)
    gr.waiting += 1
    if len(g.ready) == 1 and not g.returns:
        push(gr, g)
    elif gr.idle:
        gr.idle.pop(g.gid, None)


def add_returned(gr: Grouping, g: Group, m: Message) -> None:
    """Put a returned message back in its group, before the never-delivered ones, by position."""
    returns = g.returns
    if not returns or returns[-1].pos < m.pos:
        returns.append(m)
    else:
        lo, hi = 0, len(returns)
        while lo < hi:
            mid = (lo + hi) // 2
            if returns[mid].pos < m.pos:
                lo = mid + 1
            else:
                hi = mid
        returns.insert(lo, m)
    gr.waiting += 1
    if returns[0] is m:
        push(gr, g)


def release(gr: Grouping, g: Group) -> None:
    """The group has no owner any more: it is free for every consumer."""
    owner = g.owner
    if owner is None:
        return
    owned = gr.by_owner.get(owner)
    if owned is not None:
        owned.pop(g.gid, None)
        if not owned:
            del gr.by_owner[owner]
    g.owner = None
    gr.idle.pop(g.gid, None)
    if g.returns or g.ready:
        push(gr, g)
    else:
        tidy(gr, g)


def move(gr: Grouping, g: Group, key: ConsumerKey) -> None:
    """Give an owned group with nothing checked out to another consumer (rebalancing)."""
    old = g.owner
    if old is not None:
        owned = gr.by_owner.get(old)
        if owned is not None:
            owned.pop(g.gid, None)
            if not owned:
                del gr.by_owner[old]
    g.owner = key
    gr.by_owner.setdefault(key, {})[g.gid] = None
    if g.returns or g.ready:
        push(gr, g)
    else:
        gr.idle[g.gid] = None


def release_idle(gr: Grouping, key: ConsumerKey) -> None:
    """A consumer stops being a sticky owner: its groups with nothing checked out are freed (in
    group-id order; the groups it still holds messages of follow as those come back)."""
    owned = gr.by_owner.get(key)
    if not owned:
        return
    for gid in sorted(owned, key=sort_key):
        g = gr.groups[gid]
        if g.checked_out == 0:
            release(gr, g)


def sort_key(gid: GroupId) -> tuple[int, str]:
    """A total order on group ids (the default group first), for deterministic choices."""
    return (0, "") if gid is None else (1, gid)


def has_room(gr: Grouping, gid: GroupId, groups_max: int) -> bool:
    """Whether a message of `gid` may be stored: a tracked group, the default group, below the
    limit, or an idle group can be evicted to make room."""
    return gid is None or gid in gr.groups or len(gr.groups) < groups_max or bool(gr.idle)


def make_room(gr: Grouping, gid: GroupId, groups_max: int) -> None:
    """Evict the longest-idle group if a new group would exceed the limit (see `has_room`)."""
    if gid is None or gid in gr.groups or len(gr.groups) < groups_max or not gr.idle:
        return
    victim = gr.groups[next(iter(gr.idle))]
    release(gr, victim)  # untracks it: nothing waiting, nothing checked out


def group_for(gr: Grouping, gid: GroupId) -> Group:
    """The tracked group of that id, created if new."""
    g = gr.groups.get(gid)
    if g is None:
        g = gr.groups[gid] = Group(gid)
    return g
