"""Machine v4 (copied from v3): partitioned queues and consumer groups, registry level.

A partitioned queue `name` is `partitions` single-active-consumer queues `name.0` ..; the
registry remembers it in `state.partitioned`. A consumer group (`state.consumer_groups`) spreads
the partitions of one partitioned queue over its members with `fifo.v4.consumer_groups` (the
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
fenced. Plain checkouts on a partition queue are refused (`fifo.v4.machine`): the group decides
who consumes it. Publishes to the base name are routed (`fifo.v4.routing`), and so are messages
dead-lettered into it (`fifo.v4.flow`).
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
from fifo.effects import GroupAssigned, GroupRevoked
from fifo.replies import CheckoutOk, DeclareOk, Error, JoinGroupOk, Reply
from fifo.shared import OK, Ctx, invalid
from fifo.state import Consumer, ConsumerGroup, Membership, Queue, Routing
from fifo.v4 import consumer_groups as cg
from fifo.v4.machine import QueueMachine
from fifo.v4.routing import partition_name, partitioned_of

PARTITION_SUFFIX_BYTES_MAX = 4  # ".255"


class ConsumerGroups:
    """Registry-level handlers of partitioned queues and consumer groups."""

    def __init__(self, queues: QueueMachine) -> None:
        self.queues = queues  # the per-queue machine

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
            state.queues[name] = Queue.lined(name, cmd.config, ctx.now)
        state.partitioned[cmd.queue] = cmd.partitions
        state.routing[cmd.queue] = Routing()
        return DeclareOk(True)

    # --- membership --------------------------------------------------------------------------

    def join_group(self, ctx: Ctx, cmd: JoinGroup) -> Reply:
        """Add a member to a group (created by its first join) and rebalance."""
        err = v.name_error(cmd.group, "group", limits.group_name_bytes_max)
        err = err or v.name_error(cmd.member, "member", limits.group_name_bytes_max)
        err = err or v.consumer_id_error(cmd.consumer) or _member_spec_error(cmd.spec)
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
                member: membership
                for member, membership in group.members.items()
                if membership.connection is not None and ended(membership.connection)
            }
            if gone:
                actions = cg.leave_all(group, list(gone), ctx.index)
                self.carry_out(ctx, group, actions, gone)

    def groups_consumer_timeouts(self, ctx: Ctx, name: object) -> None:
        """After consumer timeouts on partition `name`: the members timed out there end, like
        any consumer that stopped settling (their other messages come back too)."""
        base = partitioned_of(ctx.state, name) if type(name) is str else None
        queue = ctx.state.queues.get(name) if type(name) is str and base is not None else None
        if queue is None:
            return
        for group_name in sorted(ctx.state.consumer_groups):
            group = ctx.state.consumer_groups[group_name]
            if group.queue != base:
                continue
            for member, membership in list(group.members.items()):
                consumer = _consumer_of(queue, membership)
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
            queue = ctx.state.queues.get(action.partition)
            if type(action) is cg.Grant:
                if queue is not None:
                    self.grant(ctx, group, queue, action)
            elif queue is None:
                todo += cg.released(group, action.partition)
            else:
                assert type(action) is cg.Revoke
                todo += self.revoke(ctx, group, queue, action, gone)

    def grant(self, ctx: Ctx, group: ConsumerGroup, queue: Queue, action: cg.Grant) -> None:
        """Check the member's consumer out on the partition and tell the member."""
        member = group.members[action.member]
        assert member.connection is not None and member.spec is not None
        consumer = ConsumerId(member.tag, member.connection)
        reply = self.queues.consume(ctx, queue, Checkout(queue.name, consumer, member.spec))
        assert type(reply) is CheckoutOk, reply
        ctx.effects.append(GroupAssigned(member.connection, queue.name, member.tag,
                                         reply.consumer_key, True, "single_active", group.name,
                                         action.member,
                                         member.epoch))  # fmt: skip

    def revoke(
        self,
        ctx: Ctx,
        group: ConsumerGroup,
        queue: Queue,
        action: cg.Revoke,
        gone: dict[str, Membership],
    ) -> list[cg.Action]:
        """Stop the member's consumer on the partition; release it now unless it holds
        messages (a live member settles them first; a departed one's come back)."""
        member = group.members.get(action.member) or gone.get(action.member)
        consumer = _consumer_of(queue, member) if member is not None else None
        if consumer is None or member is None or member.connection is None:
            return cg.released(group, queue.name)
        revoked = GroupRevoked(member.connection, queue.name, member.tag, consumer.key, False,
                               "waiting", group.name, action.member, member.epoch)  # fmt: skip
        ctx.effects.append(revoked)
        queues = self.queues
        live = action.member in group.members
        if live and consumer.checked_out:
            queues.service_remove(queue, consumer)
            consumer.status, consumer.once, consumer.credit = "cancelled", True, 0
            queue.last_active = ctx.now
            queues.after_change(ctx, queue)
            return []  # released by `settle_groups` once it holds nothing
        queues.end_consumer(ctx, queue, consumer)
        return cg.released(group, queue.name)

    def settle_groups(self, ctx: Ctx) -> None:
        """After a command: a revoked holder that left its partition queue (its last message
        settled or returned) releases the partition to its new member."""
        for name in sorted(ctx.state.consumer_groups):
            group = ctx.state.consumer_groups[name]
            for partition, holder in list(group.revoking.items()):
                queue = ctx.state.queues.get(partition)
                member = group.members.get(holder)
                if queue is None or member is None or _consumer_of(queue, member) is None:
                    self.carry_out(ctx, group, cg.released(group, partition), {})


def _consumer_of(queue: Queue, member: Membership) -> Consumer | None:
    """The member's consumer on a partition queue (active, cancelled or waiting)."""
    if member.connection is None:
        return None
    key = queue.key_by_id.get(ConsumerId(member.tag, member.connection))
    if key is None:
        return None
    consumer = queue.consumers.get(key)
    if consumer is not None:
        return consumer
    for waiting in queue.waiting:
        if waiting.key == key:
            return waiting
    return None


def _member_spec_error(spec: object) -> str | None:
    if type(spec) is SimplePrefetch:
        if not v.int_in(spec.prefetch, 1, limits.prefetch_max):
            return f"prefetch must be 1..{limits.prefetch_max}"
        return None
    if type(spec) is Credited:
        if not v.int_in(spec.initial_delivery_count, 0, limits.serial_modulus - 1):
            return "initial_delivery_count must be a 32-bit serial number"
        return None
    return "spec must be SimplePrefetch or Credited"
