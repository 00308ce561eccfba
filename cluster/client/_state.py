"""The per-publisher and per-consumer records that `ClientProtocol` keeps (plain data)."""

from __future__ import annotations

from collections import deque

from cluster.client.errors import ClusterError, CommandRefused
from fifo.commands import ConsumerKey
from fifo.effects import CreditReply, Delivery

Buffered = tuple[ConsumerKey, Delivery]  # a delivery with the consumer key it came with


class Unconfirmed:
    """A message sent and not yet confirmed: its body, sequence number and current request."""

    __slots__ = ("body", "publisher", "request_id", "seq", "ttl_ms")

    def __init__(
        self, publisher: PublisherState, seq: int, body: bytes, ttl_ms: int | None
    ) -> None:
        self.publisher = publisher
        self.seq = seq
        self.body = body
        self.ttl_ms = ttl_ms
        self.request_id = 0


class PublisherState:
    """One enqueuer's sequence numbers, unconfirmed messages, counters and failure."""

    def __init__(self, queue: str, window: int, enqueuer: str) -> None:
        self.queue = queue
        self.window = window
        self.enqueuer = enqueuer
        self.next_seq = 1
        self.pending: dict[int, Unconfirmed] = {}
        self.confirmed = 0
        self.resent = 0
        self.blocked = False  # the queue asked us to stop (overflow reject_publish)
        self.error: ClusterError | None = None

    def fail(self, error: ClusterError) -> None:
        """Keep the first failure; every later call raises it."""
        if self.error is None:
            self.error = error

    def renumber(self, start: int) -> None:
        """Give the unconfirmed messages the sequence numbers from `start` on, in order."""
        items = sorted(self.pending.values(), key=lambda p: p.seq)
        self.pending = {}
        for offset, item in enumerate(items):
            item.seq = start + offset
            self.pending[item.seq] = item
        self.next_seq = start + len(items)


class ConsumerState:
    """One consumer: its checkout options, key, status, buffered deliveries and pending acks."""

    def __init__(
        self,
        queue: str,
        tag: str,
        prefetch: int,
        credited: bool,
        priority: int,
        timeout_ms: int | None,
        auto_ack: bool,
        ack_batch: int,
    ) -> None:
        self.queue = queue
        self.tag = tag
        self.prefetch = prefetch
        self.credited = credited
        self.priority = priority
        self.timeout_ms = timeout_ms
        self.auto_ack = auto_ack
        self.ack_batch = ack_batch
        self.consumer_key: ConsumerKey | None = None
        self.active = True
        self.status = "up"
        self.cancelled = False
        self.closed = False
        self.released: set[int] = set()
        self.settle_errors = 0
        self.delivered = 0
        self.delivery_count = 0  # receiver's serial delivery count (credited mode)
        self.last_credit_reply: CreditReply | None = None
        self.buffer: deque[Buffered] = deque()
        self.acks: dict[ConsumerKey, list[int]] = {}
        self.ack_count = 0
        self.outstanding = 0  # settle commands sent and not yet answered

    def require_key(self) -> ConsumerKey:
        """The key of the current checkout; CommandRefused before the first one."""
        if self.consumer_key is None:
            raise CommandRefused("unknown_consumer", "the consumer is not attached")
        return self.consumer_key

    @property
    def finished(self) -> bool:
        """Nothing more will be handed out: cancelled or closed, with the buffer empty."""
        return (self.cancelled or self.closed) and not self.buffer
