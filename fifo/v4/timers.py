"""Machine v4 timers: message expiry, consumer-timeout locks and disconnected timeouts.

The same commands as v3's timers, found without a scan of the checked-out messages: locks come
from the deadline index (`fifo.v4.deadlines`); per queue only the head's expiry and the
suspected consumers are looked at (O(queues + consumers), never O(messages)).
"""

from __future__ import annotations

from fifo.commands import (
    Command,
    ConsumerDisconnectedTimeout,
    ConsumerKey,
    EvalConsumerTimeouts,
    Expire,
)
from fifo.state import Queue, State, expiry_of
from fifo.v4 import deadlines
from fifo.v4 import groups as group_index


def head_expiry(queue: Queue) -> int | None:
    """The expiry of the message `Expire` would look at first (shallow expiry)."""
    grouping = queue.grouping
    if grouping is not None:
        group = group_index.oldest(grouping)  # drops stale index entries only
        message = None if group is None else group_index.head(group)
        return None if message is None else message.expiry
    best: int | None = None
    for source in (queue.returns, queue.ready):
        expiry = expiry_of(source[0]) if source else None
        if expiry is not None:
            best = expiry if best is None else min(best, expiry)
    return best


def disconnect_deadlines(queue: Queue) -> list[tuple[int, ConsumerKey]]:
    """(disconnected timeout deadline, key) of every suspected consumer not yet timed out."""
    out: list[tuple[int, ConsumerKey]] = []
    for consumer in (*queue.consumers.values(), *queue.waiting):
        if consumer.suspected_since is not None and not consumer.disconnected_fired:
            deadline = consumer.suspected_since + queue.config.disconnected_timeout_ms
            out.append((deadline, consumer.key))
    return out


def timed_out_keys(queue: Queue, due: set[ConsumerKey]) -> tuple[ConsumerKey, ...]:
    """The consumers in `due`, in the queue's order (active ones, then waiting ones)."""
    return tuple(consumer.key for consumer in (*queue.consumers.values(), *queue.waiting)
                 if consumer.key in due and consumer.checked_out)  # fmt: skip


def due_commands(state: State, now_ms: int) -> list[Command]:
    """Expire / EvalConsumerTimeouts / ConsumerDisconnectedTimeout commands due at `now_ms`."""
    locked = deadlines.due_consumers(state, now_ms)
    out: list[Command] = []
    for name in sorted(state.queues):
        queue = state.queues[name]
        expiry = head_expiry(queue)
        if expiry is not None and expiry <= now_ms:
            out.append(Expire(name))
        due = locked.get(name)
        keys = timed_out_keys(queue, due) if due else ()
        if keys:
            out.append(EvalConsumerTimeouts(name, keys))
        for deadline, key in disconnect_deadlines(queue):
            if deadline <= now_ms:
                out.append(ConsumerDisconnectedTimeout(name, key))
    return out


def next_deadline_ms(state: State) -> int | None:
    """The earliest time at which `due_commands` will return something, or None."""
    best = deadlines.next_lock(state)
    for queue in state.queues.values():
        times = [deadline for deadline, _ in disconnect_deadlines(queue)]
        expiry = head_expiry(queue)
        if expiry is not None:
            times.append(expiry)
        for time_ms in times:
            best = time_ms if best is None else min(best, time_ms)
    return best
