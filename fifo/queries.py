"""Read-only queries over the state, returning typed results."""

from __future__ import annotations

from dataclasses import dataclass

from fifo.commands import ConnectionId, ConsumerKey, GroupConfig, QueueConfig
from fifo.state import (
    Consumer,
    ConsumerGroup,
    GroupId,
    Message,
    Queue,
    RefMessage,
    State,
    inflate,
)


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """Counters of one queue."""

    name: str
    ready: int  # never-delivered messages waiting
    returned: int  # returned messages waiting (served first)
    checked_out: int
    total: int  # ready + returned + checked out
    bytes: int  # bytes of ready + returned messages
    checked_out_bytes: int
    consumers: int  # consumers in the consumer map (SAC: the active one and cancelled ones)
    waiting_consumers: int
    active_consumer: ConsumerKey | None  # SAC only
    enqueuers: int
    config: QueueConfig


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer as `quorumq consumer list` shows it."""

    key: ConsumerKey
    tag: str
    connection: ConnectionId
    status: str  # up | cancelled | quiescing | suspected_down | timeout | waiting
    credit: int
    credit_mode: str  # simple_prefetch | credited
    prefetch: int
    priority: int
    num_checked_out: int
    delivery_count: int
    active: bool  # SAC: the active consumer; competing: up (not suspected nor timed out)


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """A peeked message (ready or returned). Machine v4: a body that stays in the log comes
    as `body_ref` (the meta index of its enqueuing command, else None) with `body` empty here; the
    node resolves it before answering (fifo.bodies)."""

    position: int
    body: bytes
    returned: bool
    delivery_count: int
    expiry_ms: int | None
    body_ref: int | None = None


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One tracked message group of a grouped queue (v3), as `quorumq queue groups` shows it."""

    group: GroupId  # None: the default group (messages without the group annotation)
    ready: int  # waiting messages (returned ones included)
    returned: int
    checked_out: int
    owner: ConsumerKey | None  # sequenced: the holder; exclusive: the sticky owner
    owner_tag: str | None
    oldest_age_ms: int | None  # age of the oldest waiting message, by the machine's clock


def state_version(state: State) -> int:
    """The machine version the state is shaped for."""
    return state.version


def list_queues(state: State) -> list[str]:
    """Queue names, sorted."""
    return sorted(state.queues)


def _active_key(q: Queue) -> ConsumerKey | None:
    if not q.config.single_active_consumer:
        return None
    for c in q.consumers.values():
        if c.status in ("up", "quiescing"):
            return c.key
    return None


def overview(state: State, queue: str) -> QueueOverview | None:
    """Counters of a queue, or None if it does not exist."""
    q = state.queues.get(queue)
    if q is None:
        return None
    checked_out = sum(len(c.checked_out) for c in (*q.consumers.values(), *q.waiting))
    ready, returned = len(q.ready), len(q.returns)
    if q.grouping is not None:
        for g in q.grouping.groups.values():
            ready += len(g.ready)
            returned += len(g.returns)
    return QueueOverview(
        name=q.name, ready=ready, returned=returned, checked_out=checked_out,
        total=q.messages_total, bytes=q.bytes_ready, checked_out_bytes=q.bytes_checkout,
        consumers=len(q.consumers), waiting_consumers=len(q.waiting),
        active_consumer=_active_key(q), enqueuers=len(q.enqueuers), config=q.config,
    )  # fmt: skip


def _status(q: Queue, c: Consumer, waiting: bool) -> str:
    if c.suspected_since is not None:
        return "suspected_down"
    if c.timed_out:
        return "timeout"
    return "waiting" if waiting else c.status


def _is_active(q: Queue, c: Consumer, waiting: bool) -> bool:
    # SAC: the active consumer (even while suspected); competing: can receive messages now
    if waiting or c.status not in ("up", "quiescing"):
        return False
    if q.config.single_active_consumer:
        return True
    return c.status == "up" and c.suspected_since is None and not c.timed_out


def _info(q: Queue, c: Consumer, waiting: bool) -> ConsumerInfo:
    return ConsumerInfo(
        key=c.key, tag=c.tag, connection=c.connection, status=_status(q, c, waiting),
        credit=c.credit, credit_mode="credited" if c.credited else "simple_prefetch",
        prefetch=c.prefetch, priority=c.priority, num_checked_out=len(c.checked_out),
        delivery_count=c.delivery_count,
        active=_is_active(q, c, waiting),
    )  # fmt: skip


def consumers(state: State, queue: str) -> list[ConsumerInfo]:
    """Consumers of a queue: the consumer map, then the SAC waiting list in order."""
    q = state.queues.get(queue)
    if q is None:
        return []
    return [_info(q, c, False) for c in q.consumers.values()] + [
        _info(q, c, True) for c in q.waiting
    ]


def messages(state: State, queue: str, limit: int = 100) -> list[MessageInfo]:
    """Peek at up to `limit` waiting messages: ready ones first, then returned ones.

    (Delivery serves returned messages first; `returned` tells them apart.)
    """
    q = state.queues.get(queue)
    if q is None or type(limit) is not int or limit <= 0:
        return []
    out: list[MessageInfo] = []
    if q.grouping is not None:  # v3 grouped: waiting messages in enqueue order
        waiting = [(m.pos, False, m) for g in q.grouping.groups.values() for m in g.ready]
        waiting += [(m.pos, True, m) for g in q.grouping.groups.values() for m in g.returns]
        waiting.sort(key=lambda item: item[0])
        for _, returned, m in waiting[:limit]:
            out.append(_message_info(len(out), m, returned))
        return out
    for returned, src in ((False, q.ready), (True, q.returns)):
        for item in src:
            if len(out) >= limit:
                return out
            out.append(_message_info(len(out), inflate(item), returned))
    return out


def _message_info(position: int, m: Message, returned: bool) -> MessageInfo:
    if type(m) is RefMessage:  # v4: the body stays in the log
        return MessageInfo(position, b"", returned, m.delivery_count, m.expiry, m.ref)
    return MessageInfo(position, m.body, returned, m.delivery_count, m.expiry)


def group_config(state: State, queue: str) -> GroupConfig | None:
    """The message-group config of a queue (v3), None if it is not grouped or does not exist."""
    q = state.queues.get(queue)
    return None if q is None or q.grouping is None else q.grouping.config


def groups(state: State, queue: str, limit: int = 1000) -> list[GroupInfo]:
    """The tracked groups of a grouped queue (v3), oldest waiting message first, then idle and
    held-only groups in id order; at most `limit`. Empty for an ungrouped or unknown queue."""
    q = state.queues.get(queue)
    if q is None or q.grouping is None or type(limit) is not int or limit <= 0:
        return []
    tags = {c.key: c.tag for c in (*q.consumers.values(), *q.waiting)}
    now = state.last_time
    rows: list[tuple[tuple[int, int, str], GroupInfo]] = []
    for g in q.grouping.groups.values():
        head: Message | None = g.returns[0] if g.returns else (g.ready[0] if g.ready else None)
        oldest = None if head is None else head.enqueued_at  # the head is the oldest waiting
        info = GroupInfo(g.gid, len(g.returns) + len(g.ready), len(g.returns), g.checked_out,
                         g.owner, tags.get(g.owner) if g.owner is not None else None,
                         None if oldest is None else max(0, now - oldest))  # fmt: skip
        order = (0, head.pos, "") if head is not None else (1, 0, "" if g.gid is None else g.gid)
        rows.append((order, info))
    rows.sort(key=lambda row: row[0])
    return [info for _, info in rows[:limit]]


# --- v3: partitioned queues and consumer groups ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerGroupOverview:
    """One consumer group as `quorumq group list` shows it."""

    group: str
    queue: str  # the partitioned queue
    partitions: int
    members: int
    epoch: int
    pending: int  # partitions handed over but not yet to their new member
    last_rebalance_index: int
    last_moves: int  # partitions the last rebalance took from a remaining member
    last_reassigned: int  # partitions whose member it changed (a departed one's included)


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    """A member: join order, epoch, consumer id, and its partitions (target)."""

    member: str
    join_seq: int
    epoch: int
    tag: str
    connection: ConnectionId | None
    partitions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupPartitionInfo:
    """A partition of a group: its member, who still holds it during a hand-over, and its lag."""

    partition: str
    member: str | None  # the target
    holder: str | None  # active or draining on it
    pending: bool  # holder != member: the hand-over waits for the holder's messages
    lag: int  # messages waiting (ready and returned)
    checked_out: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupInfo:
    """`quorumq group describe G`: the overview, members in join order, partitions in order."""

    overview: ConsumerGroupOverview
    members: tuple[GroupMemberInfo, ...]
    partitions: tuple[GroupPartitionInfo, ...]


def partition_count(state: State, queue: str) -> int | None:
    """Partitions of a partitioned queue (v3), or None if `queue` is not one."""
    return state.partitioned.get(queue)


def consumer_groups(state: State) -> list[ConsumerGroupOverview]:
    """Every consumer group (v3), by name."""
    return [_group_overview(state.consumer_groups[name]) for name in sorted(state.consumer_groups)]


def consumer_group(state: State, name: str) -> ConsumerGroupInfo | None:
    """One consumer group in full (v3), or None."""
    g = state.consumer_groups.get(name)
    if g is None:
        return None
    assignment = g.assignment()
    members = tuple(
        GroupMemberInfo(m.member, m.join_seq, m.epoch, m.tag, m.connection,
                        assignment.get(m.member, ()))
        for m in g.members.values()
    )  # fmt: skip
    parts = []
    for partition in g.partitions:
        q = state.queues.get(partition)
        lag = checked_out = 0
        if q is not None:
            o = overview(state, partition)
            assert o is not None
            lag, checked_out = o.ready + o.returned, o.checked_out
        member, holder = g.target.get(partition), g.holder.get(partition)
        parts.append(GroupPartitionInfo(partition, member, holder, member != holder, lag,
                                        checked_out))  # fmt: skip
    return ConsumerGroupInfo(_group_overview(g), members, tuple(parts))


def _group_overview(g: ConsumerGroup) -> ConsumerGroupOverview:
    return ConsumerGroupOverview(
        g.name, g.queue, len(g.partitions), len(g.members), g.epoch, len(g.pending()),
        g.last_rebalance_index, g.last_moves, g.last_reassigned,
    )  # fmt: skip
