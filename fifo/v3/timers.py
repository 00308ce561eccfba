"""Machine v3 timers: v2's, with a grouped queue's head being its oldest waiting message."""

from __future__ import annotations

from fifo.commands import (
    Command,
    ConsumerDisconnectedTimeout,
    EvalConsumerTimeouts,
    Expire,
)
from fifo.state import Queue, State
from fifo.v1.timers import head_expiry as ungrouped_head_expiry
from fifo.v2.timers import disconnect_deadlines, lock_expiries
from fifo.v3.groups import head, oldest


def head_expiry(q: Queue) -> int | None:
    """The expiry of the message `Expire` would look at first (shallow expiry, as v1 and v2)."""
    gr = q.grouping
    if gr is None:
        return ungrouped_head_expiry(q)
    g = oldest(gr)  # drops stale index entries only: the replicated state is not changed
    m = None if g is None else head(g)
    return None if m is None else m.expiry


def due_commands(state: State, now_ms: int) -> list[Command]:
    """Expire / EvalConsumerTimeouts / ConsumerDisconnectedTimeout commands due at `now_ms`."""
    out: list[Command] = []
    for name in sorted(state.queues):
        q = state.queues[name]
        exp = head_expiry(q)
        if exp is not None and exp <= now_ms:
            out.append(Expire(name))
        keys = tuple(k for t, k in lock_expiries(q) if t <= now_ms)
        if keys:
            out.append(EvalConsumerTimeouts(name, keys))
        out.extend(ConsumerDisconnectedTimeout(name, k)
                   for t, k in disconnect_deadlines(q) if t <= now_ms)  # fmt: skip
    return out


def next_deadline_ms(state: State) -> int | None:
    """The earliest time at which `due_commands` will return something, or None."""
    best: int | None = None
    for q in state.queues.values():
        times = [t for t, _ in (*lock_expiries(q), *disconnect_deadlines(q))]
        exp = head_expiry(q)
        if exp is not None:
            times.append(exp)
        for t in times:
            best = t if best is None else min(best, t)
    return best
