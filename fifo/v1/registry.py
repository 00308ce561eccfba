"""Machine v1 as a whole: the queue registry (declare / delete / update config), per-queue
dispatch and the v1 timers. Frozen with v1.

`ConnectionDown`, `NodeDown` and `NodeUp` apply to every queue, in sorted queue-name order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Command,
    ConnectionDown,
    DeclareQueue,
    DeleteQueue,
    NodeDown,
    NodeUp,
    UpdateConfig,
)
from fifo.effects import Effect
from fifo.meta import Meta
from fifo.replies import DeclareOk, DeleteOk, Error, Reply
from fifo.shared import OK, Ctx, invalid
from fifo.state import Queue, State
from fifo.v1 import timers
from fifo.v1.machine import QueueMachineV1


class MachineV1:
    """Machine version 1: `apply(meta, command, state)`, `init()` and its timers."""

    version = 1

    def __init__(self) -> None:
        self.qm = self.queue_machine()
        self.queue_handlers = self.qm.handlers
        self.global_handlers: dict[type, Callable[[Ctx, Any], Reply]] = {
            DeclareQueue: self.declare,
            DeleteQueue: self.delete,
            UpdateConfig: self.update_config,
            ConnectionDown: self.connection_down,
            NodeDown: self.node_down,
            NodeUp: self.node_up,
        }

    def queue_machine(self) -> QueueMachineV1:
        """The per-queue handlers of this version."""
        return QueueMachineV1()

    def due_commands(self, state: State, now_ms: int) -> list[Command]:
        """Timer commands the leader should submit at `now_ms` (v1: `Expire` only)."""
        return timers.due_commands(state, now_ms)

    def next_deadline_ms(self, state: State) -> int | None:
        """The earliest time at which `due_commands` returns something, or None."""
        return timers.next_deadline_ms(state)

    def init(self) -> State:
        """An empty state shaped for this version."""
        return State(self.version)

    def apply(self, meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        """Apply one command; never raises; an Error reply leaves the state unchanged."""
        now = meta.system_time_ms
        index = meta.index
        if type(now) is not int or type(index) is not int:
            return invalid("meta.index and meta.system_time_ms must be int"), []
        if now < state.last_time:
            now = state.last_time
        ctx = Ctx(state, index, now)
        try:
            handler = self.queue_handlers.get(type(command))
            if handler is not None:
                name = command.queue  # type: ignore[attr-defined]
                q = state.queues.get(name) if type(name) is str else None
                if q is None:
                    return Error("unknown_queue", f"no queue {name!r}"), []
                reply = handler(ctx, q, command)
            else:
                reply = self.dispatch_global(ctx, command)
            if ctx.dirty:
                self.qm.process_dirty(ctx)
        except Exception as exc:  # last resort: validation should have caught it
            return Error("invalid_argument", f"rejected: {type(exc).__name__}"), []
        if reply.__class__ is not Error:
            state.last_time = now
        return reply, ctx.effects

    def dispatch_global(self, ctx: Ctx, command: object) -> Reply:
        """Route a registry-level command (declare, delete, config, connections, nodes)."""
        ghandler = self.global_handlers.get(type(command))
        if ghandler is None:
            return Error("unknown_command", f"{type(command).__name__} is not a command "
                         f"of machine version {self.version}")  # fmt: skip
        return ghandler(ctx, command)

    def declare(self, ctx: Ctx, cmd: DeclareQueue) -> Reply:
        """Create a queue; an equal re-declare is a no-op, a different config an error."""
        err = v.name_error(cmd.queue, "queue", limits.queue_name_bytes_max)
        err = err or v.config_error(cmd.config, cmd.queue)
        if err:
            return invalid(err)
        q = ctx.state.queues.get(cmd.queue)
        if q is not None:
            if q.config == cmd.config:
                return DeclareOk(False)
            return Error("queue_exists", f"queue {cmd.queue!r} exists with another config")
        if len(ctx.state.queues) >= limits.queues_max:
            return Error("unsupported", "queues_max reached")
        ctx.state.queues[cmd.queue] = Queue(cmd.queue, cmd.config, ctx.now)
        return DeclareOk(True)

    def delete(self, ctx: Ctx, cmd: DeleteQueue) -> Reply:
        """Delete a queue with everything in it."""
        q = ctx.state.queues.get(cmd.queue) if type(cmd.queue) is str else None
        if q is None:
            return Error("unknown_queue", f"no queue {cmd.queue!r}")
        lost = self.qm.delete(ctx, q)
        del ctx.state.queues[cmd.queue]
        return DeleteOk(lost)

    def update_config(self, ctx: Ctx, cmd: UpdateConfig) -> Reply:
        """Replace a queue's config and re-evaluate its limits at once."""
        q = ctx.state.queues.get(cmd.queue) if type(cmd.queue) is str else None
        if q is None:
            return Error("unknown_queue", f"no queue {cmd.queue!r}")
        if err := v.config_error(cmd.config, cmd.queue):
            return invalid(err)
        sac = cmd.config.single_active_consumer
        if sac != q.config.single_active_consumer and (q.consumers or q.waiting):
            return Error("unsupported", "cannot switch single_active_consumer with consumers")
        q.config = cmd.config
        self.qm.after_change(ctx, q)
        return OK

    def sorted_queues(self, ctx: Ctx) -> list[Queue]:
        """Queues in name order (commands that touch every queue)."""
        return [ctx.state.queues[n] for n in sorted(ctx.state.queues)]

    def connection_down(self, ctx: Ctx, cmd: ConnectionDown) -> Reply:
        """A connection closed or became unreachable: every queue reacts."""
        err = v.connection_error(cmd.connection)
        if err:
            return invalid(err)
        if not v.one_of(cmd.reason, ("normal", "noconnection")):
            return invalid("reason must be normal or noconnection")
        for q in self.sorted_queues(ctx):
            self.qm.connection_down(ctx, q, cmd)
        return OK

    def node_down(self, ctx: Ctx, cmd: NodeDown) -> Reply:
        """A node was lost: its connections are treated as noconnection."""
        if err := v.name_error(cmd.node, "node", limits.node_name_bytes_max):
            return invalid(err)
        for q in self.sorted_queues(ctx):
            self.qm.node_down(ctx, q, cmd)
        return OK

    def node_up(self, ctx: Ctx, cmd: NodeUp) -> Reply:
        """A lost node is back: its suspected consumers and enqueuers come up."""
        if err := v.name_error(cmd.node, "node", limits.node_name_bytes_max):
            return invalid(err)
        for q in self.sorted_queues(ctx):
            self.qm.node_up(ctx, q, cmd)
        return OK
