"""Draw the next command from the fuzzer's world, like rabbit_fifo_prop_SUITE's weighted log_gen.

Settles, returns, discards and modifies name message ids that the machine really delivered
(the world learns them from Deliver effects), as the suite's `expand/2` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast

from fifo.commands import (
    BOUND_SETTLES,
    BOUND_SETTLES_SINCE_VERSION,
    CONSUMER_TIMEOUT_MS_DEFAULT,
    DISCONNECTED_TIMEOUT_MS_DEFAULT,
    EXCHANGES_SINCE_VERSION,
    AnnotatedEnqueue,
    Cancel,
    Checkout,
    CheckoutSpec,
    Command,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    Credit,
    Credited,
    DeclareGroupedQueue,
    DeclarePartitionedQueue,
    DeclareQueue,
    DeleteQueue,
    Dequeue,
    Discard,
    Enqueue,
    EvalConsumerTimeouts,
    GroupConfig,
    JoinGroup,
    LeaveGroup,
    Modify,
    NodeDown,
    NodeUp,
    Purge,
    PurgeGroup,
    QueueConfig,
    RegisterEnqueuer,
    Remove,
    RenewLocks,
    Return,
    Settle,
    SimplePrefetch,
    UpdateConfig,
)
from fifo.fuzz.exchanges import ExchangeDraws
from fifo.fuzz.prng import SplitMix64
from fifo.fuzz.world import (
    DEAD_LETTER_QUEUE,
    NODES,
    SERIAL_MASK,
    WORK_QUEUES,
    EnqueuerSlot,
    Pending,
    World,
)

BODY_PAD = b"." * 16
PARTITIONED_QUEUE = "parts"  # v3: the partitioned queue of the consumer groups
CONSUMER_GROUPS = ("ga", "gb")
GROUP_IDS = ("g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7")


def body_for(queue: str, number: int) -> bytes:
    """A unique body that records its queue and enqueue number (for the order invariant)."""
    return b"%s|%09d|%s" % (queue.encode(), number, BODY_PAD)


def body_number(body: bytes) -> int | None:
    """The enqueue number written by `body_for`, or None for a foreign body."""
    parts = body.split(b"|")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def random_config(rng: SplitMix64, world: World, queue: str) -> QueueConfig:
    """A queue config exercising SAC, limits, TTL and dead-lettering (v2 adds timeouts)."""
    # mostly the plain dlx queue; sometimes another work queue, which makes dead-letter cycles
    targets = [q for q in (DEAD_LETTER_QUEUE, *WORK_QUEUES) if q != queue]
    if world.version >= 3:
        targets.append(PARTITIONED_QUEUE)  # v3: dead-lettered messages are routed to a partition
    dead_letter = None
    if rng.chance(1, 2):
        dead_letter = (
            DEAD_LETTER_QUEUE
            if rng.chance(2, 3) and queue != DEAD_LETTER_QUEUE
            else (rng.choice(targets))
        )
    v2 = world.version >= 2
    return QueueConfig(
        single_active_consumer=rng.chance(1, 3),
        delivery_limit=None if rng.chance(1, 2) else rng.between(0, 4),
        max_length=None if rng.chance(2, 3) else rng.between(2, 15),
        max_bytes=None if rng.chance(5, 6) else rng.between(200, 2000),
        overflow="drop_head" if rng.chance(2, 3) else "reject_publish",
        message_ttl_ms=None if rng.chance(2, 3) else rng.between(0, 3000),
        dead_letter_queue=dead_letter,
        consumer_timeout_ms=rng.between(100, 5000)
        if v2 and rng.chance(1, 2)
        else CONSUMER_TIMEOUT_MS_DEFAULT,
        disconnected_timeout_ms=rng.between(100, 5000)
        if v2 and rng.chance(1, 2)
        else DISCONNECTED_TIMEOUT_MS_DEFAULT,
    )


def random_groups(rng: SplitMix64) -> GroupConfig:
    """A v3 group config: either policy, the default or another group key, maybe rebalancing."""
    exclusive = rng.chance(1, 2)
    key = "x-group-id" if rng.chance(3, 4) else "customer"
    return GroupConfig(key, "exclusive" if exclusive else "sequenced",
                       exclusive and rng.chance(1, 2))  # fmt: skip


class Generator:
    """Produces commands for one world; every choice comes from the seeded PRNG."""

    def __init__(self, rng: SplitMix64, world: World) -> None:
        self.rng = rng
        self.world = world
        # A per-seed flavour scales some weights, so seeds differ in what they stress
        # (churn of consumers, connection faults, config changes) rather than all being average.
        self.consumer_churn = rng.between(1, 4)
        self.faults = rng.between(1, 4)
        self.reconfig = rng.between(1, 3)
        self.exchanges = ExchangeDraws(rng, world, body_for)  # v4

    def next_command(self) -> tuple[Command, bool]:
        """The next command, and whether it is deliberately bad input (expects an Error)."""
        world = self.world
        if not world.queues or (DEAD_LETTER_QUEUE not in world.queues and self.rng.chance(1, 4)):
            return self.declare(), False
        table: list[tuple[int, Callable[[], Command]]] = [
            (20, self.enqueue),
            (40 if world.pending else 0, self.outcome),
            (1 + 2 * self.consumer_churn, self.checkout),
            (4 if any(s.credited for s in world.consumers.values()) else 0, self.credit),
            (self.consumer_churn if world.consumers else 0, self.cancel_or_remove),
            (1, self.dequeue),
            (self.faults, self.connection_down),
            (self.faults, self.node_down_or_up),
            (1, self.purge),
            (self.reconfig, self.update_config),
            (1, self.declare),
            (1, self.delete),
            (1, self.register_enqueuer),
            # v3 consumer groups (weight 0 before v3: earlier versions draw exactly as before)
            (2 if world.version >= 3 else 0, self.partitioned),
            (3 if world.version >= 3 and world.partitioned else 0, self.join_group),
            (2 if world.version >= 3 and world.members else 0, self.leave_group),
            # v4 exchanges (weight 0 before v4, as above)
            (10 if world.version >= EXCHANGES_SINCE_VERSION else 0, self.exchanges.draw),
        ]
        if self.rng.chance(1, 60):
            return self.bad_input(), True
        return self.rng.weighted(table)(), False

    # --- helpers ---------------------------------------------------------------------------

    def queue(self) -> str:
        """An existing queue."""
        return self.rng.choice(list(self.world.queues))

    def connection(self) -> ConnectionId:
        """A live connection, sometimes a new one on a random node."""
        world = self.world
        if not world.connections or self.rng.chance(1, 10):
            return world.new_connection(self.rng.choice(NODES))
        return self.rng.choice(world.connections)

    def key_for(self, pending_or_cid: Pending | ConsumerId) -> ConsumerKey:
        """The key a client would use: the compact key (v2, mostly) or the consumer id."""
        cid = pending_or_cid.cid if isinstance(pending_or_cid, Pending) else pending_or_cid
        slot = self.world.consumers.get(cid)
        if slot is not None and slot.key is not None and self.rng.chance(3, 4):
            return slot.key
        return cid

    # --- commands --------------------------------------------------------------------------

    def declare(self) -> Command:
        """Declare a missing queue, or re-declare one (same or different config)."""
        world = self.world
        missing = [q for q in (DEAD_LETTER_QUEUE, *WORK_QUEUES) if q not in world.queues]
        if missing and (not world.queues or not self.rng.chance(1, 8)):
            queue = missing[0]
            config = random_config(self.rng, world, queue)
            if world.version >= 3 and self.rng.chance(2, 3):
                return DeclareGroupedQueue(queue, config, random_groups(self.rng))
            return DeclareQueue(queue, config)
        queue = self.queue()
        same = self.rng.chance(1, 2)
        config = world.queues[queue] if same else random_config(self.rng, world, queue)
        groups = world.groups.get(queue)
        if groups is not None:
            return DeclareGroupedQueue(queue, config, groups)
        return DeclareQueue(queue, config)

    def delete(self) -> Command:
        """Now and then delete a work queue (never the dead-letter queue; v3: sometimes the
        partitioned queue as a whole, a partition alone is refused); else purge."""
        queues = [q for q in self.world.queues if q != DEAD_LETTER_QUEUE]
        if not queues or not self.rng.chance(1, 4):
            return self.purge()
        if self.world.partitioned and self.rng.chance(1, 3):
            return DeleteQueue(self.rng.choice(list(self.world.partitioned)))
        return DeleteQueue(self.rng.choice(queues))

    def purge(self) -> Command:
        """Purge a queue (v3: or one group of a grouped queue)."""
        queue = self.queue()
        if queue in self.world.groups and self.rng.chance(1, 2):
            return PurgeGroup(queue, None if self.rng.chance(1, 5) else self.rng.choice(GROUP_IDS))
        return Purge(queue)

    def update_config(self) -> Command:
        """Replace a queue's config with a random one."""
        queue = self.queue()
        return UpdateConfig(queue, random_config(self.rng, self.world, queue))

    def enqueue(self) -> Command:
        """Publish, mostly through a deduplicating enqueuer (in order, resent, or with a gap);
        v3: sometimes to the partitioned queue's base name (routed by key or round robin)."""
        world = self.world
        routed = world.version >= 3 and bool(world.partitioned) and self.rng.chance(1, 3)
        queue = self.rng.choice(list(world.partitioned)) if routed else self.queue()
        body = body_for(queue, self.world.fresh())
        ttl = self.rng.between(0, 2000) if self.rng.chance(1, 8) else None
        anns = self.annotations(queue) if self.world.version >= 3 else None
        if self.rng.chance(1, 3):
            if anns is not None:
                return AnnotatedEnqueue(queue, body, ttl_ms=ttl, annotations=anns)
            return Enqueue(queue, body, ttl_ms=ttl)
        slot = self.enqueuer(queue)
        seq = slot.next_seq
        if self.rng.chance(1, 20) and seq > 1:
            seq -= 1  # a resend after a lost confirm: a duplicate
        elif self.rng.chance(1, 40):
            seq += 2  # a gap: refused with NotEnqueued
        if anns is not None:
            return AnnotatedEnqueue(queue, body, slot.name, seq, slot.connection, ttl, anns)
        return Enqueue(queue, body, slot.name, seq, slot.connection, ttl)

    def annotations(self, queue: str) -> tuple[tuple[str, str | int], ...] | None:
        """v3: a group annotation (sometimes none: the default group; sometimes an int id or
        another key), or None for a plain Enqueue."""
        rng = self.rng
        groups = self.world.groups.get(queue)
        if rng.chance(1, 6):
            return None
        key = groups.group_key if groups is not None and rng.chance(7, 8) else "x-group-id"
        if rng.chance(1, 10):
            return (("x-note", rng.below(9)),)
        gid: str | int = rng.choice(GROUP_IDS)
        if rng.chance(1, 12):
            gid = rng.below(3)
        return ((key, gid),)

    def enqueuer(self, queue: str) -> EnqueuerSlot:
        """An enqueuer of the queue, sometimes a new one."""
        mine = [e for e in self.world.enqueuers.values() if e.queue == queue]
        if mine and not self.rng.chance(1, 20):
            return self.rng.choice(mine)
        slot = EnqueuerSlot(queue, f"e{self.world.fresh()}", self.connection())
        self.world.enqueuers[slot.name] = slot
        return slot

    def register_enqueuer(self) -> Command:
        """Register an enqueuer (answered RejectPublish while over a reject_publish limit); v3:
        sometimes with the partitioned queue as a whole."""
        world = self.world
        routed = world.version >= 3 and bool(world.partitioned) and self.rng.chance(1, 4)
        slot = self.enqueuer(self.rng.choice(list(world.partitioned)) if routed else self.queue())
        return RegisterEnqueuer(slot.queue, slot.name, slot.connection)

    def checkout(self) -> Command:
        """Attach a consumer, or update one: prefetch or credited, priority, timeout (v2)."""
        rng, world = self.rng, self.world
        queue = self.queue()
        existing = world.slots_of(queue)
        if existing and rng.chance(1, 3):
            cid = rng.choice(existing).cid
        else:
            cid = ConsumerId(f"c{world.fresh()}", self.connection())
        spec: CheckoutSpec
        if rng.chance(2, 3):
            spec = SimplePrefetch(rng.between(1, 10))
        else:
            spec = Credited(rng.choice((0, 7, SERIAL_MASK - 2)))
        timeout = rng.between(100, 4000) if world.version >= 2 and rng.chance(1, 4) else None
        return Checkout(queue, cid, spec, rng.between(0, 2), timeout)

    def dequeue(self) -> Command:
        """basic.get, settled or not."""
        cid = ConsumerId(f"d{self.world.fresh()}", self.connection())
        return Checkout(self.queue(), cid, Dequeue(self.rng.chance(1, 2)))

    def cancel_or_remove(self) -> Command:
        """Cancel a consumer (v2: or remove it)."""
        slot = self.rng.choice(list(self.world.consumers.values()))
        remove = self.world.version >= 2 and self.rng.chance(1, 2)
        return Checkout(slot.queue, slot.cid, Remove() if remove else Cancel())

    def credit(self) -> Command:
        """Grant link credit to a credited consumer, sometimes from a stale delivery count."""
        slot = self.rng.choice([s for s in self.world.consumers.values() if s.credited])
        count = slot.delivery_count
        if self.rng.chance(1, 10):
            count = (count - self.rng.between(1, 3)) & SERIAL_MASK  # a stale receiver view
        return Credit(
            slot.queue,
            self.key_for(slot.cid),
            self.rng.between(0, 10),
            count,
            drain=self.rng.chance(1, 5),
        )

    def outcome(self) -> Command:
        """Answer pending deliveries: settle, return, discard, modify (v2) or renew (v2). v4:
        often bound to the consumer's own connection, sometimes to another connection (an
        attack the machine refuses: the messages stay pending). Before v4 nothing more is
        drawn, so earlier versions draw exactly as before."""
        command, batch = self.answer()
        if self.world.version < BOUND_SETTLES_SINCE_VERSION or self.rng.chance(1, 3):
            return command
        connection = owner = batch[0].cid.connection
        if self.rng.chance(1, 5):
            connection = ConnectionId(owner.node, owner.incarnation, owner.number + 1)
            if type(command) is not RenewLocks:  # (a renew left them pending already)
                self.world.pending.extend(batch)
        values = [getattr(command, name) for name in command.__dataclass_fields__]
        return cast(Command, BOUND_SETTLES[type(command)](*values, connection))

    def answer(self) -> tuple[Command, list[Pending]]:
        """An unbound answer to pending deliveries, and the deliveries it names."""
        rng, world = self.rng, self.world
        index = 0 if rng.chance(9, 10) else rng.below(len(world.pending))
        first = world.pending.pop(index)
        batch = [first]
        for other in list(world.pending):
            if len(batch) < 4 and other.cid == first.cid and rng.chance(1, 3):
                world.pending.remove(other)
                batch.append(other)
        ids = tuple(p.msg_id for p in batch)
        key = self.key_for(first)
        v2 = world.version >= 2
        kind = rng.weighted(
            [
                (10, "settle"),
                (2, "return"),
                (2, "discard"),
                (1 if v2 else 0, "modify"),
                (1 if v2 else 0, "renew"),
            ]
        )
        if kind == "settle":
            return Settle(first.queue, key, ids), batch
        if kind == "return":
            return Return(first.queue, key, ids), batch
        if kind == "discard":
            return Discard(first.queue, key, ids), batch
        if kind == "renew":
            world.pending.extend(batch)  # still held after a renew
            return RenewLocks(first.queue, key, ids), batch
        failed, here = rng.chance(1, 2), rng.chance(1, 4)
        return Modify(first.queue, key, ids, failed, here, (("x-note", rng.below(100)),)), batch

    def partitioned(self) -> Command:
        """v3: declare the partitioned queue (or re-declare it, sometimes differently)."""
        rng = self.rng
        have = self.world.partitioned.get(PARTITIONED_QUEUE)
        count = have if have is not None and rng.chance(2, 3) else rng.between(1, 5)
        return DeclarePartitionedQueue(
            PARTITIONED_QUEUE, QueueConfig(single_active_consumer=True), count
        )

    def join_group(self) -> Command:
        """v3: a new member joins one of two consumer groups (sometimes an existing member
        again: a retried join or a clash)."""
        rng, world = self.rng, self.world
        queue = rng.choice(list(world.partitioned))
        group = rng.choice(CONSUMER_GROUPS)
        if world.members and rng.chance(1, 6):
            slot = rng.choice(world.members)
            return JoinGroup(slot.queue, slot.cid, SimplePrefetch(2), group=slot.group,
                             member=slot.member)  # fmt: skip
        cid = ConsumerId(f"m{world.fresh()}", self.connection())
        spec: CheckoutSpec = SimplePrefetch(rng.between(1, 4))
        if rng.chance(1, 4):
            spec = Credited(0)
        return JoinGroup(queue, cid, spec, group=group, member=cid.tag)

    def leave_group(self) -> Command:
        """v3: a member leaves (sometimes naming a stale epoch: fenced)."""
        slot = self.rng.choice(self.world.members)
        epoch = slot.epoch if self.rng.chance(4, 5) else slot.epoch - 1
        return LeaveGroup(slot.queue, slot.cid, Cancel(), group=slot.group, member=slot.member,
                          epoch=epoch)  # fmt: skip

    def connection_down(self) -> Command:
        """Close a connection or lose it (noconnection)."""
        conn = self.connection()
        return ConnectionDown(conn, "normal" if self.rng.chance(1, 2) else "noconnection")

    def node_down_or_up(self) -> Command:
        """Lose a node, or bring a lost one back."""
        down = self.world.nodes_down
        if down and self.rng.chance(2, 3):
            return NodeUp(self.rng.choice(down))
        return NodeDown(self.rng.choice(NODES))

    def bad_input(self) -> Command:
        """A command the machine must refuse with an Error and no state change."""
        rng, world = self.rng, self.world
        queue = self.queue()
        conn = self.connection()
        ghost = ConsumerId("ghost", conn)
        choices: list[Command] = [
            Enqueue("no-such-queue", b"x"),
            Settle(queue, ghost, (1,)),
            Return(queue, 10**9, (0,)),
            Checkout(queue, ConsumerId("bad", conn), SimplePrefetch(-1)),
            Credit("no-such-queue", ghost, 1, 0),
            Purge("no-such-queue"),
            UpdateConfig(queue, QueueConfig(max_length=-1)),
            EvalConsumerTimeouts("no-such-queue", (ghost,)),
            Enqueue(queue, b"x", ttl_ms=-5),
            cast(Command, Enqueue(queue, cast(bytes, "not-bytes"))),
            cast(Command, ("enqueue", queue, b"tuple")),
            cast(Command, None),
            cast(Command, NodeDown(cast(str, 5))),
            cast(Command, ConnectionDown(conn, cast(Literal["normal"], "weird"))),
            cast(Command, DeclareQueue("q-bad", cast(QueueConfig, None))),
        ]
        choices += self.deep_bad_input()
        if world.version >= 3:
            choices += self.v3_bad_input(queue, conn, ghost)
        if world.version < 2:
            choices += [
                Checkout(queue, ConsumerId("rm", conn), Remove()),
                Modify(queue, ghost, (0,), True, False),
                RenewLocks(queue, ghost, (0,)),
            ]
        if world.version >= EXCHANGES_SINCE_VERSION:
            choices += self.exchanges.bad_input(queue)
        return rng.choice(choices)

    def v3_bad_input(self, queue: str, conn: ConnectionId, ghost: ConsumerId) -> list[Command]:
        """Bad input for v3's groups, consumer groups and partitioned queues."""
        choices: list[Command] = [
            AnnotatedEnqueue(queue, b"x", annotations=cast(Any, (("k",),))),
            AnnotatedEnqueue(queue, b"x", annotations=(("", "g"),)),
            PurgeGroup(queue, cast(str, 5)),
            DeclareGroupedQueue("q-bad", QueueConfig(), GroupConfig("k", "sequenced", True)),
            DeclareGroupedQueue(
                "q-bad",
                QueueConfig(),
                GroupConfig(
                    "",
                ),
            ),
            DeclareGroupedQueue("q-bad", QueueConfig(), cast(GroupConfig, None)),
            DeclarePartitionedQueue("p-bad", QueueConfig(single_active_consumer=True), 0),
            DeclarePartitionedQueue("p-bad", QueueConfig(), 2),
            JoinGroup(
                "no-such-queue", ConsumerId("j", conn), SimplePrefetch(1), group="g", member="j"
            ),
            JoinGroup(queue, ConsumerId("j", conn), SimplePrefetch(0), group="g", member="j"),
            JoinGroup(queue, ConsumerId("j", conn), SimplePrefetch(1), group="", member="j"),
            LeaveGroup(queue, ghost, Cancel(), group="no-such-group", member="j", epoch=1),
        ]
        for base in self.world.partitioned:
            choices += [
                Enqueue(base, b"x", "e-bad", 0),
                AnnotatedEnqueue(base, b"x", annotations=(("x-group-id", cast(Any, 1.5)),)),
                Checkout(base, ConsumerId("b", conn), SimplePrefetch(1)),
                Purge(base),
                DeleteQueue(f"{base}.0"),
                DeclareQueue(base),
            ]
        return choices

    def deep_bad_input(self) -> list[Command]:
        """Bad input aimed at a real consumer and real ids, so it gets past the first lookups.

        A handler that mutates some ids before it trips over a bad one would return an Error
        with the state changed; the runner checks the digest on every bad-input step.
        """
        if not self.world.pending:
            return []
        held = self.rng.choice(self.world.pending)
        key = self.key_for(held)
        good, q = held.msg_id, held.queue
        bad_ids = cast(tuple[int, ...], (good, "x"))
        return [
            cast(Command, Settle(q, key, bad_ids)),
            cast(Command, Return(q, key, bad_ids)),
            cast(Command, Discard(q, key, (good, -1))),
            cast(Command, Settle(q, key, cast(tuple[int, ...], [good]))),
            cast(Command, Modify(q, key, (good,), True, False, cast(Any, (("k",),)))),
            cast(Command, Credit(q, key, cast(int, "1"), 0)),
            cast(Command, Credit(q, key, -1, 0)),
            cast(Command, RenewLocks(q, key, bad_ids)),
            cast(Command, Checkout(q, held.cid, cast(Any, None))),
            cast(Command, Checkout(q, held.cid, SimplePrefetch(5), priority=cast(int, None))),
            cast(Command, EvalConsumerTimeouts(q, cast(Any, (key, [1])))),
        ]
