"""Read-only access to machine internals for invariants; the one place that knows their shape.

Everything here only reads `fifo.state` objects: no invariant may mutate the machine.
"""

from __future__ import annotations

from collections.abc import Iterator

from fifo.commands import ConsumerId
from fifo.state import Consumer, ConsumerGroup, Group, Message, Queue, State, inflate

__all__ = ["Consumer", "ConsumerGroup", "Group", "Message", "Queue", "State"]


def queues(state: State) -> Iterator[Queue]:
    """Every queue, in registry order."""
    yield from state.queues.values()


def queue(state: State, name: str) -> Queue | None:
    """A queue by name, or None."""
    found = state.queues.get(name)
    return found if isinstance(found, Queue) else None


def all_consumers(queue_: Queue) -> Iterator[Consumer]:
    """Consumers in the map, then waiting SAC consumers that are not also in the map."""
    seen: list[int] = []
    for consumer in queue_.consumers.values():
        seen.append(id(consumer))
        yield consumer
    for consumer in queue_.waiting:
        if id(consumer) not in seen:
            yield consumer


def find_consumer(queue_: Queue, key: object) -> Consumer | None:
    """Resolve a compact key or a ConsumerId the way a client names a consumer.

    Looks in the consumer map and in the SAC waiting list (a cancelled consumer that checks out
    again while another is active waits there with its pending messages).
    """
    try:
        resolved: object = queue_.key_by_id.get(key, key)
        found: Consumer | None = queue_.consumers.get(resolved)  # type: ignore[call-overload]
    except TypeError:  # an unhashable bad-input key
        return None
    if found is None:
        found = next((c for c in queue_.waiting if c.key == resolved or _same_id(c, key)), None)
    return found


def _same_id(consumer: Consumer, key: object) -> bool:
    return isinstance(key, ConsumerId) and (key.tag, key.connection) == (
        consumer.tag,
        consumer.connection,
    )


def checked_out(queue_: Queue) -> Iterator[tuple[Consumer, int, Message]]:
    """Every checked-out message with its consumer and message id."""
    for consumer in all_consumers(queue_):
        for msg_id, message in consumer.checked_out.items():
            yield consumer, msg_id, message


def ready_count(queue_: Queue) -> int:
    """Ready messages including returned ones (what max_length limits)."""
    return sum(1 for _ in waiting(queue_))


def waiting(queue_: Queue) -> Iterator[Message]:
    """Every message waiting for a consumer: ready and returned ones (v3: in their groups)."""
    yield from map(inflate, queue_.ready)
    yield from map(inflate, queue_.returns)
    grouping = queue_.grouping
    if grouping is not None:
        for group in grouping.groups.values():
            yield from group.returns
            yield from group.ready


def groups(queue_: Queue) -> Iterator[Group]:
    """The tracked message groups of a grouped queue (none for an ungrouped one)."""
    if queue_.grouping is not None:
        yield from queue_.grouping.groups.values()


def enqueuer_next_seq(queue_: Queue, name: str) -> int | None:
    """The machine's next expected sequence number of an enqueuer, None if unknown or down."""
    enqueuer = queue_.enqueuers.get(name)
    if enqueuer is None or getattr(enqueuer, "status", "up") == "down":
        return None
    return enqueuer.next_seq


def partition_totals(state: State, base: str) -> dict[str, int]:
    """v3: each partition of partitioned queue `base` with its messages_total, in order."""
    names = (f"{base}.{i}" for i in range(state.partitioned.get(base, 0)))
    return {name: q.messages_total for name in names if (q := state.queues.get(name)) is not None}


def routed_next_seq(state: State, base: str, name: str) -> int:
    """v3: the next seq the routing of partitioned queue `base` expects from an enqueuer."""
    routing = state.routing.get(base)
    enqueuer = routing.enqueuers.get(name) if routing is not None else None
    return 1 if enqueuer is None else enqueuer.next_seq
