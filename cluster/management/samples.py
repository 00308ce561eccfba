"""The samples the UI charts: every SAMPLE_PERIOD_S, each queue's depth and the node's counters.

A ring buffer per queue (and one for the totals) keeps the last hour (SAMPLES_KEPT). Counters
are those `/metrics` exports (the node's `NodeMetrics`): published, delivered, acked, returned,
rejected (this node's clients) and dead-lettered (applied here). Rates are differences between
consecutive samples over their interval, so every rate the UI shows can be checked against two
`/metrics` scrapes. The tracker of consumer groups records each change of assignment (what moved
from whom to whom) as this node applied it, the last REBALANCES_KEPT per group.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fifo
from cluster.node.metrics import NodeMetrics, NoMetrics
from raft.replica import Replica, ReplicaView

SAMPLE_PERIOD_S = 5.0
SAMPLES_KEPT = 720  # an hour at SAMPLE_PERIOD_S
QUEUES_SAMPLED_MAX = 200  # past it, new queues have no chart (their depth still counts in totals)
GROUPS_TRACKED_MAX = 100
REBALANCES_KEPT = 20
COUNTERS = ("published", "delivered", "acked", "returned", "rejected", "dead_lettered")
GAUGES = ("ready", "unacked", "total", "bytes")
RATES = {
    "published": "publish_rate",
    "delivered": "deliver_rate",
    "acked": "ack_rate",
    "returned": "return_rate",
    "rejected": "reject_rate",
    "dead_lettered": "dead_letter_rate",
}
TOTALS = ""  # the ring of the sums over all queues
Sample = tuple[int, ...]  # (time ms, *GAUGES, *COUNTERS)


def queue_counters(metrics: NoMetrics) -> dict[str, dict[str, int]]:
    """The counters of `metrics` per queue label, as `/metrics` exports them (sums over the
    dead-lettering reasons); empty when the node counts nothing."""
    if not isinstance(metrics, NodeMetrics):
        return {}
    found: dict[str, dict[str, int]] = {}
    for name in COUNTERS:
        for family in getattr(metrics, name).collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    row = found.setdefault(sample.labels["queue"], dict.fromkeys(COUNTERS, 0))
                    row[name] += int(sample.value)
    return found


def queue_gauges(view: ReplicaView) -> dict[str, tuple[int, int, int, int]]:
    """(ready incl. returned, unacked, total, bytes) of every queue, as `/metrics` has them."""
    out = {}
    for name in fifo.list_queues(view.state):
        o = fifo.overview(view.state, name)
        if o is not None:
            out[name] = (o.ready + o.returned, o.checked_out, o.total, o.bytes)
    return out


@dataclass(slots=True)
class GroupTrack:
    """What the tracker last saw of one consumer group, and the moves it recorded."""

    epoch: int
    assignment: dict[str, str | None]
    rebalances: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REBALANCES_KEPT))


class Sampler:
    """Takes the samples (call `tick` often; it samples when due) and answers series."""

    def __init__(
        self,
        replica: Callable[[], Replica],
        metrics: NoMetrics,
        period_s: float = SAMPLE_PERIOD_S,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._replica = replica
        self._wall_ms = wall_ms  # the time stamped on samples (the UI's time axis)
        self._metrics = metrics
        self.period_s = period_s
        self._rings: dict[str, deque[Sample]] = {}
        self._last_sample = -1e9
        self._previous: tuple[int, dict[str, dict[str, int]]] | None = None
        self.groups: dict[str, GroupTrack] = {}

    def tick(self) -> None:
        """Track consumer groups now; take a sample when SAMPLE_PERIOD_S has passed."""
        self._track_groups()
        now = time.monotonic()
        if now - self._last_sample >= self.period_s:
            self._last_sample = now
            self.sample()

    def sample(self) -> None:
        """Append one sample per queue (and one of the totals) to the rings."""
        now_ms = self._wall_ms()
        gauges = self._replica().read(queue_gauges)
        counters = queue_counters(self._metrics)
        totals = [0] * (len(GAUGES) + len(COUNTERS))
        for name in sorted(set(gauges) | set(counters)):
            row = (*gauges.get(name, (0, 0, 0, 0)), *_counter_row(counters.get(name)))
            totals = [a + b for a, b in zip(totals, row, strict=True)]
            ring = self._rings.get(name)
            if ring is None:
                if name not in gauges or len(self._rings) > QUEUES_SAMPLED_MAX:
                    continue
                ring = self._rings[name] = self._new_ring(name)
            ring.append((now_ms, *row))
        self._rings.setdefault(TOTALS, deque(maxlen=SAMPLES_KEPT)).append((now_ms, *totals))
        for gone in [name for name in self._rings if name != TOTALS and name not in gauges]:
            del self._rings[gone]  # a deleted queue: its chart goes with it
        self._previous = (now_ms, counters)

    def _new_ring(self, name: str) -> deque[Sample]:
        """A ring for a queue first seen now, starting with the previous sample's counters (the
        queue did not exist then): what was published since shows as a rate at once."""
        ring: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        if self._previous is not None:
            before_ms, counters = self._previous
            ring.append((before_ms, *(0,) * len(GAUGES), *_counter_row(counters.get(name))))
        return ring

    def series(self, queue: str = TOTALS, last: int = SAMPLES_KEPT) -> dict[str, Any]:
        """The last `last` samples of `queue` (TOTALS: all queues): time, gauges, rates/s."""
        ring = list(self._rings.get(queue, ()))[-max(1, last) :]
        out: dict[str, Any] = {"period_s": self.period_s, "t": [s[0] for s in ring]}
        for i, name in enumerate(GAUGES, start=1):
            out[name] = [s[i] for s in ring]
        for i, name in enumerate(COUNTERS, start=1 + len(GAUGES)):
            out[name] = [s[i] for s in ring]
            out[RATES[name]] = [None] + [
                _rate(before[i], after[i], before[0], after[0])
                for before, after in itertools.pairwise(ring)
            ]
        return out

    def latest_rates(self, queue: str = TOTALS) -> dict[str, float | None]:
        """The rates between the last two samples of `queue` (None before two samples)."""
        found = self.series(queue, 2)
        return {rate: found[rate][-1] if len(found["t"]) == 2 else None for rate in RATES.values()}

    def _track_groups(self) -> None:
        assignments = self._replica().read(_group_assignments)
        now_ms = self._wall_ms()
        for name, (epoch, assignment) in assignments.items():
            track = self.groups.get(name)
            if track is None:
                if len(self.groups) < GROUPS_TRACKED_MAX:
                    self.groups[name] = GroupTrack(epoch, assignment)
                continue
            if assignment != track.assignment:
                moved = [
                    {"partition": p, "from": track.assignment.get(p), "to": member}
                    for p, member in assignment.items()
                    if track.assignment.get(p) != member
                ]
                track.rebalances.appendleft({"at_ms": now_ms, "epoch": epoch, "moved": moved})
            track.epoch, track.assignment = epoch, assignment
        for gone in [name for name in self.groups if name not in assignments]:
            del self.groups[gone]


def _group_assignments(view: ReplicaView) -> dict[str, tuple[int, dict[str, str | None]]]:
    if fifo.state_version(view.state) < 3:
        return {}
    out = {}
    for overview in fifo.consumer_groups(view.state)[:GROUPS_TRACKED_MAX]:
        info = fifo.consumer_group(view.state, overview.group)
        if info is not None:
            out[overview.group] = (
                overview.epoch,
                {p.partition: p.member for p in info.partitions},
            )
    return out


def _counter_row(counters: dict[str, int] | None) -> tuple[int, ...]:
    if counters is None:
        return (0,) * len(COUNTERS)
    return tuple(counters[name] for name in COUNTERS)


def _rate(before: int, after: int, before_ms: int, after_ms: int) -> float:
    seconds = max(0.001, (after_ms - before_ms) / 1000)
    return round(max(0, after - before) / seconds, 3)
