"""Mutable machine state: slotted classes, shared by every machine version.

`State.version` says which machine the state is shaped for. `apply` mutates these in place; only
the machine modules write to them, queries and the codec only read them.
"""

from __future__ import annotations

from collections import deque

from fifo.commands import ConnectionId, ConsumerKey, QueueConfig

Annotations = tuple[tuple[str, str | int], ...]


class Message:
    """One message: body in memory, expiry, failed deliveries and acquisitions, consumer lock."""

    __slots__ = ("acquired_count", "annotations", "body", "delivery_count", "expiry", "lock")

    def __init__(self, body: bytes, expiry: int | None) -> None:
        self.body = body
        self.expiry = expiry  # absolute ms, None = never
        self.delivery_count = 0  # failed deliveries (discard, down, modify delivery_failed)
        self.acquired_count = 0  # acquisitions that ended in a return or discard
        self.annotations: Annotations = ()
        self.lock = 0  # v2: absolute ms at which the consumer lock expires while checked out


class Consumer:
    """A consumer (competing, SAC active, SAC waiting, cancelled, or an unsettled dequeue)."""

    __slots__ = (
        "attach_index",
        "checked_out",
        "connection",
        "credit",
        "credited",
        "delivery_count",
        "disconnected_fired",
        "drain",
        "in_service",
        "key",
        "next_msg_id",
        "once",
        "prefetch",
        "priority",
        "status",
        "suspected_since",
        "tag",
        "timed_out",
        "timeout_ms",
    )

    def __init__(
        self, key: ConsumerKey, tag: str, connection: ConnectionId, attach_index: int
    ) -> None:
        self.key = key
        self.tag = tag
        self.connection = connection
        self.attach_index = attach_index  # Raft index of the creating checkout: SAC tie-break
        self.credited = False  # credit mode: False = simple_prefetch, True = credited
        self.prefetch = 0
        self.priority = 0
        self.timeout_ms = 0
        self.once = False  # lifetime once: no credit refill, removed when drained
        self.status = "up"  # up | cancelled | quiescing
        self.suspected_since: int | None = None  # set while suspected down (noconnection)
        self.disconnected_fired = False  # v2: the disconnected timeout already ran
        self.timed_out: list[int] = []  # v2: ids taken back by a consumer timeout, sorted
        self.next_msg_id = 0
        self.checked_out: dict[int, Message] = {}
        self.credit = 0
        self.delivery_count = 0  # AMQP 1.0 sender delivery-count, 32-bit serial number
        self.drain = False
        self.in_service = False  # queued in the queue's service ring


class Enqueuer:
    """A publisher id with its dedup window, bound to the connection it last used."""

    __slots__ = ("blocked", "connection", "down_index", "name", "next_seq", "status")

    def __init__(self, name: str, connection: ConnectionId | None) -> None:
        self.name = name
        self.connection = connection
        self.next_seq = 1
        self.status = "up"  # up | suspected | down
        self.blocked: int | None = None  # index at which reject_publish was sent
        self.down_index = 0  # index at which it went down (eviction order)


class Queue:
    """One queue: ready and returned messages, consumers, enqueuers and counters."""

    __slots__ = (
        "blocked_count",
        "bytes_checkout",
        "bytes_ready",
        "config",
        "consumers",
        "enqueuers",
        "key_by_id",
        "last_active",
        "messages_total",
        "name",
        "ready",
        "returns",
        "service",
        "waiting",
    )

    def __init__(self, name: str, config: QueueConfig, now: int) -> None:
        self.name = name
        self.config = config
        self.ready: deque[Message] = deque()
        self.returns: deque[Message] = deque()
        self.messages_total = 0
        self.bytes_ready = 0
        self.bytes_checkout = 0
        self.enqueuers: dict[str, Enqueuer] = {}
        self.blocked_count = 0
        self.consumers: dict[ConsumerKey, Consumer] = {}
        self.waiting: list[Consumer] = []  # SAC only, kept sorted
        self.key_by_id: dict[object, ConsumerKey] = {}  # ConsumerId -> key, for id lookups
        # consumer priority -> keys with credit, round robin within a level
        self.service: dict[int, deque[ConsumerKey]] = {}
        self.last_active = now


class State:
    """The whole replicated machine: a registry of queues plus the monotonic clock."""

    __slots__ = ("last_time", "queues", "version")

    def __init__(self, version: int) -> None:
        self.version = version
        self.last_time = 0
        self.queues: dict[str, Queue] = {}
