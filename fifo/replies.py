"""Replies returned by `apply`: one per command, data only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fifo.commands import ConsumerKey

ErrorCode = Literal[
    "unknown_command",  # not a command of this machine version
    "invalid_argument",  # wrong type or out-of-range value
    "unknown_queue",
    "unknown_consumer",
    "queue_exists",  # declared again with a different config
    "unsupported",  # valid command that this queue or version does not support
    "unknown_group",  # v3: no consumer group of that name
    "group_exists",  # v3: the group consumes another partitioned queue
    "member_exists",  # v3: the member joined already, from another consumer id
    "fenced",  # v3: the command names an ended (or older) membership
    "not_owner",  # v4: a bound settle from a connection other than its consumer's
    "unknown_exchange",  # v4: no exchange of that name (RabbitMQ's 404)
    "exchange_exists",  # v4: declared again with another type (RabbitMQ's 406)
    "exchange_in_use",  # v4: delete if-unused of an exchange with bindings (RabbitMQ's 406)
    "access_refused",  # v4: a reserved exchange name (`amq.*`, the default exchange; 403)
]


@dataclass(frozen=True, slots=True)
class Ok:
    """The command was applied (or was a harmless duplicate)."""


@dataclass(frozen=True, slots=True)
class Error:
    """The command was refused; the state is unchanged."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class NotEnqueued:
    """An enqueue with a sequence gap: not stored, the publisher must resend in order."""

    expected_seq: int


@dataclass(frozen=True, slots=True)
class RejectPublish:
    """RegisterEnqueuer while the queue is over its limit with overflow reject_publish."""


@dataclass(frozen=True, slots=True)
class DeclareOk:
    """The queue exists with the requested config; `created` is False for a re-declare."""

    created: bool


@dataclass(frozen=True, slots=True)
class DeleteOk:
    """The queue is gone with `messages` messages in it."""

    messages: int


@dataclass(frozen=True, slots=True)
class CheckoutOk:
    """A consumer was attached or updated (fields as they were before this command's deliveries)."""

    consumer_key: ConsumerKey
    next_msg_id: int
    credit: int
    delivery_count: int
    is_active: bool
    num_checked_out: int


@dataclass(frozen=True, slots=True)
class CancelOk:
    """A consumer was cancelled or removed; `consumer_key` is None once it is gone."""

    consumer_key: ConsumerKey | None
    num_checked_out: int


@dataclass(frozen=True, slots=True)
class DequeuedMessage:
    """One message taken by a Dequeue."""

    msg_id: int
    body: bytes
    delivery_count: int
    redelivered: bool


@dataclass(frozen=True, slots=True)
class DequeueOk:
    """A Dequeue result: `message` is None when the queue had nothing ready."""

    message: DequeuedMessage | None
    ready: int
    consumer_key: ConsumerKey | None = None  # set for an unsettled dequeue, to settle it later


@dataclass(frozen=True, slots=True)
class RefDequeuedMessage:
    """One message taken by a Dequeue whose body stays in the log (machine v4): `ref` is the
    meta index of its enqueuing command."""

    msg_id: int
    ref: int
    size: int
    delivery_count: int
    redelivered: bool


@dataclass(frozen=True, slots=True)
class RefDequeueOk:
    """`DequeueOk` for a message by reference (machine v4); the node resolves it into a
    `DequeueOk` (fifo.bodies.resolve_reply) before replying."""

    message: RefDequeuedMessage
    ready: int
    consumer_key: ConsumerKey | None = None


@dataclass(frozen=True, slots=True)
class PurgeOk:
    """Purge dropped `count` messages."""

    count: int


@dataclass(frozen=True, slots=True)
class JoinGroupOk:
    """A member joined (v3): the epoch of this membership and the partition count."""

    epoch: int
    partitions: int


@dataclass(frozen=True, slots=True)
class Routed:
    """A publish through an exchange (v4) was stored in `queues` (sorted; empty: it matched no
    queue and was dropped, not being mandatory); `refused` names matching queues that refused
    it (the publisher's confirm is then negative, as RabbitMQ's)."""

    queues: tuple[str, ...]
    refused: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unroutable:
    """A mandatory publish (v4) matched no queue: nothing was stored; the AMQP layer returns it
    (`basic.return` 312 NO_ROUTE) before confirming it."""

    exchange: str
    routing_key: str


Reply = (
    Ok
    | Error
    | NotEnqueued
    | RejectPublish
    | DeclareOk
    | DeleteOk
    | CheckoutOk
    | CancelOk
    | DequeueOk
    | RefDequeueOk
    | PurgeOk
    | JoinGroupOk
    | Routed
    | Unroutable
)
