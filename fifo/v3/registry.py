"""Machine v3 as a whole: v2's registry plus grouped declares, v3's handlers and timers."""

from __future__ import annotations

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    AnnotatedEnqueue,
    Command,
    ConnectionDown,
    DeclareGroupedQueue,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    EvalConsumerTimeouts,
    GroupConfig,
    NodeDown,
    NodeUp,
    RegisterEnqueuer,
    UpdateConfig,
)
from fifo.effects import Effect
from fifo.meta import Meta
from fifo.replies import DeclareOk, DeleteOk, Error, Reply
from fifo.shared import Ctx, invalid
from fifo.state import Grouping, Queue, State
from fifo.v2.registry import MachineV2
from fifo.v3 import timers
from fifo.v3.machine import QueueMachineV3
from fifo.v3.partitioned import ConsumerGroups, partition_name, partitioned_of
from fifo.v3.routing import Router


def group_config_error(groups: object) -> str | None:
    """Check a GroupConfig."""
    if type(groups) is not GroupConfig:
        return "groups must be a GroupConfig"
    if err := v.name_error(groups.group_key, "group_key", limits.annotation_bytes_max):
        return err
    if not v.one_of(groups.policy, ("sequenced", "exclusive")):
        return "group policy must be sequenced or exclusive"
    if not v.is_bool(groups.rebalance_groups_on_join):
        return "rebalance_groups_on_join must be a bool"
    if groups.rebalance_groups_on_join and groups.policy != "exclusive":
        return "rebalance_groups_on_join needs the exclusive group policy"
    return None


class MachineV3(MachineV2, ConsumerGroups, Router):
    """Machine version 3: `apply(meta, command, state)`, `init()` and its timers."""

    version = 3

    def __init__(self) -> None:
        super().__init__()
        self.global_handlers[DeclareGroupedQueue] = self.declare
        self.global_handlers.update(self.group_handlers())

    def apply(self, meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        """As v2, but a per-queue command naming a partitioned queue's base goes to
        `apply_to_base` (a publish is routed to a partition); then consumer-group members timed
        out on a partition end, and partitions whose revoked holder left their queue during the
        command are handed to their new member (`ConsumerGroups.settle_groups`)."""
        name = getattr(command, "queue", None) if state.partitioned else None
        if type(name) is str and name in state.partitioned and type(command) in self.queue_handlers:
            reply, effects = self.apply_to_base(meta, command, name, state)
        else:
            reply, effects = super().apply(meta, command, state)
        groups = state.consumer_groups
        if not groups:
            return reply, effects
        timed_out = type(command) is EvalConsumerTimeouts and reply.__class__ is not Error
        if timed_out or any(group.revoking for group in groups.values()):
            ctx = Ctx(state, meta.index, state.last_time)
            if timed_out:
                self.groups_consumer_timeouts(ctx, command.queue)  # type: ignore[attr-defined]
            self.settle_groups(ctx)
            if ctx.dirty:  # messages returned over their delivery limit were dead-lettered
                self.qm.process_dirty(ctx)
            effects += ctx.effects
        return reply, effects

    def apply_to_base(
        self, meta: Meta, command: object, base: str, state: State
    ) -> tuple[Reply, list[Effect]]:
        """A per-queue command naming partitioned queue `base` (as `MachineV1.apply` does for a
        queue): a publish is routed (`Router.route`), a RegisterEnqueuer registers with the
        whole partitioned queue, anything else is refused (it names a partition, or a group)."""
        now, index = meta.system_time_ms, meta.index
        if type(now) is not int or type(index) is not int:
            return invalid("meta.index and meta.system_time_ms must be int"), []
        ctx = Ctx(state, index, max(now, state.last_time))
        kind = type(command)
        try:
            if kind is Enqueue or kind is AnnotatedEnqueue:
                reply = self.route(ctx, command)  # type: ignore[arg-type]
            elif kind is RegisterEnqueuer:
                reply = self.register_routed(ctx, command)  # type: ignore[arg-type]
            else:
                reply = Error("unsupported", f"{base!r} is a partitioned queue: {kind.__name__} "
                              f"names one of its partitions ({base}.0 ..), consumers join a "
                              "consumer group")  # fmt: skip
            if ctx.dirty:
                self.qm.process_dirty(ctx)
        except Exception as exc:  # last resort, as in MachineV1.apply
            return Error("invalid_argument", f"rejected: {type(exc).__name__}"), []
        if reply.__class__ is not Error:
            state.last_time = ctx.now
        return reply, ctx.effects

    def connection_down(self, ctx: Ctx, cmd: ConnectionDown) -> Reply:
        """As v2, then the consumer-group members on that connection end and the base-name
        publishers on it go down (normal) or are suspected (noconnection)."""
        reply = super().connection_down(ctx, cmd)
        if reply.__class__ is not Error:
            self.groups_connection_down(ctx, cmd)
            status = "down" if cmd.reason == "normal" else "suspected"
            self.routed_enqueuers_status(ctx, lambda c: c == cmd.connection, status)
        return reply

    def node_down(self, ctx: Ctx, cmd: NodeDown) -> Reply:
        """As v2, then the consumer-group members connected through that node end and its
        base-name publishers are suspected."""
        reply = super().node_down(ctx, cmd)
        if reply.__class__ is not Error:
            self.groups_node_down(ctx, cmd)
            self.routed_enqueuers_status(ctx, lambda c: c.node == cmd.node, "suspected")
        return reply

    def node_up(self, ctx: Ctx, cmd: NodeUp) -> Reply:
        """As v2, then the node's suspected base-name publishers are up."""
        reply = super().node_up(ctx, cmd)
        if reply.__class__ is not Error:
            self.routed_enqueuers_up(ctx, cmd.node)
        return reply

    def delete(self, ctx: Ctx, cmd: DeleteQueue) -> Reply:
        """As v2; a partitioned queue's base deletes it as a whole (`delete_partitioned`), and a
        single partition is refused (the partitioned queue would lose a partition)."""
        name = cmd.queue
        if ctx.state.partitioned and type(name) is str:
            if name in ctx.state.partitioned:
                return self.delete_partitioned(ctx, name)
            base = partitioned_of(ctx.state, name)
            if base is not None:
                return Error("unsupported", f"{name!r} is a partition of {base!r}: delete "
                             f"{base!r}, which deletes all its partitions")  # fmt: skip
        return super().delete(ctx, cmd)

    def delete_partitioned(self, ctx: Ctx, base: str) -> Reply:
        """Delete every partition with its messages (their consumers are told, as for a plain
        delete), the consumer groups over them, and the routing (cursor, publishers' dedup).
        Nothing can refuse after the first change."""
        state = ctx.state
        lost = 0
        for index in range(state.partitioned[base]):
            q = state.queues.pop(partition_name(base, index), None)
            if q is not None:
                lost += self.qm.delete(ctx, q)
        for name in [n for n in sorted(state.consumer_groups)
                     if state.consumer_groups[n].queue == base]:  # fmt: skip
            del state.consumer_groups[name]
        del state.partitioned[base]
        state.routing.pop(base, None)
        return DeleteOk(lost)

    def update_config(self, ctx: Ctx, cmd: UpdateConfig) -> Reply:
        """As v2; a partition stays single active consumer, a base is refused (update each
        partition)."""
        name = cmd.queue
        if ctx.state.partitioned and type(name) is str:
            if name in ctx.state.partitioned:
                return Error("unsupported", f"{name!r} is a partitioned queue: update the config "
                             f"of its partitions ({name}.0 ..)")  # fmt: skip
            base = partitioned_of(ctx.state, name)
            if base is not None and getattr(cmd.config, "single_active_consumer", True) is not True:
                return invalid(f"{name!r} is a partition of {base!r}: it stays single active "
                               "consumer")  # fmt: skip
        return super().update_config(ctx, cmd)

    def queue_machine(self) -> QueueMachineV3:
        """The per-queue handlers of this version."""
        return QueueMachineV3()

    def due_commands(self, state: State, now_ms: int) -> list[Command]:
        """Timer commands the leader should submit at `now_ms` (expiry, locks, disconnects)."""
        return timers.due_commands(state, now_ms)

    def next_deadline_ms(self, state: State) -> int | None:
        """The earliest time at which `due_commands` returns something, or None."""
        return timers.next_deadline_ms(state)

    def declare(self, ctx: Ctx, cmd: DeclareQueue) -> Reply:
        """As v2, plus grouped declares; a re-declare must name the same groups (or none)."""
        grouped = type(cmd) is DeclareGroupedQueue
        groups = cmd.groups if type(cmd) is DeclareGroupedQueue else None
        err = v.name_error(cmd.queue, "queue", limits.queue_name_bytes_max)
        err = err or v.config_error(cmd.config, cmd.queue)
        if grouped:
            err = err or group_config_error(groups)
        if err:
            return invalid(err)
        if cmd.queue in ctx.state.partitioned:
            return Error("queue_exists", f"{cmd.queue!r} is a partitioned queue")
        q = ctx.state.queues.get(cmd.queue)
        if q is not None:
            have = None if q.grouping is None else q.grouping.config
            if q.config == cmd.config and have == groups:
                return DeclareOk(False)
            return Error("queue_exists", f"queue {cmd.queue!r} exists with another config")
        if len(ctx.state.queues) >= limits.queues_max:
            return Error("unsupported", "queues_max reached")
        q = Queue(cmd.queue, cmd.config, ctx.now)
        if grouped:
            assert groups is not None
            q.grouping = Grouping(groups)
        ctx.state.queues[cmd.queue] = q
        return DeclareOk(True)
