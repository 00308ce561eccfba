"""Effects returned by `apply`: data the node that owns the target connection acts on.

`fifo` never performs an effect. Effects produced by one command may be executed in any order;
across commands, log order holds. Every effect that targets a client names its ConnectionId, so
a node drops effects for connections it does not own (or no longer has, after a restart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fifo.commands import ConnectionId, ConsumerKey


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivered message."""

    msg_id: int
    body: bytes
    redelivered: bool
    delivery_count: int  # failed deliveries so far
    annotations: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send messages to a consumer."""

    connection: ConnectionId
    queue: str
    tag: str
    consumer_key: ConsumerKey
    messages: tuple[Delivery, ...]


@dataclass(frozen=True, slots=True)
class RefDelivery:
    """One delivered message whose body stays in the log (machine v4): `ref` is the meta index
    of its enqueuing command; the node reads the body back (fifo.bodies) before sending."""

    msg_id: int
    ref: int
    size: int
    redelivered: bool
    delivery_count: int
    annotations: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class RefDeliver:
    """`Deliver` as machine v4 gives it: some messages by reference (a body already in hand,
    a fresh publish or an inline body from before v4, as a plain Delivery). Resolved into a
    `Deliver` by `fifo.bodies.resolve_deliver` before anything is sent."""

    connection: ConnectionId
    queue: str
    tag: str
    consumer_key: ConsumerKey
    messages: tuple[Delivery | RefDelivery, ...]


@dataclass(frozen=True, slots=True)
class CreditReply:
    """AMQP 1.0 flow back to a credited consumer, after the deliveries of the same command."""

    connection: ConnectionId
    queue: str
    tag: str
    consumer_key: ConsumerKey
    delivery_count: int
    credit: int
    available: int
    drain: bool
    active: bool


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Tell an enqueuer to stop (`reject_publish`) or resume (`go`) publishing."""

    connection: ConnectionId
    queue: str
    enqueuer: str
    status: Literal["reject_publish", "go"]


@dataclass(frozen=True, slots=True)
class Released:
    """Messages taken back from a consumer (consumer timeout); it must not settle them."""

    connection: ConnectionId
    queue: str
    tag: str
    consumer_key: ConsumerKey
    msg_ids: tuple[int, ...]
    reason: Literal["timeout"]


ConsumerStatusName = Literal["single_active", "waiting", "up", "suspected_down", "timeout"]


@dataclass(frozen=True, slots=True)
class ConsumerUpdate:
    """A consumer was activated or deactivated (SAC) or changed status."""

    connection: ConnectionId
    queue: str
    tag: str
    consumer_key: ConsumerKey
    active: bool
    status: ConsumerStatusName


@dataclass(frozen=True, slots=True)
class ConsumerCancelled:
    """A consumer left: cancelled, removed, down, or its queue was deleted."""

    connection: ConnectionId
    queue: str
    tag: str
    consumer_key: ConsumerKey
    reason: Literal["cancel", "remove", "down", "queue_deleted"]


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """Counter effect: messages left the queue dead-lettered (moved to `target`, or dropped)."""

    queue: str
    reason: Literal["expired", "rejected", "delivery_limit", "maxlen"]
    count: int
    target: str | None


@dataclass(frozen=True, slots=True)
class GroupAssigned(ConsumerUpdate):
    """Consumer group (v3): `member` of `group` is now the active consumer of partition `queue`
    (its consumer `consumer_key`), under the group's `epoch`."""

    group: str = ""
    member: str = ""
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class GroupRevoked(ConsumerUpdate):
    """Consumer group (v3): partition `queue` was taken from `member`; it gets nothing new from
    it and should settle what it holds (the new member starts once those are settled)."""

    group: str = ""
    member: str = ""
    epoch: int = 0


Effect = (
    Deliver | RefDeliver | CreditReply | QueueStatus | Released
    | ConsumerUpdate | ConsumerCancelled | DeadLettered | GroupAssigned | GroupRevoked
)
