"""Availability metrics and the timeline over hand-made histories (no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.chaos.availability import (
    FaultWindow,
    Window,
    recovery,
    throughput,
    unavailable_windows,
    unexpected,
)
from cluster.chaos.history import Event, EventType
from cluster.chaos.timeline import plot_timeline

S = 1_000_000_000


def publish_at(op: int, t_s: float, outcome: EventType = "ok") -> list[Event]:
    """A publish invoked 10 ms before `t_s` that completes at `t_s`."""
    return [
        Event(op=op, type="invoke", f="publish", t_ns=int((t_s - 0.01) * S), value=f"v{op}"),
        Event(op=op, type=outcome, f="publish", t_ns=int(t_s * S), value=f"v{op}"),
    ]


def confirms(times: list[float]) -> list[Event]:
    events: list[Event] = []
    for op, t in enumerate(times):
        events += publish_at(op, t)
    return events


def test_gaps_between_confirms_longer_than_the_threshold_are_unavailable() -> None:
    """Confirms every 0.2 s except a 3 s hole: exactly that hole is reported."""
    times = [0.2 * i for i in range(1, 20)] + [6.8 + 0.2 * i for i in range(10)]
    windows = unavailable_windows(confirms(times), 0.0, 8.6, gap_s=1.0)
    assert len(windows) == 1
    assert abs(windows[0].start_s - 3.8) < 1e-6 and abs(windows[0].end_s - 6.8) < 1e-6


def test_no_confirm_until_the_end_counts_as_unavailable() -> None:
    """Producers stalled at the end of the workload: the tail is an unavailable window."""
    windows = unavailable_windows(confirms([0.5, 1.0]), 0.0, 5.0, gap_s=1.0)
    assert windows == [Window(1.0, 5.0)]


def test_recovery_is_measured_from_the_fault_start_to_the_end_of_its_stall() -> None:
    """A stall inside a fault gives recovery = stall end - fault start; none gives 0."""
    stall = [Window(10.5, 13.0)]
    assert recovery(FaultWindow("kill-leader", 10.0, 15.0), stall) == (3.0, 2.5)
    assert recovery(FaultWindow("pause", 30.0, 33.0), stall) == (0.0, 0.0)


def test_a_stall_that_starts_after_the_next_fault_starts_belongs_to_that_fault() -> None:
    """Two close faults: each gets its own stall, not the next one's."""
    stalls = [Window(5.0, 14.0), Window(16.9, 26.0)]  # the last confirm came just before 17
    first, second = FaultWindow("restart-all", 5.0, 12.0), FaultWindow("restart-all", 17.0, 24.0)
    assert recovery(first, stalls, grace_s=5.0, next_start_s=17.0) == (9.0, 9.0)
    assert recovery(second, stalls, grace_s=5.0) == pytest.approx((9.0, 9.1))


def test_stalls_away_from_every_fault_are_unexpected() -> None:
    """A stall that touches no fault window (nor its grace) is reported as unexpected."""
    faults = [FaultWindow("kill", 10.0, 15.0)]
    stalls = [Window(11.0, 12.0), Window(40.0, 42.0)]
    assert unexpected(stalls, faults, grace_s=5.0) == [Window(40.0, 42.0)]


def test_throughput_counts_each_outcome_in_its_second() -> None:
    """Per-second buckets count confirmed, failed/unknown publishes and settled acks."""
    events = publish_at(1, 0.5) + publish_at(2, 1.5) + publish_at(3, 1.7, "info")
    events.append(Event(op=9, type="ok", f="ack", t_ns=int(2.2 * S), value="v1"))
    series = throughput(events, end_s=3.0)
    assert series.published == [1, 1, 0, 0]
    assert series.not_ok == [0, 1, 0, 0]
    assert series.consumed == [0, 0, 1, 0]


def test_timeline_png_is_written(tmp_path: Path) -> None:
    """The timeline is a PNG file with the fault windows drawn."""
    series = throughput(confirms([0.2 * i for i in range(1, 40)]), end_s=8.0)
    path = plot_timeline(
        series,
        [FaultWindow("kill", 2.0, 4.0), FaultWindow("partition-leader", 5.0, 6.0)],
        [Window(2.5, 3.5)],
        tmp_path / "timeline.png",
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
