"""Machine v3: partitioned queues and consumer groups (issue 10).

A partitioned queue `name` is `partitions` single-active-consumer queues `name.0` ..; the
registry remembers it in `state.partitioned`. A consumer group (`state.consumer_groups`) spreads
the partitions of one partitioned queue over its members with `fifo.v3.consumer_groups` (the
sticky target; revoke, then release, then grant). The machine carries the actions out on the
partition queues:

- grant: the member's consumer (its JoinGroup's tag and connection, prefetch or credit) checks
  out on the partition, and `GroupAssigned` tells the member;
- revoke: `GroupRevoked` tells the member, and its consumer there gets nothing new at once
  (cancelled); it leaves the queue when its checked-out messages are settled or returned, and
  only then (checked after every command) is the partition released and granted to its new
  member, so per-partition order holds across a rebalance;
- a member that leaves, whose connection or node goes down, or that times out on a partition
  (stops settling: `EvalConsumerTimeouts`), has its messages returned at once: its partitions
  are released in the same command.

Settles from an ended member find no consumer (an error); a LeaveGroup naming another epoch is
fenced. Plain checkouts on a partition queue are refused: the group decides who consumes it.
Publishes to the base name are routed to a partition (`fifo.v3.routing`), and so are messages
dead-lettered into it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    Credited,
    DeclarePartitionedQueue,
    JoinGroup,
    LeaveGroup,
    NodeDown,
    SimplePrefetch,
)
from fifo.effects import DeadLettered, GroupAssigned, GroupRevoked
from fifo.replies import CheckoutOk, DeclareOk, Error, JoinGroupOk, Reply
from fifo.shared import DEATH_KEYS, OK, Ctx, invalid
from fifo.state import Consumer, ConsumerGroup, Membership, Message, Queue, Routing, State
from fifo.v2.machine import QueueMachineV2
from fifo.v3 import consumer_groups as cg
from fifo.v3 import routing as route

PARTITION_SUFFIX_BYTES_MAX = 4  # ".255"


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


class PartitionedQueue(QueueMachineV2):
    """Per-queue handlers: a partition queue takes no plain checkout; a dead-letter target that
    is a partitioned queue's base is routed; others are v2's."""

    def dead_letter(self, ctx: Ctx, q: Queue, msgs: list[Message], reason: Any) -> None:
        """As v2; when the target names a partitioned queue, each message goes to the partition
        a publish of it would (its partition key, else round robin: `fifo.v3.routing`), one
        DeadLettered effect per partition reached, in the order first reached."""
        name = q.config.dead_letter_queue
        state = ctx.state
        count = state.partitioned.get(name) if name is not None else None
        if not msgs or count is None or ctx.depth >= limits.dead_letter_hops_max:
            super().dead_letter(ctx, q, msgs, reason)
            return
        assert name is not None
        q.messages_total -= len(msgs)
        routing = state.routing[name]
        reached: dict[str, int] = {}
        for m in msgs:
            key = route.partition_key(m.annotations)
            index = routing.cursor if key is None else route.partition_index(key, count)
            if key is None:
                routing.cursor = route.next_cursor(index, count)
            target = state.queues[partition_name(name, index)]
            new = Message(m.body, self.expiry(ctx, target, None))
            new.delivery_count, new.acquired_count = m.delivery_count, m.acquired_count
            kept = tuple(a for a in m.annotations if a[0] not in DEATH_KEYS)
            anns = (*kept, ("x-death-reason", reason), ("x-death-queue", q.name))
            new.annotations = anns[-limits.annotations_per_message_max :]
            self.store(ctx, target, new)
            reached[target.name] = reached.get(target.name, 0) + 1
            if ctx.dirty is None:
                ctx.dirty = [target]
            elif not any(d is target for d in ctx.dirty):
                ctx.dirty.append(target)
        for target_name, n in reached.items():
            ctx.effects.append(DeadLettered(q.name, reason, n, target_name))

    def checkout(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """Refused on a partition queue (consumer groups check out there themselves)."""
        if ctx.state.partitioned and partitioned_of(ctx.state, q.name) is not None:
            return Error("unsupported", f"{q.name!r} is a partition: consume it through a "
                         "consumer group (JoinGroup)")  # fmt: skip
        return super().checkout(ctx, q, cmd)


class ConsumerGroups:
    """Registry-level handlers of partitioned queues and consumer groups (a MachineV3 base)."""

    qm: Any  # the per-queue machine (QueueMachineV3)

    def group_handlers(self) -> dict[type, Callable[[Ctx, Any], Reply]]:
        """The global handlers this feature adds."""
        return {
            DeclarePartitionedQueue: self.declare_partitioned,
            JoinGroup: self.join_group,
            LeaveGroup: self.leave_group,
        }

    # --- partitioned queues ------------------------------------------------------------------

    def declare_partitioned(self, ctx: Ctx, cmd: DeclarePartitionedQueue) -> Reply:
        """Create the partitions; an equal re-declare is a no-op, a different one an error."""
        bytes_max = limits.queue_name_bytes_max - PARTITION_SUFFIX_BYTES_MAX
        err = v.name_error(cmd.queue, "queue", bytes_max) or v.config_error(cmd.config, cmd.queue)
        if err:
            return invalid(err)
        if not v.int_in(cmd.partitions, 1, limits.partitions_max):
            return invalid(f"partitions must be 1..{limits.partitions_max}")
        if cmd.config.single_active_consumer is not True:
            return invalid("the partitions of a partitioned queue are single active consumer")
        state = ctx.state
        names = [partition_name(cmd.queue, i) for i in range(cmd.partitions)]
        if state.partitioned.get(cmd.queue) is not None:
            same = state.partitioned[cmd.queue] == cmd.partitions and all(
                name in state.queues and state.queues[name].config == cmd.config for name in names
            )
            if same:
                return DeclareOk(False)
            return Error("queue_exists", f"partitioned queue {cmd.queue!r} exists with another "
                         "config or partition count")  # fmt: skip
        if cmd.queue in state.queues or any(
                name in state.queues or name in state.partitioned for name in names):  # fmt: skip
            return Error("queue_exists", f"queue {cmd.queue!r} or one of its partitions exists")
        if len(state.queues) + cmd.partitions > limits.queues_max:
            return Error("unsupported", "queues_max reached")
        for name in names:
            state.queues[name] = Queue(name, cmd.config, ctx.now)
        state.partitioned[cmd.queue] = cmd.partitions
        state.routing[cmd.queue] = Routing()
        return DeclareOk(True)

    # --- membership --------------------------------------------------------------------------

    def join_group(self, ctx: Ctx, cmd: JoinGroup) -> Reply:
        """Add a member to a group (created by its first join) and rebalance."""
        err = v.name_error(cmd.group, "group", limits.group_name_bytes_max)
        err = err or v.name_error(cmd.member, "member", limits.group_name_bytes_max)
        err = err or v.consumer_id_error(cmd.consumer) or _spec_error(cmd.spec)
        if err:
            return invalid(err)
        state = ctx.state
        count = state.partitioned.get(cmd.queue) if type(cmd.queue) is str else None
        if count is None:
            return Error("unknown_queue", f"no partitioned queue {cmd.queue!r}")
        group = state.consumer_groups.get(cmd.group)
        if group is not None and group.queue != cmd.queue:
            return Error("group_exists", f"group {cmd.group!r} consumes {group.queue!r}")
        if group is None:
            for other in state.consumer_groups.values():
                if other.queue == cmd.queue:  # its partitions are that group's to hand out
                    return Error("group_exists", f"{cmd.queue!r} is consumed by group "
                                 f"{other.name!r}: one group per partitioned queue")  # fmt: skip
            if len(state.consumer_groups) >= limits.consumer_groups_max:
                return Error("unsupported", "consumer_groups_max reached")
            partitions = tuple(partition_name(cmd.queue, i) for i in range(count))
            group = state.consumer_groups[cmd.group] = ConsumerGroup(
                cmd.group, cmd.queue, partitions
            )
        known = group.members.get(cmd.member)
        if known is not None:
            if known.connection == cmd.consumer.connection and known.tag == cmd.consumer.tag:
                return JoinGroupOk(known.epoch, len(group.partitions))  # a retried join
            return Error("member_exists", f"{cmd.member!r} is already a member of {cmd.group!r}")
        if len(group.members) >= limits.group_members_max:
            return Error("unsupported", "group_members_max reached")
        consumer = cmd.consumer
        epoch, actions = cg.join(group, cmd.member, consumer.connection, cmd.spec,  # type: ignore[arg-type]
                                 ctx.index, consumer.tag)  # fmt: skip
        self.carry_out(ctx, group, actions, {})
        return JoinGroupOk(epoch, len(group.partitions))

    def leave_group(self, ctx: Ctx, cmd: LeaveGroup) -> Reply:
        """A member leaves: its messages come back at once; another epoch is fenced."""
        group = ctx.state.consumer_groups.get(cmd.group) if type(cmd.group) is str else None
        if group is None:
            return Error("unknown_group", f"no consumer group {cmd.group!r}")
        if type(cmd.member) is not str or type(cmd.epoch) is not int:
            return invalid("member must be a str and epoch an int")
        if group.is_stale(cmd.member, cmd.epoch):
            return Error("fenced", f"{cmd.member!r} epoch {cmd.epoch} is not a current member of "
                         f"{cmd.group!r}")  # fmt: skip
        self.end_member(ctx, group, cmd.member)
        return OK

    def end_member(self, ctx: Ctx, group: ConsumerGroup, member: str) -> None:
        """Leave, connection down, node down: the member goes, its partitions are released."""
        gone = {member: group.members[member]}
        self.carry_out(ctx, group, cg.leave(group, member, ctx.index), gone)

    def end_members_on(self, ctx: Ctx, ended: Callable[[ConnectionId], bool]) -> None:
        """End every member whose connection matches (one rebalance per group, by name)."""
        for name in sorted(ctx.state.consumer_groups):
            group = ctx.state.consumer_groups[name]
            gone = {
                member: x
                for member, x in group.members.items()
                if x.connection is not None and ended(x.connection)
            }
            if gone:
                actions = cg.leave_all(group, list(gone), ctx.index)
                self.carry_out(ctx, group, actions, gone)

    def groups_consumer_timeouts(self, ctx: Ctx, queue: str) -> None:
        """After consumer timeouts on a partition: the members timed out there end, like any
        consumer that stopped settling (their other messages come back too)."""
        base = partitioned_of(ctx.state, queue) if type(queue) is str else None
        q = ctx.state.queues.get(queue) if base is not None else None
        if q is None:
            return
        for name in sorted(ctx.state.consumer_groups):
            group = ctx.state.consumer_groups[name]
            if group.queue != base:
                continue
            for member, x in list(group.members.items()):
                consumer = _consumer_of(q, x)
                if consumer is not None and consumer.timed_out:
                    self.end_member(ctx, group, member)

    def groups_connection_down(self, ctx: Ctx, cmd: ConnectionDown) -> None:
        """After a valid ConnectionDown: its members end."""
        if ctx.state.consumer_groups:
            self.end_members_on(ctx, lambda connection: connection == cmd.connection)

    def groups_node_down(self, ctx: Ctx, cmd: NodeDown) -> None:
        """After a valid NodeDown: the members connected through that node end."""
        if ctx.state.consumer_groups:
            self.end_members_on(ctx, lambda connection: connection.node == cmd.node)

    # --- carrying the actions out ------------------------------------------------------------

    def carry_out(
        self, ctx: Ctx, group: ConsumerGroup, actions: list[cg.Action], gone: dict[str, Membership]
    ) -> None:
        """Grants and revokes on the partition queues, in order; releases chain into grants."""
        todo = list(actions)
        while todo:
            action = todo.pop(0)
            q = ctx.state.queues.get(action.partition)
            if type(action) is cg.Grant:
                if q is not None:
                    self.grant(ctx, group, q, action)
            elif q is None:
                todo += cg.released(group, action.partition)
            else:
                assert type(action) is cg.Revoke
                todo += self.revoke(ctx, group, q, action, gone)

    def grant(self, ctx: Ctx, group: ConsumerGroup, q: Queue, action: cg.Grant) -> None:
        """Check the member's consumer out on the partition and tell the member."""
        member = group.members[action.member]
        assert member.connection is not None and member.spec is not None
        consumer = ConsumerId(member.tag, member.connection)
        reply = self.qm.consume(ctx, q, Checkout(q.name, consumer, member.spec))
        assert type(reply) is CheckoutOk, reply
        ctx.effects.append(GroupAssigned(member.connection, q.name, member.tag, reply.consumer_key,
                                         True, "single_active", group.name, action.member,
                                         member.epoch))  # fmt: skip

    def revoke(
        self,
        ctx: Ctx,
        group: ConsumerGroup,
        q: Queue,
        action: cg.Revoke,
        gone: dict[str, Membership],
    ) -> list[cg.Action]:
        """Stop the member's consumer on the partition; release it now unless it holds
        messages (a live member settles them first; a departed one's come back)."""
        member = group.members.get(action.member) or gone.get(action.member)
        c = _consumer_of(q, member) if member is not None else None
        if c is None or member is None or member.connection is None:
            return cg.released(group, q.name)
        revoked = GroupRevoked(member.connection, q.name, member.tag, c.key, False, "waiting",
                               group.name, action.member, member.epoch)  # fmt: skip
        ctx.effects.append(revoked)
        qm = self.qm
        live = action.member in group.members
        if live and c.checked_out:
            qm.service_remove(q, c)
            c.status, c.once, c.credit = "cancelled", True, 0
            q.last_active = ctx.now
            qm.after_change(ctx, q)
            return []  # released by `settle_groups` once it holds nothing
        if c.checked_out:
            qm.return_all(ctx, q, c, delivery_failed=False)
        if q.consumers.get(c.key) is c:
            qm.drop_consumer(q, c)
        elif c in q.waiting:
            q.waiting.remove(c)
            q.key_by_id.pop(ConsumerId(c.tag, c.connection), None)
        q.last_active = ctx.now
        qm.after_change(ctx, q)
        return cg.released(group, q.name)

    def settle_groups(self, ctx: Ctx) -> None:
        """After a command: a revoked holder that left its partition queue (its last message
        settled or returned) releases the partition to its new member."""
        for name in sorted(ctx.state.consumer_groups):
            group = ctx.state.consumer_groups[name]
            for partition, holder in list(group.revoking.items()):
                q = ctx.state.queues.get(partition)
                member = group.members.get(holder)
                if q is None or member is None or _consumer_of(q, member) is None:
                    self.carry_out(ctx, group, cg.released(group, partition), {})


def _consumer_of(q: Queue, member: Membership) -> Consumer | None:
    """The member's consumer on a partition queue (active, cancelled or waiting)."""
    if member.connection is None:
        return None
    key = q.key_by_id.get(ConsumerId(member.tag, member.connection))
    if key is None:
        return None
    c = q.consumers.get(key)
    if c is not None:
        return c
    for w in q.waiting:
        if w.key == key:
            return w
    return None


def _spec_error(spec: object) -> str | None:
    if type(spec) is SimplePrefetch:
        if not v.int_in(spec.prefetch, 1, limits.prefetch_max):
            return f"prefetch must be 1..{limits.prefetch_max}"
        return None
    if type(spec) is Credited:
        if not v.int_in(spec.initial_delivery_count, 0, limits.serial_modulus - 1):
            return "initial_delivery_count must be a 32-bit serial number"
        return None
    return "spec must be SimplePrefetch or Credited"
