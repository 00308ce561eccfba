"""The report's aggregates, computed by the replay tasks while they write the rows.

Each replay task folds the rows it writes into a `Facts` (totals, outcomes, consumer totals, the
rates series in plot buckets, the ack-latency histogram and exact latency distributions as
value -> count maps); the driver merges the tasks' `Facts` and turns them into the report's
numbers. This replaces a second pass of Spark SQL jobs over the written Parquet tables; the
results are the same as that SQL's (tests/pipeline/test_pipeline_aggregate.py checks them
against Spark over the written tables): `percentile` is Spark's exact `percentile` (linear
interpolation between the closest ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OUTCOMES = ("acked", "dead_lettered", "discarded", "expired", "dropped")
MESSAGE_SUMS = ("returns", "timeouts", "consumer_gone", "modified")
RATE_SUMS = ("published", "delivered", "acked", "returned", "dead_lettered")
PERCENTILES = ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms"))


@dataclass(frozen=True, slots=True)
class Buckets:
    """Plot buckets of `bucket` seconds starting at epoch second `lo`."""

    lo: int
    bucket: int

    def of(self, second: int) -> int:
        return (second - self.lo) // self.bucket * self.bucket + self.lo


@dataclass(slots=True)
class Facts:
    """Partial aggregates of some rows; `merge` adds another task's."""

    buckets: Buckets
    totals: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, int] = field(default_factory=dict)
    series: dict[int, list[int]] = field(default_factory=dict)
    histogram: dict[int, int] = field(default_factory=dict)
    # (queue, measure) -> {latency ms: count}
    latency: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)

    def add_message(self, row: dict[str, Any]) -> None:
        totals = self.totals
        totals["messages"] = totals.get("messages", 0) + 1
        if row["source"] == "publish":
            totals["published"] = totals.get("published", 0) + 1
        totals["deliveries"] = totals.get("deliveries", 0) + row["delivery_count"]
        for name in MESSAGE_SUMS:
            totals[name] = totals.get(name, 0) + row[name]
        outcome = row["outcome"] or "queued"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        enqueued = row["enqueue_ms"]
        if enqueued is None:
            return
        if row["first_delivery_ms"] is not None:
            self._latency(row["queue"], "first_delivery", row["first_delivery_ms"] - enqueued)
        if outcome == "acked" and row["settle_ms"] is not None:
            waited = row["settle_ms"] - enqueued
            self._latency(row["queue"], "ack", waited)
            if waited >= 0:  # floor(log2(waited + 1)), exactly
                bin_ = (waited + 1).bit_length() - 1
                self.histogram[bin_] = self.histogram.get(bin_, 0) + 1

    def _latency(self, queue: str, measure: str, ms: int) -> None:
        values = self.latency.setdefault((queue, measure), {})
        values[ms] = values.get(ms, 0) + 1

    def add_rate(self, row: dict[str, Any]) -> None:
        t = self.buckets.of(row["second"])
        slot = self.series.get(t)
        if slot is None:
            slot = self.series[t] = [0] * len(RATE_SUMS) + [row["ready"], row["checked_out"]]
        else:
            slot[-2] = max(slot[-2], row["ready"])
            slot[-1] = max(slot[-1], row["checked_out"])
        for i, name in enumerate(RATE_SUMS):
            slot[i] += row[name]

    def add_consumer(self, row: dict[str, Any]) -> None:
        c = self.consumers
        c["consumers"] = c.get("consumers", 0) + 1
        c["timeouts"] = c.get("timeouts", 0) + row["timeouts"]
        c["handovers"] = c.get("handovers", 0) + row["handovers_in"]
        c["sac_activations"] = c.get("sac_activations", 0) + row["sac_activations"]

    def merge(self, other: Facts) -> None:
        for mine, theirs in (
            (self.totals, other.totals),
            (self.outcomes, other.outcomes),
            (self.consumers, other.consumers),
        ):
            for name, value in theirs.items():
                mine[name] = mine.get(name, 0) + value
        for bin_, count in other.histogram.items():
            self.histogram[bin_] = self.histogram.get(bin_, 0) + count
        for t, slot in other.series.items():
            own = self.series.get(t)
            if own is None:
                self.series[t] = list(slot)
                continue
            for i in range(len(RATE_SUMS)):
                own[i] += slot[i]
            own[-2], own[-1] = max(own[-2], slot[-2]), max(own[-1], slot[-1])
        for key, values in other.latency.items():
            mine_values = self.latency.setdefault(key, {})
            for ms, count in values.items():
                mine_values[ms] = mine_values.get(ms, 0) + count

    def latency_rows(self) -> list[dict[str, Any]]:
        """LATENCY_SCHEMA rows: per queue and measure, and over every queue (`*`)."""
        every: dict[tuple[str, str], dict[int, int]] = {}
        for (_, measure), values in self.latency.items():
            merged = every.setdefault(("*", measure), {})
            for ms, count in values.items():
                merged[ms] = merged.get(ms, 0) + count
        rows = []
        for (queue, measure), values in sorted({**self.latency, **every}.items()):
            ordered = sorted(values.items())
            row: dict[str, Any] = {"queue": queue, "measure": measure}
            row["count"] = sum(values.values())
            for p, name in PERCENTILES:
                row[name] = percentile(ordered, p)
            row["max_ms"] = ordered[-1][0] if ordered else None
            rows.append(row)
        return rows

    def report(self) -> dict[str, Any]:
        """The report's facts (without the latency rows and the bucket size)."""
        totals = {k: self.totals.get(k, 0) for k in ("messages", "published", "deliveries",
                                                      *MESSAGE_SUMS)}  # fmt: skip
        outcomes = {name: self.outcomes.get(name, 0) for name in (*OUTCOMES, "queued")}
        consumers = {k: self.consumers.get(k, 0) for k in ("consumers", "timeouts", "handovers",
                                                           "sac_activations")}  # fmt: skip
        series = [
            {"t": t, **dict(zip(RATE_SUMS, slot, strict=False)), "ready_max": slot[-2],
             "checked_out_max": slot[-1]}
            for t, slot in sorted(self.series.items())
        ]  # fmt: skip
        return {
            "outcomes": outcomes,
            "totals": totals,
            "consumers": consumers,
            "series": series,
            "ack_histogram": sorted(self.histogram.items()),
        }


def percentile(ordered: list[tuple[int, int]], p: float) -> float | None:
    """Spark's exact `percentile` of (value, count) pairs sorted by value: the value at rank
    p * (n - 1), linearly interpolated between the two closest ranks (in Spark 4's order of
    operations, so the doubles are equal); None when empty."""
    n = sum(count for _, count in ordered)
    if n == 0:
        return None
    position = p * (n - 1)
    lower, higher = int(position // 1), -int(-position // 1)
    low_value = high_value = None
    seen = 0
    for value, count in ordered:
        seen += count
        if low_value is None and seen > lower:
            low_value = value
        if seen > higher:
            high_value = value
            break
    assert low_value is not None and high_value is not None
    if lower == higher or low_value == high_value:
        return float(low_value)
    return low_value + (position - lower) * (high_value - low_value)
