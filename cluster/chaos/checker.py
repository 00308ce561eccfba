"""Jepsen total-queue checker over a recorded history (see `cluster.chaos.history`).

Verdicts, with a message identified by its body id (`value`):
- lost: confirmed (publish ok) but never consumed;
- unexpected: delivered but never published (no publish invoke with that value);
- duplicated: delivered more than once without the redelivered flag;
- recovered: publish outcome not confirmed (unknown, or even failed), yet consumed;
- delivered after ack (a late delivery): delivered, with or without the redelivered flag, after
  an ack of it completed ok (`redelivered_after_ack`: those of them flagged redelivered).
A delivery counts as consumed when its ack completed ok or with an unknown outcome (the settle
may have been applied); a failed ack means the message went back and must come out again.
The run is valid when nothing is lost, nothing is unexpected and nothing came out again after a
confirmed ack (an ok settle removed the message: if it is delivered again, either that ack
settled something else or a node sent a delivery its state no longer held, issue 24);
duplicates are reported but, as in Jepsen, do not invalidate it (publisher dedup should keep
them at zero anyway).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cluster.chaos.history import Event, iter_ops


@dataclass(frozen=True, slots=True)
class Verdict:
    """The checker's result; lists hold body ids, sorted."""

    valid: bool
    attempted: int
    ok: int
    failed: int
    unknown: int
    delivered: int
    consumed: int
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    failed_but_consumed: list[str] = field(default_factory=list)
    redelivered_after_ack: list[str] = field(default_factory=list)
    delivered_after_ack: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with counts next to every list."""
        return {
            "valid": self.valid,
            "operations": {
                "attempted": self.attempted,
                "ok": self.ok,
                "failed": self.failed,
                "unknown": self.unknown,
            },
            "delivered": self.delivered,
            "consumed": self.consumed,
            "lost_count": len(self.lost),
            "unexpected_count": len(self.unexpected),
            "duplicated_count": len(self.duplicated),
            "recovered_count": len(self.recovered),
            "failed_but_consumed_count": len(self.failed_but_consumed),
            "redelivered_after_ack_count": len(self.redelivered_after_ack),
            "delivered_after_ack_count": len(self.delivered_after_ack),
            "lost": self.lost,
            "unexpected": self.unexpected,
            "duplicated": self.duplicated,
            "recovered": self.recovered,
            "failed_but_consumed": self.failed_but_consumed,
            "redelivered_after_ack": self.redelivered_after_ack,
            "delivered_after_ack": self.delivered_after_ack,
        }


@dataclass(slots=True)
class _Publishes:
    attempts: Counter[str] = field(default_factory=Counter)
    confirmed: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    unknown: int = 0


@dataclass(slots=True)
class _Consumption:
    delivered: Counter[str] = field(default_factory=Counter)
    fresh: Counter[str] = field(default_factory=Counter)
    consumed: Counter[str] = field(default_factory=Counter)
    redelivered_after_ack: set[str] = field(default_factory=set)
    delivered_after_ack: set[str] = field(default_factory=set)


def check(events: Iterable[Event]) -> Verdict:
    """Check a history with total-queue semantics and return the verdict."""
    history = list(events)
    publishes = _collect_publishes(history)
    consumption = _collect_consumption(history)
    attempts, consumed = publishes.attempts, consumption.consumed
    unexpected = sorted(v for v in consumption.delivered if v not in attempts)
    lost = sorted((publishes.confirmed - consumed).keys())
    recovered = sorted(v for v in consumed if v in attempts and v not in publishes.confirmed)
    duplicated = sorted(v for v, n in consumption.fresh.items() if n > 1)
    failed_but_consumed = sorted(v for v in recovered if v in publishes.failed)
    return Verdict(
        valid=not lost and not unexpected and not consumption.delivered_after_ack,
        attempted=sum(attempts.values()),
        ok=sum(publishes.confirmed.values()),
        failed=sum(publishes.failed.values()),
        unknown=publishes.unknown,
        delivered=sum(consumption.delivered.values()),
        consumed=sum(consumed.values()),
        lost=lost,
        unexpected=unexpected,
        duplicated=duplicated,
        recovered=recovered,
        failed_but_consumed=failed_but_consumed,
        redelivered_after_ack=sorted(consumption.redelivered_after_ack),
        delivered_after_ack=sorted(consumption.delivered_after_ack),
    )


def _collect_publishes(history: list[Event]) -> _Publishes:
    result = _Publishes()
    for invoke, completion in iter_ops(e for e in history if e.f == "publish"):
        if invoke.value is None:
            continue
        result.attempts[invoke.value] += 1
        outcome = completion.type if completion is not None else "info"
        if outcome == "ok":
            result.confirmed[invoke.value] += 1
        elif outcome == "fail":
            result.failed[invoke.value] += 1
        else:
            result.unknown += 1
    return result


def _collect_consumption(history: list[Event]) -> _Consumption:
    result = _Consumption()
    deliveries: dict[int, Event] = {}
    acked: set[str] = set()
    settled: set[int] = set()  # delivery ops with an ack that completed ok or unknown
    for event in history:
        if event.f == "deliver" and event.value is not None:
            deliveries[event.op] = event
            result.delivered[event.value] += 1
            if not event.redelivered:
                result.fresh[event.value] += 1
            if event.value in acked:
                # a settle was confirmed, yet the message came out again: that settle removed
                # another message (or none), or a node delivered what its state no longer held
                # (flagged redelivered or not: issue 24's late copies were not)
                result.delivered_after_ack.add(event.value)
                if event.redelivered:
                    result.redelivered_after_ack.add(event.value)
        elif event.f == "ack" and event.type == "ok" and event.value is not None:
            acked.add(event.value)
    for invoke, completion in iter_ops(e for e in history if e.f == "ack"):
        outcome = completion.type if completion is not None else "info"
        if invoke.delivery is not None and outcome in ("ok", "info"):
            settled.add(invoke.delivery)
    for op, delivery in deliveries.items():
        if op in settled and delivery.value is not None:
            result.consumed[delivery.value] += 1
    return result
