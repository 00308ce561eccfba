"""raft.machine_clock: whose clock the machine follows (issue 31, item 1), in process.

Before machine version 4 the time is the largest wall clock seen (as it always was); from 4 it
moves only by the submitters' monotonic estimates, a hello's wall clock at most CLOCK_STEP_MS_MAX
forward; skews beyond the bound are counted once per episode.
"""

from __future__ import annotations

import types
from pathlib import Path

import cbor2
import pytest

import fifo
import raft.machine_clock
from fifo.commands import DeclareQueue
from raft.entry import Entry, decode_entry, encode_entry
from raft.machine_clock import (
    CLOCK_STEP_MS_MAX,
    ClockSteps,
    MachineClock,
    machine_time,
)
from raft.replicated import ReplicatedState

MEMBERS = ["n1", "n2", "n3"]
T0 = 1_790_000_000_000
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def cmds(ts: int, machine_ms: int | None, origin: tuple[str, int, int] = ("n2", 1, 1)) -> Entry:
    blob = fifo.encode(DeclareQueue("q"))
    return Entry("cmds", ts, origin, cmds=(blob,), machine_ms=machine_ms)


def hello(node: str, ts: int, machine_ms: int | None, version: int = 4) -> Entry:
    return Entry("hello", ts, (node, 2, 1), node=node, version=version, incarnation=2,
                 machine_ms=machine_ms)  # fmt: skip


def state_at(version: int) -> ReplicatedState:
    """Three members on machine `version`, at time T0."""
    rs = ReplicatedState(MEMBERS)
    index = 1
    for node in MEMBERS:
        rs.apply_entry(index, 1, hello(node, T0, None, version), supported=4)
        index += 1
    if version > 1:
        rs.apply_entry(index, 1, Entry("upgrade", T0, None, version=version), supported=4)
    assert rs.meta.effective_version == version and rs.meta.last_time_ms == T0
    return rs


def test_an_entry_carries_its_estimate_and_one_of_older_code_decodes_without_it() -> None:
    entry = cmds(T0, T0 - 5)
    assert decode_entry(encode_entry(entry)) == entry
    older = cbor2.dumps({"k": "cmds", "ts": T0, "o": ["n1", 1, 1], "c": []})
    assert decode_entry(older).machine_ms is None
    assert "m" not in cbor2.loads(encode_entry(cmds(T0, None)))  # as older code wrote it


@pytest.mark.parametrize("version", [1, 2, 3])
def test_before_version_4_the_time_is_the_largest_wall_clock_seen(version: int) -> None:
    """Versions 1-3 exactly as before: a wall clock a day ahead drags the time a day."""
    rs = state_at(version)
    outcome = rs.apply_entry(10, 1, cmds(T0 + DAY_MS, T0 + 100), supported=4)
    assert rs.meta.last_time_ms == T0 + DAY_MS == outcome.time_ms
    assert outcome.clock_skew_ms is None
    rs.apply_entry(11, 1, cmds(T0 + 500, T0 + 500), supported=4)
    assert rs.meta.last_time_ms == T0 + DAY_MS


def test_from_version_4_wall_clock_steps_either_way_move_nothing() -> None:
    """+1 day and -1 hour stamps: the time follows the estimates only; the skew is reported."""
    rs = state_at(4)
    ahead = rs.apply_entry(10, 1, cmds(T0 + DAY_MS, T0 + 100), supported=4)
    assert (ahead.time_ms, ahead.clock_skew_ms) == (T0 + 100, DAY_MS - 100)
    behind = rs.apply_entry(11, 1, cmds(T0 - HOUR_MS, T0 + 300), supported=4)
    assert (behind.time_ms, behind.clock_skew_ms) == (T0 + 300, -HOUR_MS - 300)
    stale = rs.apply_entry(12, 1, cmds(T0 + 200, T0 + 200), supported=4)  # a late estimate
    assert rs.meta.last_time_ms == T0 + 300 == stale.time_ms


def test_from_version_4_an_entry_without_an_estimate_applies_as_before() -> None:
    rs = state_at(4)
    outcome = rs.apply_entry(10, 1, cmds(T0 + 700, None), supported=4)
    assert (outcome.time_ms, outcome.clock_skew_ms) == (T0 + 700, None)


@pytest.mark.parametrize(
    ("wall_step_ms", "expected_step_ms"),
    [
        (CLOCK_STEP_MS_MAX, CLOCK_STEP_MS_MAX),  # a short outage: followed
        (CLOCK_STEP_MS_MAX + 1, 0),  # beyond the bound: rejected
        (DAY_MS, 0),
        (-HOUR_MS, 0),  # backwards: never
    ],
)
def test_a_hello_s_wall_clock_moves_the_time_forward_within_the_bound_only(
    wall_step_ms: int, expected_step_ms: int
) -> None:
    rs = state_at(4)
    rs.apply_entry(10, 1, hello("n2", T0 + wall_step_ms, T0), supported=4)
    assert rs.meta.last_time_ms == T0 + expected_step_ms


def test_the_rule_reads_nothing_but_the_entry() -> None:
    """Pure: the same entry after the same time gives the same time, in any process."""
    entry = hello("n1", T0 + 5000, T0 + 10)
    assert machine_time(T0, 4, entry) == machine_time(T0, 4, entry) == (T0 + 5000, 0)
    assert machine_time(0, 4, cmds(T0, 3)) == (T0, 0)  # no time yet: the wall clock sets it


def test_rejected_steps_are_counted_once_per_episode() -> None:
    steps = ClockSteps()
    for skew in (DAY_MS, DAY_MS, 5, DAY_MS):  # two episodes of n2 incarnation 1
        steps.observe(("n2", 1, 1), skew)
    steps.observe(("n2", 2, 1), -HOUR_MS)  # restarted, still wrong: a new episode
    steps.observe(("n1", 1, 1), CLOCK_STEP_MS_MAX)  # at the bound: fine
    steps.observe(("n3", 1, 1), None)  # not judged (older rule)
    steps.observe(None, DAY_MS)  # no submitter
    assert steps.rejected == {"n2": 3}


def test_entries_replayed_at_start_are_not_judged_again() -> None:
    """Replayed (not judged): only remembered; the episode still going on when the node is
    current counts once in this process."""
    steps = ClockSteps()
    for _ in range(3):
        steps.observe(("n2", 1, 1), DAY_MS, judge=False)
    assert steps.rejected == {}
    steps.observe(("n2", 1, 2), DAY_MS)
    steps.observe(("n2", 1, 3), DAY_MS)
    assert steps.rejected == {"n2": 1}


def test_after_a_whole_cluster_outage_only_the_first_node_back_counts_a_step() -> None:
    """Every clock an hour ahead of the paused machine time is no wrong clock: once the others
    agree nothing more is counted; a clock off from theirs still is."""
    steps = ClockSteps()
    for node in MEMBERS:
        steps.observe((node, 1, 1), 20)
    for node in MEMBERS:  # all restarted after an hour: their hellos an hour ahead
        steps.observe((node, 2, 1), HOUR_MS)
    assert steps.rejected == {"n1": 1}
    steps.observe(("n2", 2, 2), HOUR_MS + DAY_MS)  # then n2's clock steps a day
    steps.observe(("n1", 2, 2), HOUR_MS + 30)
    assert steps.rejected == {"n1": 1, "n2": 1}


def fake_time(monkeypatch: pytest.MonkeyPatch, wall_s: float, monotonic_s: float) -> list[float]:
    """raft.machine_clock's clocks replaced; returns [wall, monotonic] to move them."""
    now = [wall_s, monotonic_s]
    fake = types.SimpleNamespace(time=lambda: now[0], monotonic=lambda: now[1])
    monkeypatch.setattr(raft.machine_clock, "time", fake)
    return now


def test_the_estimate_moves_by_monotonic_time_only(monkeypatch: pytest.MonkeyPatch) -> None:
    now = fake_time(monkeypatch, T0 / 1000, 100.0)
    clock = MachineClock(offset_file="")
    assert clock.estimate_ms() == 0  # nothing applied: no estimate (moves no time)
    clock.applied(T0)
    now[0] += 86_400  # the wall clock steps a day
    now[1] += 2.5
    assert clock.stamp() == (T0 + DAY_MS, T0 + 2500)
    clock.applied(T0 - 1)  # an older time (a late outcome) never moves the estimate back
    assert clock.estimate_ms() == T0 + 2500
    clock.applied(T0 + 2000)  # nor one the time moved less than this clock did since
    assert clock.estimate_ms() == T0 + 2500
    clock.applied(T0 + 3000)
    now[1] += 1.0
    assert clock.estimate_ms() == T0 + 4000


def test_the_offset_file_shifts_the_wall_clock_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    now = fake_time(monkeypatch, T0 / 1000, 100.0)
    offset = tmp_path / "offset"
    clock = MachineClock(offset_file=str(offset))
    assert clock.wall_ms() == T0  # missing: 0
    offset.write_text(f"{DAY_MS}\n")
    now[1] += 0.2  # re-read after OFFSET_REREAD_S
    assert clock.wall_ms() == T0 + DAY_MS
    offset.write_text("garbage")
    now[1] += 0.2
    assert clock.wall_ms() == T0
