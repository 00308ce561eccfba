"""Fast constructors for the hot effects (the steady enqueue -> deliver -> settle path).

A frozen slotted dataclass's generated __init__ costs ~0.7-1 us here (one object.__setattr__
per field); `fifo.wire.constructor` sets the slots through their member descriptors instead and
gives the same, equal and still-frozen object about 3x faster, derived from the class's fields.
"""

from __future__ import annotations

from collections.abc import Callable

from fifo.commands import ConnectionId, ConsumerKey
from fifo.effects import Deliver, Delivery, RefDeliver, RefDelivery
from fifo.state import Annotations
from fifo.wire import constructor

delivery: Callable[[int, bytes, bool, int, Annotations], Delivery] = constructor(Delivery)
deliver: Callable[[ConnectionId, str, str, ConsumerKey, tuple[Delivery, ...]], Deliver] = (
    constructor(Deliver)
)


# machine v4: deliveries by body reference (fifo.bodies)
ref_delivery: Callable[[int, int, int, bool, int, Annotations], RefDelivery] = constructor(
    RefDelivery
)
ref_deliver: Callable[
    [ConnectionId, str, str, ConsumerKey, tuple[Delivery | RefDelivery, ...]], RefDeliver
] = constructor(RefDeliver)


def fresh_delivery(msg_id: int, body: bytes) -> Delivery:
    """Delivery(msg_id, body, redelivered=False, delivery_count=0, annotations=())."""
    return delivery(msg_id, body, False, 0, ())
