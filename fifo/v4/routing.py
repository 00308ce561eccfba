"""Machine v4 (copied from v3): a publish to a partitioned queue's base name, routed to one of
its partitions.

- **Key.** A message's partition key is its message group: the `x-group-id` annotation (an int
  as its decimal text, the last pair counts, as for grouped queues). A keyed message goes to
  partition `crc32(utf-8 bytes of the key) mod partitions` (`partition_index`; CRC-32 is stable
  across processes, versions and languages, never Python's `hash`), so every message of one
  group lands on one partition and is consumed in order by one member. The client computes the
  same with `cluster.client.groups.partition_of`.
- **No key.** Round robin: the partition at the cursor, then the cursor moves on. The cursor is
  replicated state (`state.routing`), so every replica routes alike.
- **Dedup.** A publisher's (enqueuer, seq) is tracked for the partitioned queue as a whole, not
  per partition: a resend after a lost confirm is answered `Ok` and stored nowhere, whichever
  partition the first copy went to (a keyless resend would otherwise land on the next one).
  Gaps are refused with `NotEnqueued`. Enqueuers follow the plain queue's rules (bound to their
  last connection, `down` on a normal close keeping their dedup, at most
  `enqueuers_per_queue_max`, the earliest down evicted first).
- **Reply.** What a plain queue answers (`Ok` stored or duplicate, `NotEnqueued`), so a
  publisher works unchanged; the partition is not named (a keyed one is `partition_index`).
- **Limits.** The partition's own: its length limits and overflow apply to the routed message.
  Flow-control notices (`QueueStatus`) go to a partition's own enqueuers only, not to the
  publishers of the base name.

Nothing is changed before the routed message is stored: a refusal leaves cursor and dedup as
they were.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    AnnotatedEnqueue,
    ConnectionId,
    Enqueue,
    GroupConfig,
    RegisterEnqueuer,
)
from fifo.replies import Error, NotEnqueued, Reply
from fifo.shared import OK, Annotations, Ctx, invalid
from fifo.state import Enqueuer, Routing, State
from fifo.v4 import groups as group_index

PARTITION_KEY = "x-group-id"  # the annotation whose value is a message's partition key
_KEY_CONFIG = GroupConfig(PARTITION_KEY)

if TYPE_CHECKING:
    from fifo.v4.machine import QueueMachine


def partition_name(queue: str, index: int) -> str:
    """Member queue `index` of partitioned queue `queue`."""
    return f"{queue}.{index}"


def partitioned_of(state: State, queue: str) -> str | None:
    """The partitioned queue that `queue` is a partition of, or None."""
    base, dot, index = queue.rpartition(".")
    if not dot or not index.isdigit():
        return None
    count = state.partitioned.get(base)
    return base if count is not None and int(index) < count else None


def partition_index(key: str, partitions: int) -> int:
    """The partition of a key: CRC-32 of its UTF-8 bytes modulo the partition count."""
    return binascii.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def next_cursor(index: int, partitions: int) -> int:
    """Where round robin goes after a keyless message went to partition `index`."""
    return (index + 1) % partitions


def partition_key(annotations: Annotations) -> str | None:
    """A message's partition key (its message group), or None: round robin."""
    return group_index.group_of(_KEY_CONFIG, annotations)


class Router:
    """Registry-level handlers for commands naming a partitioned queue's base."""

    def __init__(self, queues: QueueMachine) -> None:
        self.queues = queues  # the per-queue machine

    def route(self, ctx: Ctx, cmd: Enqueue) -> Reply:
        """Store a publish to base name `cmd.queue` in the partition its key or the cursor picks."""
        base = cmd.queue
        routing = ctx.state.routing[base]
        annotated = type(cmd) is AnnotatedEnqueue
        annotations: Annotations = cmd.annotations if annotated else ()  # type: ignore[attr-defined]
        err = v.annotations_error(annotations) if annotated else None
        if err is None and (type(cmd.body) is not bytes or len(cmd.body) > limits.body_bytes_max):
            err = f"body must be bytes of at most {limits.body_bytes_max}"
        ttl = cmd.ttl_ms
        if err is None and ttl is not None and not v.int_in(ttl, 0, limits.ttl_ms_max):
            err = "ttl_ms out of range"
        if err:
            return invalid(err)
        tracked = cmd.enqueuer is not None or cmd.seq is not None
        if tracked:
            early = self.dedup(routing, cmd)
            if early is not None:
                return early
        key = partition_key(annotations)
        count = ctx.state.partitioned[base]
        index = routing.cursor if key is None else partition_index(key, count)
        queue = ctx.state.queues.get(f"{base}.{index}")
        if queue is None:  # partitions are created and deleted with their base only
            return Error("unknown_queue", f"partition {base}.{index} of {base!r} is missing")
        if annotated:
            routed: Enqueue = AnnotatedEnqueue(
                queue.name, cmd.body, ttl_ms=ttl, annotations=annotations
            )
        else:
            routed = Enqueue(queue.name, cmd.body, ttl_ms=ttl)
        reply: Reply = self.queues.handlers[type(cmd)](ctx, queue, routed)
        if reply.__class__ is Error:
            return reply
        if key is None:
            routing.cursor = next_cursor(index, count)
        if tracked:
            assert cmd.enqueuer is not None
            self.enqueuer(ctx, routing, cmd.enqueuer, cmd.connection).next_seq += 1
        return reply

    def dedup(self, routing: Routing, cmd: Enqueue) -> Reply | None:
        """None when `cmd` is the publisher's next message (to be stored); else the reply: Ok for
        a duplicate, NotEnqueued for a gap, an Error for bad input or a full enqueuer table."""
        err = v.name_error(cmd.enqueuer, "enqueuer", limits.enqueuer_name_bytes_max)
        if err is None and not v.int_in(cmd.seq, 1, limits.seq_max):
            err = "seq must be an int >= 1 when enqueuer is set"
        if err is None and cmd.connection is not None:
            err = v.connection_error(cmd.connection)
        if err:
            return invalid(err)
        assert cmd.enqueuer is not None and cmd.seq is not None
        enqueuer = routing.enqueuers.get(cmd.enqueuer)
        expected = 1 if enqueuer is None else enqueuer.next_seq
        if cmd.seq != expected:
            if enqueuer is not None and cmd.connection is not None:
                _bind(enqueuer, cmd.connection)
            return OK if cmd.seq < expected else NotEnqueued(expected)
        if enqueuer is None and not _room(routing):
            return Error("unsupported", "enqueuers_per_queue_max reached")
        return None

    def enqueuer(
        self, ctx: Ctx, routing: Routing, name: str, connection: ConnectionId | None
    ) -> Enqueuer:
        """The named enqueuer (created, evicting the earliest-down one at the cap), bound to
        `connection` if given. Callers checked `_room` first."""
        enqueuer = routing.enqueuers.get(name)
        if enqueuer is None:
            if len(routing.enqueuers) >= limits.enqueuers_per_queue_max:
                down = [e for e in routing.enqueuers.values() if e.status == "down"]
                victim = min(down, key=lambda e: (e.down_index, e.name))
                del routing.enqueuers[victim.name]
            enqueuer = routing.enqueuers[name] = Enqueuer(name, connection)
        elif connection is not None:
            _bind(enqueuer, connection)
        return enqueuer

    def register_routed(self, ctx: Ctx, cmd: RegisterEnqueuer) -> Reply:
        """RegisterEnqueuer on a base name: the publisher is known to the whole partitioned
        queue (never RejectPublish: the partitions' limits are their own)."""
        err = v.name_error(cmd.enqueuer, "enqueuer", limits.enqueuer_name_bytes_max)
        err = err or v.connection_error(cmd.connection)
        if err:
            return invalid(err)
        routing = ctx.state.routing[cmd.queue]
        if cmd.enqueuer not in routing.enqueuers and not _room(routing):
            return Error("unsupported", "enqueuers_per_queue_max reached")
        self.enqueuer(ctx, routing, cmd.enqueuer, cmd.connection)
        return OK

    def routed_enqueuers_status(
        self, ctx: Ctx, match: Callable[[ConnectionId], bool], status: str
    ) -> None:
        """A connection or node went down: the base-name publishers on it are `status`."""
        for name in sorted(ctx.state.routing):
            for enqueuer in ctx.state.routing[name].enqueuers.values():
                if (
                    enqueuer.connection is not None
                    and match(enqueuer.connection)
                    and enqueuer.status != "down"
                ):
                    enqueuer.status = status
                    if status == "down":
                        enqueuer.down_index = ctx.index

    def routed_enqueuers_up(self, ctx: Ctx, node: str) -> None:
        """A lost node is back: its suspected base-name publishers are up again."""
        for name in sorted(ctx.state.routing):
            for enqueuer in ctx.state.routing[name].enqueuers.values():
                if enqueuer.status == "suspected" and enqueuer.connection is not None \
                        and enqueuer.connection.node == node:  # fmt: skip
                    enqueuer.status = "up"


def _room(routing: Routing) -> bool:
    """Whether a new enqueuer fits (at the cap, a down one can be evicted)."""
    if len(routing.enqueuers) < limits.enqueuers_per_queue_max:
        return True
    return any(e.status == "down" for e in routing.enqueuers.values())


def _bind(enqueuer: Enqueuer, connection: ConnectionId) -> None:
    enqueuer.connection = connection
    enqueuer.status = "up"
