"""Read-only queries over the state, returning typed results."""

from __future__ import annotations

from dataclasses import dataclass

from fifo.commands import ConnectionId, ConsumerKey, QueueConfig
from fifo.state import Consumer, Queue, State


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
    """A peeked message (ready or returned)."""

    position: int
    body: bytes
    returned: bool
    delivery_count: int
    expiry_ms: int | None


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
    return QueueOverview(
        name=q.name, ready=len(q.ready), returned=len(q.returns), checked_out=checked_out,
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
    for returned, src in ((False, q.ready), (True, q.returns)):
        for m in src:
            if len(out) >= limit:
                return out
            out.append(MessageInfo(len(out), m.body, returned, m.delivery_count, m.expiry))
    return out
