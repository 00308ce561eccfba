"""Machine v2 timers: message expiry, consumer-timeout locks and disconnected timeouts."""

from __future__ import annotations

from fifo.commands import (
    Command,
    ConsumerDisconnectedTimeout,
    ConsumerKey,
    EvalConsumerTimeouts,
    Expire,
)
from fifo.state import Queue, State
from fifo.v1.timers import head_expiry


def lock_expiries(q: Queue) -> list[tuple[int, ConsumerKey]]:
    """(earliest lock expiry, key) of every consumer holding messages."""
    out: list[tuple[int, ConsumerKey]] = []
    for c in (*q.consumers.values(), *q.waiting):  # a waiting SAC consumer may still hold some
        if c.checked_out:
            out.append((min(m.lock for m in c.checked_out.values()), c.key))
    return out


def disconnect_deadlines(q: Queue) -> list[tuple[int, ConsumerKey]]:
    """(disconnected timeout deadline, key) of every suspected consumer not yet timed out."""
    out: list[tuple[int, ConsumerKey]] = []
    for c in (*q.consumers.values(), *q.waiting):
        if c.suspected_since is not None and not c.disconnected_fired:
            out.append((c.suspected_since + q.config.disconnected_timeout_ms, c.key))
    return out


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
