"""Machine v4: messages by body reference. A publish keeps the meta index of its command and
the body's size (`RefMessage`), never the body; messages converted from v3 keep their inline
body until consumed. Deliveries and dequeues say which (`fifo.bodies` resolves them)."""

from __future__ import annotations

from fifo.effects import Delivery, RefDelivery
from fifo.fastbuild import delivery as fast_delivery
from fifo.fastbuild import ref_delivery
from fifo.replies import DequeuedMessage, DequeueOk, RefDequeuedMessage, RefDequeueOk
from fifo.state import Message, RefMessage


def copy_message(message: Message, expiry: int | None) -> Message:
    """A new message with the same body (the same reference, or the same inline bytes)."""
    if type(message) is RefMessage:
        return RefMessage(message.ref, message.size, expiry)
    return Message(message.body, expiry)


def delivery_of(msg_id: int, message: Message) -> Delivery | RefDelivery:
    """How `message` is delivered under `msg_id`: by reference, or with its inline body."""
    redelivered = message.acquired_count > 0 or message.delivery_count > 0
    if type(message) is RefMessage:
        return ref_delivery(msg_id, message.ref, message.size, redelivered,
                            message.delivery_count, message.annotations)  # fmt: skip
    return fast_delivery(msg_id, message.body, redelivered, message.delivery_count,
                         message.annotations)  # fmt: skip


def dequeued(message: Message, ready: int, key: int | None) -> DequeueOk | RefDequeueOk:
    """The reply to a dequeue that took `message` (its id is always 0)."""
    redelivered = message.acquired_count > 0 or message.delivery_count > 0
    if type(message) is RefMessage:
        got = RefDequeuedMessage(0, message.ref, message.size, message.delivery_count,
                                 redelivered)  # fmt: skip
        return RefDequeueOk(got, ready, key)
    return DequeueOk(DequeuedMessage(0, message.body, message.delivery_count, redelivered),
                     ready, key)  # fmt: skip
