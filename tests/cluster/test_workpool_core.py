"""The work pool's core against the "Channeling Work" specification (Hypothesis stateful).

Every rule is one of the specification's operations (deliver to a dormant, ready or in-progress
channel; start work; end work with or without more to do; register and unregister a channel)
plus the shells' stop (`take_waiting`). Each runs on the real `ChannelPool`; before anything
else the state invariant is checked (dormant, ready and in-progress partition the known channels,
the ready queue has no repeats, dormant channels have no work), then the post-state is compared
with the one the operation's schema gives from the pre-state. Planted bugs show both can fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cluster.client.workpool_core import ChannelPool, ChannelStateError, Partition

CHANNELS = ("a", "b", "c", "d")
SPEC_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# no shrinking: the planted tests only need to see the failure, and see it fast
PLANTED_SETTINGS = settings(
    SPEC_SETTINGS,
    max_examples=100,
    stateful_step_count=60,
    database=None,
    derandomize=True,
    phases=[Phase.generate],
)


@dataclass(frozen=True)
class Spec:
    """The specification's State, read from a core: pool (work per channel), dormant, ready,
    in-progress, as plain values so pre- and post-states can be compared."""

    pool: dict[str, tuple[int, ...]]
    dormant: frozenset[str]
    ready: tuple[str, ...]
    in_progress: frozenset[str]

    @staticmethod
    def of(core: ChannelPool[str, int]) -> Spec:
        return Spec(
            {channel: tuple(core.work_of(channel)) for channel in core.pool},
            frozenset(core.dormant),
            tuple(core.ready),
            frozenset(core.in_progress),
        )

    def with_work(self, channel: str, work: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        return {**self.pool, channel: work}


def state_invariant(core: ChannelPool[str, int]) -> None:
    """The specification's State schema, on the real core's fields."""
    spec = Spec.of(core)
    ready = set(spec.ready)
    assert len(ready) == len(spec.ready), f"state invariant: ready repeats {spec.ready}"
    assert not (spec.dormant & ready), f"state invariant: dormant and ready share {spec}"
    assert not (spec.dormant & spec.in_progress), f"state invariant: dormant, in progress {spec}"
    assert not (ready & spec.in_progress), f"state invariant: ready and in progress share {spec}"
    known = spec.dormant | ready | spec.in_progress
    assert known == set(spec.pool), f"state invariant: partitions {known} != known {spec.pool}"
    busy = {channel for channel in spec.dormant if spec.pool[channel]}
    assert not busy, f"state invariant: dormant channels with work {busy}"
    # implied by the operations: a ready channel has work, so StartWork always finds an item
    idle = {channel for channel in spec.ready if not spec.pool[channel]}
    assert not idle, f"state invariant: ready channels without work {idle}"
    assert core.waiting == sum(map(len, spec.pool.values())), "state invariant: waiting count"


class ChannelPoolSpec(RuleBasedStateMachine):
    """Drives a core (`make_core`) through the specification's operations."""

    make_core: Callable[[], ChannelPool[str, int]] = ChannelPool

    def __init__(self) -> None:
        super().__init__()
        self.core = type(self).make_core()
        self.next_work = 0

    def work(self) -> int:
        self.next_work += 1
        return self.next_work

    def after(self, before: Spec, expected: Spec, operation: str) -> None:
        state_invariant(self.core)
        actual = Spec.of(self.core)
        assert actual == expected, f"{operation}: from {before} expected {expected}, got {actual}"

    def known(self) -> list[str]:
        return sorted(self.core.pool)

    # --- channel creation and deletion -------------------------------------------------------

    @rule(channel=st.sampled_from(CHANNELS))
    def register(self, channel: str) -> None:
        before = Spec.of(self.core)
        if channel in before.pool:
            with pytest.raises(ChannelStateError):
                self.core.register(channel)
            self.after(before, before, "Register (known)")
            return
        self.core.register(channel)
        expected = Spec(
            before.with_work(channel, ()),
            before.dormant | {channel},
            before.ready,
            before.in_progress,
        )
        self.after(before, expected, "Register")

    @precondition(lambda self: bool(self.core.dormant))
    @rule(data=st.data())
    def unregister(self, data: st.DataObject) -> None:
        before = Spec.of(self.core)
        channel = data.draw(st.sampled_from(sorted(before.dormant)))
        self.core.unregister(channel)
        pool = {c: w for c, w in before.pool.items() if c != channel}
        expected = Spec(pool, before.dormant - {channel}, before.ready, before.in_progress)
        self.after(before, expected, "Unregister")

    @precondition(lambda self: bool(self.core.ready) or bool(self.core.in_progress))
    @rule(data=st.data())
    def unregister_a_busy_channel_is_refused(self, data: st.DataObject) -> None:
        before = Spec.of(self.core)
        channel = data.draw(st.sampled_from(sorted(set(before.ready) | before.in_progress)))
        with pytest.raises(ChannelStateError):
            self.core.unregister(channel)
        self.after(before, before, "Unregister (busy)")

    # --- DeliverWork ---------------------------------------------------------------------------

    def deliver(self, channel: str, expected_from: Partition) -> tuple[Spec, int]:
        before = Spec.of(self.core)
        work = self.work()
        found = self.core.deliver(channel, work)
        assert found is expected_from, f"deliver to {channel}: said {found}, is {expected_from}"
        return before, work

    @precondition(lambda self: bool(self.core.dormant))
    @rule(data=st.data())
    def deliver_dormant(self, data: st.DataObject) -> None:
        channel = data.draw(st.sampled_from(sorted(self.core.dormant)))
        before, work = self.deliver(channel, Partition.DORMANT)
        expected = Spec(
            before.with_work(channel, (*before.pool[channel], work)),
            before.dormant - {channel},
            (*before.ready, channel),
            before.in_progress,
        )
        self.after(before, expected, "DeliverDormant")

    @precondition(lambda self: bool(self.core.ready))
    @rule(data=st.data())
    def deliver_ready(self, data: st.DataObject) -> None:
        channel = data.draw(st.sampled_from(sorted(self.core.ready)))
        before, work = self.deliver(channel, Partition.READY)
        pool = before.with_work(channel, (*before.pool[channel], work))
        self.after(
            before, Spec(pool, before.dormant, before.ready, before.in_progress), "DeliverReady"
        )

    @precondition(lambda self: bool(self.core.in_progress))
    @rule(data=st.data())
    def deliver_in_progress(self, data: st.DataObject) -> None:
        channel = data.draw(st.sampled_from(sorted(self.core.in_progress)))
        before, work = self.deliver(channel, Partition.IN_PROGRESS)
        pool = before.with_work(channel, (*before.pool[channel], work))
        self.after(
            before,
            Spec(pool, before.dormant, before.ready, before.in_progress),
            "DeliverInProgress",
        )

    @rule(channel=st.sampled_from(CHANNELS))
    def deliver_to_an_unknown_channel_is_refused(self, channel: str) -> None:
        before = Spec.of(self.core)
        if channel in before.pool:
            return
        with pytest.raises(ChannelStateError):
            self.core.deliver(channel, self.work())
        self.after(before, before, "Deliver (unknown)")

    # --- StartWork -----------------------------------------------------------------------------

    @rule()
    def start_work(self) -> None:
        before = Spec.of(self.core)
        started = self.core.start_work()
        if not before.ready:
            assert started is None, f"StartWork with nothing ready gave {started}"
            self.after(before, before, "StartWork (nothing ready)")
            return
        assert started is not None, "StartWork found nothing though a channel was ready"
        channel, work = started
        assert channel == before.ready[0], f"StartWork took {channel}, not the head"
        assert before.pool[channel][:1] == (work,), f"StartWork took {work}, not the first"
        expected = Spec(
            before.with_work(channel, before.pool[channel][1:]),
            before.dormant,
            before.ready[1:],
            before.in_progress | {channel},
        )
        self.after(before, expected, "StartWork")

    # --- EndWork -------------------------------------------------------------------------------

    @precondition(lambda self: any(self.core.pool[c] for c in self.core.in_progress))
    @rule(data=st.data())
    def end_work_more_to_do(self, data: st.DataObject) -> None:
        before = Spec.of(self.core)
        channel = data.draw(
            st.sampled_from(sorted(c for c in before.in_progress if before.pool[c]))
        )
        assert self.core.end_work(channel) is True
        expected = Spec(
            before.pool, before.dormant, (*before.ready, channel), before.in_progress - {channel}
        )
        self.after(before, expected, "EndWorkMoreToDo")

    @precondition(lambda self: any(not self.core.pool[c] for c in self.core.in_progress))
    @rule(data=st.data())
    def end_work_no_more_to_do(self, data: st.DataObject) -> None:
        before = Spec.of(self.core)
        idle = sorted(c for c in before.in_progress if not before.pool[c])
        channel = data.draw(st.sampled_from(idle))
        assert self.core.end_work(channel) is False
        expected = Spec(
            before.pool, before.dormant | {channel}, before.ready, before.in_progress - {channel}
        )
        self.after(before, expected, "EndWorkNoMoreToDo")

    @rule(channel=st.sampled_from(CHANNELS))
    def end_work_not_in_progress_is_refused(self, channel: str) -> None:
        before = Spec.of(self.core)
        if channel in before.in_progress:
            return
        with pytest.raises(ChannelStateError):
            self.core.end_work(channel)
        self.after(before, before, "EndWork (not in progress)")

    # --- the shells' stop ----------------------------------------------------------------------

    @rule()
    def take_waiting(self) -> None:
        before = Spec.of(self.core)
        taken = self.core.take_waiting()
        assert sorted(taken) == taken, f"take_waiting out of arrival order: {taken}"
        assert sorted(taken) == sorted(w for work in before.pool.values() for w in work)
        expected = Spec(
            {channel: () for channel in before.pool},
            before.dormant | set(before.ready),
            (),
            before.in_progress,
        )
        self.after(before, expected, "TakeWaiting")

    @invariant()
    def holds(self) -> None:
        state_invariant(self.core)


ChannelPoolSpec.TestCase.settings = SPEC_SETTINGS
TestChannelPoolSpec = ChannelPoolSpec.TestCase


# --- planted bugs: the test must notice --------------------------------------------------------


class ReadiesABusyChannel(ChannelPool[str, int]):
    """Work delivered to an in-progress channel also queues it as ready: a second worker
    could then run the same channel at once (the bug the partition exists to prevent)."""

    def deliver(self, channel: str, work: int) -> Partition:
        found = super().deliver(channel, work)
        if found is Partition.IN_PROGRESS:
            self.ready.append(channel)
        return found


class SleepsWithWork(ChannelPool[str, int]):
    """A channel whose item ends goes dormant even when more work waits: that work is stuck."""

    def end_work(self, channel: str) -> bool:
        if channel not in self.in_progress:
            raise ChannelStateError(f"channel {channel!r} is not in progress")
        del self.in_progress[channel]
        self.dormant[channel] = None
        return bool(self.pool[channel])


class CutsTheLine(ChannelPool[str, int]):
    """A channel with more work goes to the front of the ready queue, not the back: the state
    invariant holds, but other channels starve (EndWorkMoreToDo's post-state is wrong)."""

    def end_work(self, channel: str) -> bool:
        more = super().end_work(channel)
        if more:
            self.ready.appendleft(self.ready.pop())
        return more


def run_against(core: type[ChannelPool[str, int]]) -> None:
    machine = type(f"SpecOf{core.__name__}", (ChannelPoolSpec,), {"make_core": core})
    run_state_machine_as_test(machine, settings=PLANTED_SETTINGS)


def test_the_real_core_passes_the_planted_bug_settings() -> None:
    """The same run that must fail on the broken cores passes on the real one."""
    run_against(ChannelPool)


def test_planted_busy_channel_made_ready_breaks_the_state_invariant() -> None:
    """A channel both ready and in progress is found by the partition check."""
    with pytest.raises(AssertionError, match="state invariant: ready and in progress"):
        run_against(ReadiesABusyChannel)


def test_planted_dormant_channel_with_work_breaks_the_state_invariant() -> None:
    """A dormant channel holding work is found by the 'dormant channels have no work' check."""
    with pytest.raises(AssertionError, match="state invariant: dormant channels with work"):
        run_against(SleepsWithWork)


def test_planted_queue_jumping_breaks_end_work_more_to_do() -> None:
    """A channel re-queued at the front keeps the invariant but not the operation's schema."""
    with pytest.raises(AssertionError, match="EndWorkMoreToDo"):
        run_against(CutsTheLine)


# --- named scenarios ---------------------------------------------------------------------------


def test_a_channel_runs_its_items_one_at_a_time_in_order() -> None:
    """Two items of one channel: the second starts only after the first ended, never before."""
    core: ChannelPool[str, int] = ChannelPool()
    core.submit("a", 1)
    core.submit("a", 2)
    assert core.start_work() == ("a", 1)
    assert core.start_work() is None  # "a" is in progress: its second item waits
    assert core.finish("a") is True
    assert core.start_work() == ("a", 2)
    assert core.finish("a") is False
    assert core.pool == {} and core.partition_of("a") is None  # dormant, then forgotten


def test_a_channel_with_more_work_goes_behind_the_ready_ones() -> None:
    """Round robin: after its item, a busy channel queues behind channels already ready."""
    core: ChannelPool[str, int] = ChannelPool()
    for channel, work in (("a", 1), ("a", 2), ("b", 3), ("c", 4)):
        core.submit(channel, work)
    assert core.start_work() == ("a", 1)
    core.finish("a")
    assert [core.start_work() for _ in range(3)] == [("b", 3), ("c", 4), ("a", 2)]
