"""Message bodies kept in the log (machine v4): which entries the state still needs, and how a
delivery or a dequeue by reference becomes one with its body.

From v4 a publish's body is not copied into the state: the message keeps `ref`, the meta index
of its enqueuing command (raft index * `limits.commands_per_entry_max` + position), and the
body's size. Effects and replies carry the reference (`RefDeliver`, `RefDequeueOk`); whoever
sends them (the node, the fuzzer, a replay) resolves them here with a `BodyLookup` that reads the
command at that index from its log. Pure: the lookup does the reading.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from fifo import limits
from fifo.commands import Enqueue, PublishToExchange
from fifo.effects import Deliver, Delivery, Effect, RefDeliver, RefDelivery
from fifo.errors import FifoError
from fifo.replies import DequeuedMessage, DequeueOk, RefDequeueOk, Reply
from fifo.state import BODY_SIZE_BITS, BODY_SIZE_MASK, RefMessage, State, Waiting

BodyLookup = Callable[[int], bytes]  # meta index of an enqueuing command -> its body

__all__ = [
    "BodyLookup",
    "BodyMissingError",
    "body_of_command",
    "entry_index",
    "live_entry_indexes",
    "referenced_bodies",
    "references",
    "refs_in",
    "resolve_deliver",
    "resolve_effects",
    "resolve_reply",
]


class BodyMissingError(FifoError):
    """Raised when the body a message refers to cannot be found: its entry is gone from the
    log, or the command at that index holds no body. Names the meta index (never an empty
    body in its place)."""

    def __init__(self, ref: int, why: str) -> None:
        super().__init__(
            f"the body at meta index {ref} (raft index {entry_index(ref)}) is missing: {why}"
        )
        self.ref = ref


def entry_index(ref: int) -> int:
    """The Raft index of the entry holding the command at meta index `ref`."""
    return ref // limits.commands_per_entry_max


def body_of_command(command: object) -> bytes | None:
    """The body a command carries (an Enqueue or one of its subclasses, or a v4
    PublishToExchange, whose one body every queue it was stored in refers to), else None."""
    if isinstance(command, Enqueue | PublishToExchange) and type(command.body) is bytes:
        return command.body
    return None


def _items(state: State) -> Iterator[Waiting]:
    """Every message the state holds (waiting, returned, grouped, checked out), a plain waiting
    v4 message as its packed int."""
    for queue in state.queues.values():
        yield from queue.ready
        yield from queue.returns
        if queue.grouping is not None:
            for group in queue.grouping.groups.values():
                yield from group.returns
                yield from group.ready
        for consumer in (*queue.consumers.values(), *queue.waiting):
            yield from consumer.checked_out.values()


def references(state: State) -> Iterator[int]:
    """The packed reference (`ref << BODY_SIZE_BITS | size`) of every message whose body stays
    in the log (none before machine v4): a plain waiting message is one already, no object is
    made for it."""
    for item in _items(state):
        if type(item) is int:
            yield item
        elif type(item) is RefMessage:
            yield item.packed


def live_entry_indexes(state: State) -> list[int]:
    """The sorted distinct Raft indexes of the entries holding a body the state still refers
    to (ready, checked out, returned, dead-lettered into another queue); [] for v1-v3 states,
    whose bodies are inline. O(messages): called when a snapshot is taken."""
    shift, span = BODY_SIZE_BITS, limits.commands_per_entry_max
    return sorted({(packed >> shift) // span for packed in references(state)})


def referenced_bodies(state: State) -> tuple[int, int]:
    """(messages, bytes) of the bodies the state refers to in the log (for metrics)."""
    count = size = 0
    for packed in references(state):
        count += 1
        size += packed & BODY_SIZE_MASK
    return count, size


def resolve_deliver(effect: RefDeliver, body_of: BodyLookup) -> Deliver:
    """The `Deliver` to send for a v4 delivery: every reference replaced by its body."""
    messages = tuple(
        item if isinstance(item, Delivery) else Delivery(
            item.msg_id, _body(body_of, item.ref, item.size), item.redelivered,
            item.delivery_count, item.annotations)
        for item in effect.messages
    )  # fmt: skip
    return Deliver(effect.connection, effect.queue, effect.tag, effect.consumer_key, messages)


def resolve_effects(effects: Iterable[Effect], body_of: BodyLookup) -> list[Effect]:
    """`effects` with every `RefDeliver` resolved into a `Deliver`, in order."""
    return [
        resolve_deliver(effect, body_of) if type(effect) is RefDeliver else effect
        for effect in effects
    ]


def resolve_reply(reply: Reply, body_of: BodyLookup) -> Reply:
    """A `RefDequeueOk` resolved into a `DequeueOk`; any other reply as it is."""
    if type(reply) is not RefDequeueOk:
        return reply
    ref = reply.message
    message = DequeuedMessage(
        ref.msg_id, _body(body_of, ref.ref, ref.size), ref.delivery_count, ref.redelivered
    )
    return DequeueOk(message, reply.ready, reply.consumer_key)


def refs_in(effects: Iterable[object]) -> list[int]:
    """The body references the given effects and replies need, in order of appearance."""
    out: list[int] = []
    for item in effects:
        if isinstance(item, RefDeliver):
            out.extend(m.ref for m in item.messages if isinstance(m, RefDelivery))
        elif isinstance(item, RefDequeueOk):
            out.append(item.message.ref)
    return out


def _body(body_of: BodyLookup, ref: int, size: int) -> bytes:
    """The body at `ref`, checked against the size the state recorded."""
    body = body_of(ref)
    if len(body) != size:
        raise BodyMissingError(ref, f"the log holds {len(body)} bytes there, the state {size}")
    return body
