"""Machine v2 as a whole: v1's registry with v2's per-queue handlers and v2's timers."""

from __future__ import annotations

from fifo.commands import Command
from fifo.state import State
from fifo.v1.registry import MachineV1
from fifo.v2 import timers
from fifo.v2.machine import QueueMachineV2


class MachineV2(MachineV1):
    """Machine version 2: `apply(meta, command, state)`, `init()` and its timers."""

    version = 2

    def queue_machine(self) -> QueueMachineV2:
        """The per-queue handlers of this version."""
        return QueueMachineV2()

    def due_commands(self, state: State, now_ms: int) -> list[Command]:
        """Timer commands the leader should submit at `now_ms` (expiry, locks, disconnects)."""
        return timers.due_commands(state, now_ms)

    def next_deadline_ms(self, state: State) -> int | None:
        """The earliest time at which `due_commands` returns something, or None."""
        return timers.next_deadline_ms(state)
