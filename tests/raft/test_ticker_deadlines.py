"""LoopTicker's timer ticks when the node's next timer falls due, not on a fixed grid.

Driven on the simulator's virtual loop (`raft.sim.clock`): time moves only from event to event,
so tick counts and instants are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import pytest

from raft.sim.clock import Scheduler, VirtualLoop
from raft.ticker import DUE_SLACK_S, PAST_DUE_RETRY_S, LoopTicker

HEARTBEAT_S = 0.05
PERIOD_S = 0.1


class FakeNode:
    """A node's timers as the ticker sees them: one deadline, moved by its ticks or events."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop
        self.deadline: float | None = None
        self.tick_times: list[float] = []
        self.on_tick: Callable[[], None] = lambda: None

    def tick(self) -> None:
        self.tick_times.append(self.loop.time())
        self.on_tick()

    def next_due(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.loop.time()


def _ticker(period: float = PERIOD_S) -> tuple[Scheduler, VirtualLoop, FakeNode, LoopTicker]:
    scheduler = Scheduler()
    loop = VirtualLoop(scheduler, "n1")
    node = FakeNode(loop)
    ticker = LoopTicker(loop, node.tick, period, node.next_due)  # type: ignore[arg-type]
    return scheduler, loop, node, ticker


def test_a_leader_ticks_at_its_heartbeat_deadline_only() -> None:
    """Each tick sends a heartbeat and sets the next one HEARTBEAT_S later: the timer ticks
    then (not earlier, not on a 20 ms grid), 20 times a second."""
    scheduler, loop, node, ticker = _ticker()

    def heartbeat() -> None:
        node.deadline = loop.time() + HEARTBEAT_S

    node.on_tick = heartbeat
    ticker.start()
    scheduler.run_until(1.01)
    ticker.stop()
    assert len(node.tick_times) == 21  # the start tick, then one per heartbeat
    gaps = [b - a for a, b in pairwise(node.tick_times)]
    assert all(HEARTBEAT_S - 1e-9 <= gap <= HEARTBEAT_S + DUE_SLACK_S for gap in gaps), gaps


def test_a_follower_hearing_heartbeats_ticks_only_on_them() -> None:
    """A follower's election deadline is pushed back by every heartbeat (an event tick): the
    timer armed for the old deadline fires, finds nothing due and re-arms without a tick.
    Once the heartbeats stop, it ticks every period, and at the deadline itself."""
    scheduler, loop, node, ticker = _ticker()
    election_timeout = 0.43
    stood: list[float] = []

    def heard_from_leader() -> None:
        node.deadline = loop.time() + election_timeout
        ticker.tick_now()  # a peer socket event ticks at once

    def stand_if_due() -> None:
        if node.deadline is not None and node.deadline <= loop.time():
            stood.append(loop.time())
            node.deadline = None

    node.on_tick = stand_if_due
    node.deadline = election_timeout
    ticker.start()
    for number in range(1, 21):  # heartbeats for one second
        loop.call_at(number * HEARTBEAT_S, heard_from_leader)
    scheduler.run_until(1.0)
    assert len(node.tick_times) == 1 + 20  # the start tick and the 20 heartbeats
    assert ticker.timer_wakeups > 0  # it did wake, and did not tick
    scheduler.run_until(2.0)
    ticker.stop()
    assert stood == [pytest.approx(1.0 + election_timeout)]  # on time
    after = node.tick_times[21:]
    assert after[:3] == [pytest.approx(1.1), pytest.approx(1.2), pytest.approx(1.3)]
    assert all(b - a <= PERIOD_S + 1e-9 for a, b in pairwise(after))


def test_without_a_known_deadline_it_ticks_every_period() -> None:
    """The timers the node cannot name (connection retries, handshake deadlines) still get a
    tick at least every period."""
    scheduler, _loop, node, ticker = _ticker()
    ticker.start()
    scheduler.run_until(1.01)
    ticker.stop()
    assert len(node.tick_times) == 11
    assert node.tick_times[-1] == pytest.approx(1.0)


def test_a_deadline_the_tick_does_not_clear_is_retried_not_spun() -> None:
    """A deadline left in the past by its tick (a follower connected to nobody does not stand)
    is looked at again every PAST_DUE_RETRY_S, not in a busy loop."""
    scheduler, _loop, node, ticker = _ticker()
    node.deadline = 0.0
    ticker.start()
    scheduler.run_until(1.0)
    ticker.stop()
    assert len(node.tick_times) <= 1 + round(1.0 / PAST_DUE_RETRY_S) + 1
    assert len(node.tick_times) >= round(1.0 / PAST_DUE_RETRY_S)


def test_wake_within_still_brings_a_tick_forward() -> None:
    """`wake_within` (the held-back commit index) ticks within the time asked, although the
    node's own deadline is far away."""
    scheduler, loop, node, ticker = _ticker()
    node.deadline = 10.0
    ticker.start()
    scheduler.run_until(0.5)
    before = len(node.tick_times)
    loop.call_at(0.5, lambda: ticker.wake_within(0.002))
    scheduler.run_until(0.503)
    ticker.stop()
    assert len(node.tick_times) == before + 1
    assert node.tick_times[-1] == pytest.approx(0.502)


def test_an_event_the_node_handled_lightly_does_not_tick() -> None:
    """`light_event` True: the event is counted and no tick runs (the timers still tick when
    due); False, or raising (logged), ticks as always."""
    scheduler, _loop, node, ticker = _ticker()
    answers = iter([True, False])

    def light() -> bool:
        answer = next(answers, None)
        if answer is None:
            raise RuntimeError("planted")
        return answer

    ticker.light_event = light
    ticker.start()
    scheduler.run_until(0.01)
    assert len(node.tick_times) == 1  # the start tick
    ticker.tick_now()
    assert (len(node.tick_times), ticker.light_events) == (1, 1)
    ticker.tick_now()
    ticker.tick_now()  # raises inside: never a reason to skip
    assert (len(node.tick_times), ticker.light_events) == (3, 1)
    scheduler.run_until(0.35)
    ticker.stop()
    assert len(node.tick_times) == 6  # and every period after the last tick


def test_a_heartbeat_due_just_after_the_period_gets_one_tick_not_two() -> None:
    """An idle leader's heartbeat period equals the tick period, and its next heartbeat falls
    due a little after `period` from the tick that sent (the send comes after the tick
    started): the period's tick waits for it (PERIOD_STRETCH_S). Before, the timer ticked at
    the period, found the heartbeat not yet due (pysyncobj sends nothing), and ticked again at
    the past-due retry: two ticks a round and every heartbeat PAST_DUE_RETRY_S late."""
    scheduler, loop, node, ticker = _ticker()
    sent: list[float] = []

    def heartbeat_if_due() -> None:
        # (pysyncobj compares with `>`: on a real loop the timer fires after its instant; on
        # this exact clock at it)
        if node.deadline is None or loop.time() >= node.deadline:
            sent.append(loop.time())
            node.deadline = loop.time() + 0.0005 + PERIOD_S  # set after the send

    node.on_tick = heartbeat_if_due
    ticker.start()
    scheduler.run_until(0.15)  # past the first round (the start arms the timer at `period`)
    sent_before, ticks_before = len(sent), len(node.tick_times)
    scheduler.run_until(1.15)
    ticker.stop()
    steady = sent[sent_before - 1 :]
    assert len(steady) == 11, sent
    assert all(PERIOD_S <= b - a <= PERIOD_S + 0.001 for a, b in pairwise(steady)), sent
    assert len(node.tick_times) - ticks_before == 10, node.tick_times
