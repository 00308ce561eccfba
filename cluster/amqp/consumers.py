"""A channel's consumers and its unacknowledged deliveries (delivery tag -> message)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from cluster.amqp.errors import PRECONDITION_FAILED, ChannelRefusal
from fifo import limits as fifo_limits
from fifo.commands import ConsumerKey
from fifo.effects import Deliver


@dataclass(slots=True)
class Consumer:
    """One basic.consume: the client's tag, the fifo tag it is known by, and what it holds back
    until its consume-ok is sent (deliveries may be applied before the reply arrives)."""

    tag: str
    fifo_tag: str
    queue: str
    no_ack: bool
    key: ConsumerKey | None = None
    announced: bool = False
    held: list[Deliver] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Unacked:
    """A delivered message waiting for its ack: where it is checked out."""

    queue: str
    key: ConsumerKey
    msg_id: int


Batches = dict[tuple[str, ConsumerKey], list[int]]


class UnackedMap:
    """Delivery tags in the order they were given; ack/nack/reject take one or all up to one."""

    def __init__(self) -> None:
        self._by_tag: dict[int, Unacked] = {}
        self._next_tag = 1

    def __len__(self) -> int:
        return len(self._by_tag)

    def add(self, queue: str, key: ConsumerKey, msg_id: int) -> int:
        """A new delivery tag for a delivered message."""
        tag = self._next_tag
        self._next_tag += 1
        self._by_tag[tag] = Unacked(queue, key, msg_id)
        return tag

    def skip_tag(self) -> int:
        """A delivery tag for a message that needs no ack (no-ack consumers, basic.get no-ack)."""
        tag = self._next_tag
        self._next_tag += 1
        return tag

    def take(self, delivery_tag: int, multiple: bool) -> Batches:
        """Remove and group by (queue, consumer key) the messages a tag names (406 if unknown)."""
        if multiple:
            tags = [tag for tag in self._by_tag if delivery_tag == 0 or tag <= delivery_tag]
        elif delivery_tag in self._by_tag:
            tags = [delivery_tag]
        else:
            tags = []
        if not tags and not (multiple and delivery_tag == 0):
            raise ChannelRefusal(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
        return group([self._by_tag.pop(tag) for tag in tags])

    def take_all(self) -> Batches:
        """Every unacked message, grouped (channel close, basic.recover)."""
        taken, self._by_tag = list(self._by_tag.values()), {}
        return group(taken)


def group(messages: list[Unacked]) -> Batches:
    """Message ids by (queue, consumer key), in delivery order."""
    batches: Batches = {}
    for message in messages:
        batches.setdefault((message.queue, message.key), []).append(message.msg_id)
    return batches


def chunks(msg_ids: list[int]) -> Iterator[tuple[int, ...]]:
    """`msg_ids` in pieces a command accepts."""
    step = fifo_limits.msg_ids_per_command_max
    for start in range(0, len(msg_ids), step):
        yield tuple(msg_ids[start : start + step])
