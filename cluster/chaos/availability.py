"""Availability over a history: throughput per second, unavailable windows, recovery per fault.

Unavailability is measured on confirmed publishes (what a producer cares about): a window is a
gap longer than `gap_s` between two consecutive publish confirms (over every producer), or
between the last confirm and the end of the workload. A fault's recovery time is how long after
its start the last such window overlapping it (or starting within `grace_s` after it) ended;
0 when producers never stalled. Windows that touch no fault are "unexpected" (OM-Chaos).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cluster.chaos.history import Event

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Window:
    """A time interval in seconds on the history clock."""

    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        """Duration of the window."""
        return self.end_s - self.start_s

    def overlaps(self, start_s: float, end_s: float) -> bool:
        """True when this window and [start_s, end_s] share some time."""
        return self.start_s <= end_s and start_s <= self.end_s

    def to_dict(self) -> dict[str, float]:
        """JSON-ready, rounded to milliseconds."""
        return {
            "start_s": round(self.start_s, 3),
            "end_s": round(self.end_s, 3),
            "length_s": round(self.length_s, 3),
        }


@dataclass(frozen=True, slots=True)
class Series:
    """Per-bucket counts for the timeline."""

    bucket_s: float
    published: list[int]
    consumed: list[int]
    not_ok: list[int]  # publishes that failed or ended unknown, by completion time

    def times(self) -> list[float]:
        """The start time of every bucket."""
        return [i * self.bucket_s for i in range(len(self.published))]


def throughput(events: Iterable[Event], end_s: float, bucket_s: float = 1.0) -> Series:
    """Confirmed publishes, settled acks and failed/unknown publishes per bucket."""
    buckets = int(end_s / bucket_s) + 1
    published, consumed, not_ok = [0] * buckets, [0] * buckets, [0] * buckets
    for event in events:
        index = min(buckets - 1, int(event.t_ns / NS_PER_S / bucket_s))
        if event.f == "publish" and event.type == "ok":
            published[index] += 1
        elif event.f == "publish" and event.type in ("fail", "info"):
            not_ok[index] += 1
        elif event.f == "ack" and event.type == "ok":
            consumed[index] += 1
    return Series(bucket_s, published, consumed, not_ok)


def unavailable_windows(
    events: Iterable[Event], start_s: float, end_s: float, gap_s: float = 1.0
) -> list[Window]:
    """Gaps longer than `gap_s` between publish confirms within [start_s, end_s]."""
    confirms = sorted(
        e.t_ns / NS_PER_S
        for e in events
        if e.f == "publish" and e.type == "ok" and start_s <= e.t_ns / NS_PER_S <= end_s
    )
    windows: list[Window] = []
    previous = start_s
    for t in [*confirms, end_s]:
        if t - previous > gap_s:
            windows.append(Window(previous, t))
        previous = t
    return windows


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """A fault's kind and interval (seconds), as the nemesis recorded it."""

    kind: str
    start_s: float
    end_s: float


def recovery(
    fault: FaultWindow,
    windows: Sequence[Window],
    grace_s: float = 5.0,
    next_start_s: float | None = None,
    slack_s: float = 1.0,
) -> tuple[float, float]:
    """(recovery time, total unavailable time) attributed to `fault`, in seconds.

    A window starts at the last confirm before a stall, a little before the fault that caused
    it: windows starting within `slack_s` of `next_start_s` (or later) belong to the next fault.
    """
    until_s = fault.end_s + grace_s if next_start_s is None else next_start_s - slack_s
    mine = [
        w
        for w in windows
        if w.overlaps(fault.start_s, fault.end_s + grace_s) and w.start_s < until_s
    ]
    if not mine:
        return 0.0, 0.0
    recovered_at = max(w.end_s for w in mine)
    return max(0.0, recovered_at - fault.start_s), sum(w.length_s for w in mine)


def unexpected(
    windows: Sequence[Window], faults: Sequence[FaultWindow], grace_s: float = 5.0
) -> list[Window]:
    """Unavailable windows that overlap no fault (nor its grace period)."""
    return [w for w in windows if not any(w.overlaps(f.start_s, f.end_s + grace_s) for f in faults)]
