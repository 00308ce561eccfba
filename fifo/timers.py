"""Timer commands the leader should submit (pure; called outside the log).

Each machine version owns its timers (`fifo/vN/timers.py`); these pick them by the state's version.
"""

from __future__ import annotations

from fifo.commands import Command
from fifo.state import State
from fifo.versions import machine_for


def due_commands(state: State, now_ms: int) -> list[Command]:
    """The timer commands due at `now_ms` for the machine the state is shaped for."""
    return machine_for(state.version).due_commands(state, now_ms)


def next_deadline_ms(state: State) -> int | None:
    """The earliest time at which `due_commands` will return something, or None."""
    return machine_for(state.version).next_deadline_ms(state)
