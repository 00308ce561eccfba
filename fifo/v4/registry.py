"""Machine v4 as a whole: `apply`, the queue registry (declare, delete, update config), the
commands that touch every queue, and the timers.

`apply` has no catch-all: a handler that raises is a bug, and the exception leaves `apply` (the
fuzzer reports it; on a node, `raft.node` stops applying at that entry, on every replica alike).
`ConnectionDown`, `NodeDown` and `NodeUp` apply to every queue, in sorted queue-name order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    AnnotatedEnqueue,
    BindExchange,
    BindQueue,
    Command,
    ConnectionDown,
    DeclareExchange,
    DeclareGroupedQueue,
    DeclarePartitionedQueue,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    Enqueue,
    EvalConsumerTimeouts,
    GroupConfig,
    JoinGroup,
    LeaveGroup,
    NodeDown,
    NodeUp,
    PublishToExchange,
    RegisterEnqueuer,
    UnbindExchange,
    UnbindQueue,
    UpdateConfig,
)
from fifo.effects import Deliver, Effect, RefDeliver
from fifo.meta import Meta
from fifo.replies import DeclareOk, DeleteOk, Error, Reply
from fifo.shared import OK, Ctx, invalid
from fifo.state import Grouping, Queue, State
from fifo.v4 import timers
from fifo.v4.exchanges import Exchanges
from fifo.v4.machine import QueueMachine
from fifo.v4.partitioned import ConsumerGroups
from fifo.v4.routing import Router, partition_name, partitioned_of


def _to_an_ended_consumer(effect: Effect, state: State) -> bool:
    """A delivery to a consumer the same command then ended: a member timed out on one
    partition, its returned messages overflowed into another partition it held and were handed
    to it there, and then its membership ended on every partition (`after_groups`), which put
    those messages back. Nobody may be told of them (fuzz seed 125)."""
    if type(effect) is not Deliver and type(effect) is not RefDeliver:
        return False
    queue = state.queues.get(effect.queue)
    return queue is None or (
        effect.consumer_key not in queue.consumers
        and not any(w.key == effect.consumer_key for w in queue.waiting)
    )


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


class MachineV4:
    """Machine version 4: `apply(meta, command, state)`, `init()` and its timers."""

    version = 4

    def __init__(self) -> None:
        self.queues = QueueMachine()
        self.queue_handlers = self.queues.handlers
        self.groups = ConsumerGroups(self.queues)
        self.router = Router(self.queues)
        self.exchanges = Exchanges(self.queues)
        self.global_handlers: dict[type, Callable[[Ctx, Any], Reply]] = {
            DeclareQueue: self.declare,
            DeclareGroupedQueue: self.declare,
            DeleteQueue: self.delete,
            UpdateConfig: self.update_config,
            ConnectionDown: self.connection_down,
            NodeDown: self.node_down,
            NodeUp: self.node_up,
            DeclarePartitionedQueue: self.groups.declare_partitioned,
            JoinGroup: self.groups.join_group,
            LeaveGroup: self.groups.leave_group,
            DeclareExchange: self.exchanges.declare,
            DeleteExchange: self.exchanges.delete,
            BindQueue: self.exchanges.bind,
            UnbindQueue: self.exchanges.unbind,
            PublishToExchange: self.exchanges.publish,
            BindExchange: self.exchanges.bind_exchange,
            UnbindExchange: self.exchanges.unbind_exchange,
        }

    def init(self) -> State:
        """An empty state shaped for this version."""
        return State(self.version)

    def due_commands(self, state: State, now_ms: int) -> list[Command]:
        """Timer commands the leader should submit at `now_ms` (expiry, locks, disconnects)."""
        return timers.due_commands(state, now_ms)

    def next_deadline_ms(self, state: State) -> int | None:
        """The earliest time at which `due_commands` returns something, or None (no scan of
        the checked-out messages: `fifo.v4.deadlines`)."""
        return timers.next_deadline_ms(state)

    # --- apply ---------------------------------------------------------------------------------

    def apply(self, meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        """Apply one command; an Error reply leaves the state unchanged; an exception is a bug
        and is not caught. A per-queue command naming a partitioned queue's base goes to
        `apply_to_base`; then consumer groups settle (`after_groups`)."""
        now, index = meta.system_time_ms, meta.index
        reply: Reply
        effects: list[Effect]
        if type(now) is not int or type(index) is not int:
            reply, effects = invalid("meta.index and meta.system_time_ms must be int"), []
        else:
            ctx = Ctx(state, index, max(now, state.last_time))
            name = getattr(command, "queue", None) if state.partitioned else None
            if (type(name) is str and name in state.partitioned
                    and type(command) in self.queue_handlers):  # fmt: skip
                reply = self.apply_to_base(ctx, command, name)
            else:
                reply = self.dispatch(ctx, command)
            if ctx.dirty:
                self.queues.process_dirty(ctx)
            if reply.__class__ is not Error:
                state.last_time = ctx.now
            effects = ctx.effects
        if state.consumer_groups:
            ended = self.after_groups(meta, command, reply, state)
            if ended and type(command) is EvalConsumerTimeouts:
                effects = [e for e in effects if not _to_an_ended_consumer(e, state)]
            effects += ended
        return reply, effects

    def dispatch(self, ctx: Ctx, command: object) -> Reply:
        """Route a command to its per-queue or registry-level handler."""
        handler = self.queue_handlers.get(type(command))
        if handler is None:
            return self.dispatch_global(ctx, command)
        name = command.queue  # type: ignore[attr-defined]
        queue = ctx.state.queues.get(name) if type(name) is str else None
        if queue is None:
            return Error("unknown_queue", f"no queue {name!r}")
        return handler(ctx, queue, command)

    def dispatch_global(self, ctx: Ctx, command: object) -> Reply:
        """Route a registry-level command (declare, delete, config, connections, nodes)."""
        handler = self.global_handlers.get(type(command))
        if handler is None:
            return Error("unknown_command", f"{type(command).__name__} is not a command "
                         f"of machine version {self.version}")  # fmt: skip
        return handler(ctx, command)

    def apply_to_base(self, ctx: Ctx, command: object, base: str) -> Reply:
        """A per-queue command naming partitioned queue `base`: a publish is routed, a
        RegisterEnqueuer registers with the whole partitioned queue, anything else is refused."""
        kind = type(command)
        if kind is Enqueue or kind is AnnotatedEnqueue:
            return self.router.route(ctx, command)  # type: ignore[arg-type]
        if kind is RegisterEnqueuer:
            return self.router.register_routed(ctx, command)  # type: ignore[arg-type]
        return Error("unsupported", f"{base!r} is a partitioned queue: {kind.__name__} names "
                     f"one of its partitions ({base}.0 ..), consumers join a consumer "
                     "group")  # fmt: skip

    def after_groups(self, meta: Meta, command: object, reply: Reply, state: State) -> list[Effect]:
        """Consumer groups after a command: members timed out on a partition end (after a
        successful EvalConsumerTimeouts); revoked holders that left hand their partitions over."""
        timed_out = type(command) is EvalConsumerTimeouts and reply.__class__ is not Error
        if not timed_out and not any(group.revoking for group in state.consumer_groups.values()):
            return []
        ctx = Ctx(state, meta.index, state.last_time)
        if timed_out:
            self.groups.groups_consumer_timeouts(ctx, command.queue)  # type: ignore[attr-defined]
        self.groups.settle_groups(ctx)
        if ctx.dirty:  # messages returned over their delivery limit were dead-lettered
            self.queues.process_dirty(ctx)
        return ctx.effects

    # --- the registry --------------------------------------------------------------------------

    def declare(self, ctx: Ctx, cmd: DeclareQueue) -> Reply:
        """Create a queue (grouped, if declared so); an equal re-declare is a no-op, a different
        config (or groups) an error."""
        groups = cmd.groups if type(cmd) is DeclareGroupedQueue else None
        err = v.name_error(cmd.queue, "queue", limits.queue_name_bytes_max)
        err = err or v.config_error(cmd.config, cmd.queue)
        if type(cmd) is DeclareGroupedQueue:
            err = err or group_config_error(groups)
        if err:
            return invalid(err)
        if cmd.queue in ctx.state.partitioned:
            return Error("queue_exists", f"{cmd.queue!r} is a partitioned queue")
        queue = ctx.state.queues.get(cmd.queue)
        if queue is not None:
            have = None if queue.grouping is None else queue.grouping.config
            if queue.config == cmd.config and have == groups:
                return DeclareOk(False)
            return Error("queue_exists", f"queue {cmd.queue!r} exists with another config")
        if len(ctx.state.queues) >= limits.queues_max:
            return Error("unsupported", "queues_max reached")
        queue = Queue.lined(cmd.queue, cmd.config, ctx.now)
        if groups is not None:
            queue.grouping = Grouping(groups)
        ctx.state.queues[cmd.queue] = queue
        return DeclareOk(True)

    def delete(self, ctx: Ctx, cmd: DeleteQueue) -> Reply:
        """Delete a queue with everything in it; a partitioned queue's base deletes it as a whole,
        a single partition is refused."""
        name = cmd.queue
        if ctx.state.partitioned and type(name) is str:
            if name in ctx.state.partitioned:
                return self.delete_partitioned(ctx, name)
            base = partitioned_of(ctx.state, name)
            if base is not None:
                return Error("unsupported", f"{name!r} is a partition of {base!r}: delete "
                             f"{base!r}, which deletes all its partitions")  # fmt: skip
        queue = ctx.state.queues.get(name) if type(name) is str else None
        if queue is None:
            return Error("unknown_queue", f"no queue {name!r}")
        lost = self.queues.delete(ctx, queue)
        del ctx.state.queues[queue.name]
        if ctx.state.exchanges:
            self.exchanges.queue_deleted(ctx.state, queue.name)
        return DeleteOk(lost)

    def delete_partitioned(self, ctx: Ctx, base: str) -> Reply:
        """Delete every partition with its messages (their consumers are told), the consumer
        groups over them, and the routing. Nothing can refuse after the first change."""
        state = ctx.state
        lost = 0
        for index in range(state.partitioned[base]):
            queue = state.queues.pop(partition_name(base, index), None)
            if queue is not None:
                lost += self.queues.delete(ctx, queue)
        for name in [n for n in sorted(state.consumer_groups)
                     if state.consumer_groups[n].queue == base]:  # fmt: skip
            del state.consumer_groups[name]
        del state.partitioned[base]
        state.routing.pop(base, None)
        return DeleteOk(lost)

    def update_config(self, ctx: Ctx, cmd: UpdateConfig) -> Reply:
        """Replace a queue's config and re-evaluate its limits at once; a partition stays single
        active consumer, a partitioned queue's base is refused (update each partition)."""
        name = cmd.queue
        if ctx.state.partitioned and type(name) is str:
            if name in ctx.state.partitioned:
                return Error("unsupported", f"{name!r} is a partitioned queue: update the config "
                             f"of its partitions ({name}.0 ..)")  # fmt: skip
            base = partitioned_of(ctx.state, name)
            if base is not None and getattr(cmd.config, "single_active_consumer", True) is not True:
                return invalid(f"{name!r} is a partition of {base!r}: it stays single active "
                               "consumer")  # fmt: skip
        queue = ctx.state.queues.get(name) if type(name) is str else None
        if queue is None:
            return Error("unknown_queue", f"no queue {name!r}")
        if err := v.config_error(cmd.config, name):
            return invalid(err)
        sac = cmd.config.single_active_consumer
        if sac != queue.config.single_active_consumer and (queue.consumers or queue.waiting):
            return Error("unsupported", "cannot switch single_active_consumer with consumers")
        queue.config = cmd.config
        self.queues.after_change(ctx, queue)
        return OK

    # --- commands that touch every queue -------------------------------------------------------

    def sorted_queues(self, ctx: Ctx) -> list[Queue]:
        """Queues in name order (commands that touch every queue)."""
        return [ctx.state.queues[name] for name in sorted(ctx.state.queues)]

    def connection_down(self, ctx: Ctx, cmd: ConnectionDown) -> Reply:
        """A connection closed or became unreachable: every queue reacts, then the consumer-group
        members on it end and the base-name publishers on it go down or are suspected."""
        if err := v.connection_error(cmd.connection):
            return invalid(err)
        if not v.one_of(cmd.reason, ("normal", "noconnection")):
            return invalid("reason must be normal or noconnection")
        for queue in self.sorted_queues(ctx):
            self.queues.connection_down(ctx, queue, cmd)
        self.groups.groups_connection_down(ctx, cmd)
        status = "down" if cmd.reason == "normal" else "suspected"
        self.router.routed_enqueuers_status(
            ctx, lambda connection: connection == cmd.connection, status
        )
        return OK

    def node_down(self, ctx: Ctx, cmd: NodeDown) -> Reply:
        """A node was lost: its connections are treated as noconnection (and its group members
        end, its base-name publishers are suspected)."""
        if err := v.name_error(cmd.node, "node", limits.node_name_bytes_max):
            return invalid(err)
        for queue in self.sorted_queues(ctx):
            self.queues.node_down(ctx, queue, cmd)
        self.groups.groups_node_down(ctx, cmd)
        self.router.routed_enqueuers_status(
            ctx, lambda connection: connection.node == cmd.node, "suspected"
        )
        return OK

    def node_up(self, ctx: Ctx, cmd: NodeUp) -> Reply:
        """A lost node is back: its suspected consumers and enqueuers come up."""
        if err := v.name_error(cmd.node, "node", limits.node_name_bytes_max):
            return invalid(err)
        for queue in self.sorted_queues(ctx):
            self.queues.node_up(ctx, queue, cmd)
        self.router.routed_enqueuers_up(ctx, cmd.node)
        return OK
