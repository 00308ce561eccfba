"""The per-publisher and per-consumer records that `ClientProtocol` keeps (plain data)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from cluster.client.errors import ClusterError, CommandRefused
from fifo.commands import ConsumerKey
from fifo.effects import (
    ConsumerCancelled,
    ConsumerUpdate,
    CreditReply,
    Deliver,
    Delivery,
    Effect,
    Released,
)

SERIAL_MASK = 0xFFFFFFFF  # AMQP 1.0 delivery counts are 32-bit serial numbers

Buffered = tuple[ConsumerKey, Delivery]  # a delivery with the consumer key it came with


class Unconfirmed:
    """A message sent and not yet confirmed: its body, sequence number and current request."""

    __slots__ = ("body", "group", "publisher", "request_id", "seq", "ttl_ms")

    def __init__(
        self,
        publisher: PublisherState,
        seq: int,
        body: bytes,
        ttl_ms: int | None,
        group: str | None = None,
    ) -> None:
        self.publisher = publisher
        self.seq = seq
        self.body = body
        self.ttl_ms = ttl_ms
        self.group = group  # message group (machine v3): sent as the x-group-id annotation
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

    def gap_to_resend(self, item: Unconfirmed, expected: int) -> list[Unconfirmed]:
        """What to send again after `item` was refused with a gap (the queue expects `expected`):
        the unconfirmed messages of [expected, item.seq] sent no later than `item`, in order; if
        none of them is unconfirmed, the queue forgot this enqueuer: every unconfirmed message,
        renumbered from `expected`."""
        earlier = [p for p in self.pending.values() if expected <= p.seq < item.seq]
        if not earlier and expected < item.seq:
            self.renumber(expected)
            return sorted(self.pending.values(), key=lambda p: p.seq)
        sent_before = (p for p in earlier if p.request_id <= item.request_id)
        return [*sorted(sent_before, key=lambda p: p.seq), item]

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

    def apply(self, effect: Effect) -> None:
        """Take a push addressed to this consumer (deliveries, status changes, credit)."""
        if isinstance(effect, Deliver):
            key = effect.consumer_key
            self.buffer.extend((key, delivery) for delivery in effect.messages)
            self.delivered += len(effect.messages)
            self.delivery_count = (self.delivery_count + len(effect.messages)) & SERIAL_MASK
        elif isinstance(effect, Released):
            self.released.update(effect.msg_ids)
            self.status = "timeout"  # until it names the released ids (design, v2)
            dropped = set(effect.msg_ids)
            self.buffer = deque(m for m in self.buffer if m[1].msg_id not in dropped)
        elif isinstance(effect, ConsumerUpdate):
            self.active, self.status = effect.active, effect.status
        elif isinstance(effect, CreditReply):
            self.last_credit_reply = effect
            self.delivery_count = effect.delivery_count
        elif isinstance(effect, ConsumerCancelled) and (
            effect.consumer_key == self.consumer_key or self.consumer_key is None
        ):
            self.cancelled = True

    def keyed(
        self, pairs: Iterable[tuple[ConsumerKey | None, int]]
    ) -> list[tuple[ConsumerKey, int]]:
        """(key, id) pairs with None replaced by the current key; naming timed-out ids clears
        them, and with none left the consumer is back to normal."""
        keyed = [(self.require_key() if k is None else k, msg_id) for k, msg_id in pairs]
        if self.released:
            self.released -= {msg_id for _, msg_id in keyed}
            if not self.released and self.status == "timeout":
                self.status = "up"
        return keyed

    def require_key(self) -> ConsumerKey:
        """The key of the current checkout; CommandRefused before the first one."""
        if self.consumer_key is None:
            raise CommandRefused("unknown_consumer", "the consumer is not attached")
        return self.consumer_key

    @property
    def finished(self) -> bool:
        """Nothing more will be handed out: cancelled or closed, with the buffer empty."""
        return (self.cancelled or self.closed) and not self.buffer
