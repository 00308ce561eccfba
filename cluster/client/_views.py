"""The read-only faces of a consumer's and a publisher's sans-IO state, shared by both shells.

The threaded (`Consumer`, `Publisher`) and asyncio (`AsyncConsumer`, `AsyncPublisher`) handles
differ only in how they wait; what they report is read here, once, from the core's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, TypeVar

from cluster.client._state import Buffered, ConsumerState, PublisherState
from cluster.client._wire import group_of
from fifo.commands import Command, ConsumerKey, Discard, Modify, RenewLocks, Return
from fifo.effects import CreditReply

_M = TypeVar("_M")
Build = Callable[[ConsumerKey, tuple[int, ...]], Command]  # a settle command for (key, ids)
Annotations = tuple[tuple[str, str | int], ...]


def returning(queue: str, requeue: bool) -> Build:
    """nack: Return (`requeue`: no failed delivery) or Discard."""
    kind = Return if requeue else Discard
    return lambda key, ids: kind(queue, key, ids)


def discarding(queue: str) -> Build:
    """reject: Discard, a failed delivery (dead-lettered when the queue has a target)."""
    return lambda key, ids: Discard(queue, key, ids)


class Modification(TypedDict, total=False):
    """The AMQP 1.0 modified outcome's options: `delivery_failed` (default True: counts as a
    failed delivery), `undeliverable_here` (default False: dead-letter instead of returning),
    `annotations` (added to the message)."""

    delivery_failed: bool
    undeliverable_here: bool
    annotations: Annotations


def modifying(queue: str, outcome: Modification) -> Build:
    """The AMQP 1.0 modified outcome (machine v2)."""
    failed = outcome.get("delivery_failed", True)
    here = outcome.get("undeliverable_here", False)
    annotations = outcome.get("annotations", ())
    return lambda key, ids: Modify(queue, key, ids, failed, here, annotations)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a delivered message holds, the same for both shells (their `Message` and
    `AsyncMessage` add the owner that settles it)."""

    queue: str
    msg_id: int
    body: bytes
    redelivered: bool
    delivery_count: int
    consumer_key: ConsumerKey
    # spelled out: the subclasses' generated __init__ resolves these names in their modules
    annotations: tuple[tuple[str, str | int], ...] = ()
    group: str | None = None


def renewing(queue: str) -> Build:
    """Extend the consumer-timeout locks (machine v2)."""
    return lambda key, ids: RenewLocks(queue, key, ids)


class ConsumerView:
    """What a consumer reports, read from its `ConsumerState` (`core_state`)."""

    core_state: ConsumerState

    @property
    def queue(self) -> str:
        """The queue consumed from."""
        return self.core_state.queue

    @property
    def tag(self) -> str:
        """This consumer's tag, unique to the client."""
        return self.core_state.tag

    @property
    def consumer_key(self) -> ConsumerKey | None:
        """The key of the current checkout (a new one after every reconnect)."""
        return self.core_state.consumer_key

    @property
    def active(self) -> bool:
        """SAC: this is the active consumer; competing: it can receive."""
        return self.core_state.active

    @property
    def status(self) -> str:
        """up | waiting | timeout | suspected_down | single_active, as the queue last said."""
        return self.core_state.status

    @property
    def cancelled(self) -> bool:
        """Cancelled (by us or the queue): nothing new comes."""
        return self.core_state.cancelled

    @property
    def released(self) -> set[int]:
        """Ids taken back on a consumer timeout and not yet named in a settle."""
        return self.core_state.released

    @property
    def settle_errors(self) -> int:
        """Settles the queue refused."""
        return self.core_state.settle_errors

    @property
    def delivered(self) -> int:
        """Messages received."""
        return self.core_state.delivered

    @property
    def delivery_count(self) -> int:
        """The receiver's serial delivery count (credited mode)."""
        return self.core_state.delivery_count

    @property
    def last_credit_reply(self) -> CreditReply | None:
        """The last AMQP 1.0 flow the queue sent back."""
        return self.core_state.last_credit_reply

    def _message(self, make: Callable[..., _M], item: Buffered) -> _M:
        """A buffered delivery as the shell's message type (`Message` / `AsyncMessage`)."""
        key, delivery = item
        return make(
            self.core_state.queue,
            delivery.msg_id,
            delivery.body,
            delivery.redelivered,
            delivery.delivery_count,
            key,
            delivery.annotations,
            group=group_of(delivery.annotations) if delivery.annotations else None,
            consumer=self,
        )


class PublisherView:
    """What a publisher reports, read from its `PublisherState` (`core_state`)."""

    core_state: PublisherState

    @property
    def queue(self) -> str:
        """The queue published to."""
        return self.core_state.queue

    @property
    def window(self) -> int:
        """The most unconfirmed messages at a time."""
        return self.core_state.window

    @property
    def enqueuer(self) -> str:
        """The enqueuer id the queue deduplicates on."""
        return self.core_state.enqueuer

    @property
    def confirmed(self) -> int:
        """Messages confirmed so far."""
        return self.core_state.confirmed

    @property
    def resent(self) -> int:
        """Messages sent again after a sequence gap."""
        return self.core_state.resent

    @property
    def blocked(self) -> bool:
        """True while the queue refuses publishes (overflow `reject_publish`)."""
        return self.core_state.blocked

    @property
    def unconfirmed(self) -> int:
        """Messages sent (or queued to send) and not yet confirmed."""
        return len(self.core_state.pending)
