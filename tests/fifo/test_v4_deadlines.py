"""Machine v4 keeps consumer-timeout locks in an index ordered by deadline: the timers and
`EvalConsumerTimeouts` answer as a scan would, without iterating the checked-out messages."""

from __future__ import annotations

from typing import Any, cast

import pytest

import fifo
import fifo.fuzz
from fifo import commands as c
from fifo.replies import CheckoutOk, Error
from fifo.state import State
from fifo.v4 import deadlines

CONN = c.ConnectionId("n1", 1, 1)
HELD = 5_000  # messages checked out by one consumer
TIMEOUT_MS = 1_000


class NoScan(dict[int, Any]):
    """A checked-out map that refuses to be iterated (a scan would touch every message)."""

    def __iter__(self) -> Any:
        raise AssertionError("the checked-out messages were scanned")

    def items(self) -> Any:
        raise AssertionError("the checked-out messages were scanned")

    def values(self) -> Any:
        raise AssertionError("the checked-out messages were scanned")

    def keys(self) -> Any:
        raise AssertionError("the checked-out messages were scanned")


def scan_next_lock(state: State) -> int | None:
    """The earliest lock held, by a scan (what v3's timers compute)."""
    locks = [m.lock for q in state.queues.values() for k in (*q.consumers.values(), *q.waiting)
             for m in k.checked_out.values()]  # fmt: skip
    return min(locks) if locks else None


def holding_state() -> tuple[State, int]:
    """A v4 state where one competing consumer holds HELD messages, all locked at once; then
    every lock but three is renewed. Returns the state and the consumer's key."""
    state = fifo.init_state(4)
    index = 0

    def apply(command: object, now: int) -> Any:
        nonlocal index
        index += 1
        reply, _ = fifo.apply(fifo.Meta(index, 1, now, 4), command, state)
        assert not isinstance(reply, Error), reply
        return reply

    apply(c.DeclareQueue("q", c.QueueConfig(consumer_timeout_ms=TIMEOUT_MS)), 1_000)
    for n in range(HELD):
        apply(c.Enqueue("q", b"m%d" % n), 1_000)
    fifo.next_deadline_ms(state)  # the index is built once, on first use (a leader's first tick)
    checkout = c.Checkout("q", c.ConsumerId("t", CONN), c.SimplePrefetch(HELD))
    key = apply(checkout, 1_000).consumer_key
    keep = tuple(range(3, HELD))
    for start in range(0, len(keep), 4096):  # msg_ids_per_command_max
        apply(c.RenewLocks("q", key, keep[start : start + 4096]), 1_500)
    return state, key


def test_timers_and_timeouts_touch_only_what_expired() -> None:
    """With 5,000 messages held and three locks expired, the next deadline, the due commands
    and EvalConsumerTimeouts never iterate the checked-out messages, and return exactly the
    three expired ones."""
    state, key = holding_state()
    consumer = state.queues["q"].consumers[key]
    consumer.checked_out = NoScan(consumer.checked_out)
    assert fifo.next_deadline_ms(state) == 1_000 + TIMEOUT_MS
    due = fifo.due_commands(state, 2_001)
    assert due == [c.EvalConsumerTimeouts("q", (key,))]
    _, effects = fifo.apply(fifo.Meta(10**6, 1, 2_001, 4), due[0], state)
    released = [e for e in effects if isinstance(e, fifo.effects.Released)]
    assert [e.msg_ids for e in released] == [(0, 1, 2)]
    assert fifo.next_deadline_ms(state) == 1_500 + TIMEOUT_MS
    assert fifo.due_commands(state, 2_001) == []


def test_the_index_answers_as_a_scan_on_fuzzed_logs() -> None:
    """Along fuzzed v4 logs (every command kind, timers firing), the index's next lock is the
    scan's, also when it is rebuilt after every few pushes."""
    for seed, rebuild_every in ((11, None), (12, 8)):
        state = fifo.init_state(4)
        for number, (meta, command) in enumerate(fifo.fuzz.generate_log(seed, 1_000, 4)):
            fifo.apply(meta, command, state)
            if rebuild_every is not None and state.deadlines is not None:
                index = state.deadlines
                index.rebuild_after = min(index.rebuild_after, index.pushes + rebuild_every)
            if number % 25 == 0:
                assert deadlines.next_lock(state) == scan_next_lock(state), (seed, number)


def test_the_index_stays_bounded() -> None:
    """Settled messages leave stale entries behind; a rebuild keeps the index within a few
    times the locks held."""
    state = fifo.init_state(4)
    meta = iter(range(1, 10**6))
    fifo.apply(fifo.Meta(next(meta), 1, 0, 4), c.DeclareQueue("q"), state)
    checkout = c.Checkout("q", c.ConsumerId("t", CONN), c.SimplePrefetch(10))
    reply, _ = fifo.apply(fifo.Meta(next(meta), 1, 0, 4), checkout, state)
    key = cast(CheckoutOk, reply).consumer_key  # (a checkout answers CheckoutOk)
    fifo.next_deadline_ms(state)  # builds the index
    for n in range(5_000):
        fifo.apply(fifo.Meta(next(meta), 1, n, 4), c.Enqueue("q", b"x"), state)
        fifo.apply(fifo.Meta(next(meta), 1, n, 4), c.Settle("q", key, (n,)), state)
    index = state.deadlines
    assert index is not None and len(index.entries) <= 3 * 10 + deadlines.REBUILD_SLACK


def test_the_leader_timer_asks_for_the_next_deadline_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """cluster.node.timers.due_now computes the due commands only once the deadline passed."""
    from cluster.node.timers import due_now

    state, _key = holding_state()
    calls: list[int] = []
    real = fifo.due_commands

    def counting(s: State, now: int) -> list[c.Command]:
        calls.append(now)
        return real(s, now)

    monkeypatch.setattr(fifo, "due_commands", counting)
    assert due_now(state, 1_999) == [] and calls == []
    assert due_now(state, 2_000) != [] and calls == [2_000]
