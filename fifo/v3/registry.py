"""Machine v3 as a whole: v2's registry plus grouped declares, v3's handlers and timers."""

from __future__ import annotations

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Command,
    ConnectionDown,
    DeclareGroupedQueue,
    DeclareQueue,
    EvalConsumerTimeouts,
    GroupConfig,
    NodeDown,
)
from fifo.effects import Effect
from fifo.meta import Meta
from fifo.replies import DeclareOk, Error, Reply
from fifo.shared import Ctx, invalid
from fifo.state import Grouping, Queue, State
from fifo.v2.registry import MachineV2
from fifo.v3 import timers
from fifo.v3.machine import QueueMachineV3
from fifo.v3.partitioned import ConsumerGroups


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


class MachineV3(MachineV2, ConsumerGroups):
    """Machine version 3: `apply(meta, command, state)`, `init()` and its timers."""

    version = 3

    def __init__(self) -> None:
        super().__init__()
        self.global_handlers[DeclareGroupedQueue] = self.declare
        self.global_handlers.update(self.group_handlers())

    def apply(self, meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        """As v2; then consumer-group members timed out on a partition end, and partitions
        whose revoked holder left their queue during the command are handed to their new
        member (`ConsumerGroups.settle_groups`)."""
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

    def connection_down(self, ctx: Ctx, cmd: ConnectionDown) -> Reply:
        """As v2, then the consumer-group members on that connection end."""
        reply = super().connection_down(ctx, cmd)
        if reply.__class__ is not Error:
            self.groups_connection_down(ctx, cmd)
        return reply

    def node_down(self, ctx: Ctx, cmd: NodeDown) -> Reply:
        """As v2, then the consumer-group members connected through that node end."""
        reply = super().node_down(ctx, cmd)
        if reply.__class__ is not Error:
            self.groups_node_down(ctx, cmd)
        return reply

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
