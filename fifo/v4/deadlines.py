"""Machine v4: consumer-timeout locks by deadline, so no timer scans the checked-out messages.

Every lock the machine sets is pushed into `State.deadlines` (a `fifo.state.LockIndex`): once in
a heap of all locks (the leader's next deadline, the consumers due) and once in the holding
consumer's own heap (what `EvalConsumerTimeouts` returns). Settles and returns remove nothing:
an entry is stale once its message left the consumer or got another lock, and stale entries are
dropped when they reach the top, or all at once when the index is rebuilt (after a restore or a
conversion, and when pushes since the last build exceed twice the locks then held, so the work
stays O(1) per lock amortised). The index is derived: whatever it holds, the answers below are
those of a scan of every checked-out message, which `tests/fifo/test_v4_deadlines.py` checks.
"""

from __future__ import annotations

import heapq

from fifo.commands import ConsumerKey
from fifo.state import Consumer, LockEntry, LockIndex, Message, Queue, State

REBUILD_SLACK = 1024  # pushes allowed beyond twice the locks held at the last build


def consumer_with_key(queue: Queue, key: ConsumerKey) -> Consumer | None:
    """The consumer of `queue` with `key` (active, cancelled or waiting), or None."""
    consumer = queue.consumers.get(key)
    if consumer is not None:
        return consumer
    for waiting_consumer in queue.waiting:
        if waiting_consumer.key == key:
            return waiting_consumer
    return None


def build(state: State) -> LockIndex:
    """The index of every lock held now (queues, then consumers, then ids, in state order)."""
    index = LockIndex()
    held = 0
    for queue in state.queues.values():
        for consumer in (*queue.consumers.values(), *queue.waiting):
            if not consumer.checked_out:
                continue
            mine = [(message.lock, msg_id) for msg_id, message in consumer.checked_out.items()]
            heapq.heapify(mine)
            index.by_consumer[(queue.name, consumer.key)] = mine
            for lock, msg_id in mine:
                index.entries.append((lock, held, queue.name, consumer.key, msg_id))
                held += 1
    heapq.heapify(index.entries)
    index.pushes = held
    index.rebuild_after = 3 * held + REBUILD_SLACK
    return index


def index_of(state: State) -> LockIndex:
    """The state's lock index, built on first use (after a restore or a conversion)."""
    index = state.deadlines
    if index is None:
        index = state.deadlines = build(state)
    return index


def track(state: State, queue: Queue, consumer: Consumer, msg_id: int, message: Message) -> None:
    """A lock was just set on a checked-out message: index it (nothing to do if not built)."""
    index = state.deadlines
    if index is None:
        return
    if index.pushes >= index.rebuild_after:
        state.deadlines = build(state)  # includes this lock: it is already set
        return
    lock = message.lock
    heapq.heappush(index.entries, (lock, index.pushes, queue.name, consumer.key, msg_id))
    index.pushes += 1
    mine = index.by_consumer.get((queue.name, consumer.key))
    if mine is None:
        index.by_consumer[(queue.name, consumer.key)] = [(lock, msg_id)]
    else:
        heapq.heappush(mine, (lock, msg_id))


def _live(state: State, entry: LockEntry) -> bool:
    """Whether an entry names a message still checked out with that lock."""
    lock, _, queue_name, key, msg_id = entry
    queue = state.queues.get(queue_name)
    consumer = consumer_with_key(queue, key) if queue is not None else None
    message = consumer.checked_out.get(msg_id) if consumer is not None else None
    return message is not None and message.lock == lock


def next_lock(state: State) -> int | None:
    """The earliest lock expiry held (stale entries on top are dropped), or None."""
    entries = index_of(state).entries
    while entries:
        if _live(state, entries[0]):
            return entries[0][0]
        heapq.heappop(entries)
    return None


def due_consumers(state: State, now_ms: int) -> dict[str, set[ConsumerKey]]:
    """Queue -> keys of the consumers holding a lock expired at `now_ms`.

    Visits only the heap entries at or before `now_ms` (and their direct children): the heap
    is not changed, so a command that is never committed is found due again.
    """
    entries = index_of(state).entries
    due: dict[str, set[ConsumerKey]] = {}
    todo = [0] if entries else []
    while todo:
        position = todo.pop()
        entry = entries[position]
        if entry[0] > now_ms:
            continue
        if _live(state, entry):
            due.setdefault(entry[2], set()).add(entry[3])
        todo += [child for child in (2 * position + 1, 2 * position + 2) if child < len(entries)]
    return due


def expired_ids(state: State, queue: Queue, consumer: Consumer, now_ms: int) -> list[int]:
    """Take the consumer's locks expired at `now_ms` off its heap; their message ids, sorted.

    The caller returns every one of them (a consumer timeout), so taking them off is right.
    """
    mine = index_of(state).by_consumer.get((queue.name, consumer.key))
    expired: dict[int, None] = {}
    while mine and mine[0][0] <= now_ms:
        lock, msg_id = heapq.heappop(mine)
        message = consumer.checked_out.get(msg_id)
        if message is not None and message.lock == lock:
            expired[msg_id] = None
    return sorted(expired)
