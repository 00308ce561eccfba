"""Machine v1 timers: the only timer is message expiry (`Expire` for a queue whose head expired)."""

from __future__ import annotations

from fifo.commands import Command, Expire
from fifo.state import Queue, State


def head_expiry(q: Queue) -> int | None:
    """The earliest expiry among the heads of the returns and ready queues."""
    best: int | None = None
    for src in (q.returns, q.ready):  # (v1-v3 deques hold Messages, never v4 packed ints)
        if src and src[0].expiry is not None:  # type: ignore[union-attr]
            exp = src[0].expiry  # type: ignore[union-attr]
            best = exp if best is None else min(best, exp)
    return best


def due_commands(state: State, now_ms: int) -> list[Command]:
    """`Expire` for every queue (in name order) whose head has expired at `now_ms`."""
    out: list[Command] = []
    for name in sorted(state.queues):
        exp = head_expiry(state.queues[name])
        if exp is not None and exp <= now_ms:
            out.append(Expire(name))
    return out


def next_deadline_ms(state: State) -> int | None:
    """The earliest head expiry of any queue, or None."""
    best: int | None = None
    for q in state.queues.values():
        exp = head_expiry(q)
        if exp is not None:
            best = exp if best is None else min(best, exp)
    return best
