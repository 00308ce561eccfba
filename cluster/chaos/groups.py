"""Checks of a consumer-group chaos history: double ownership, per-partition order, crash recovery.

The history is the harness's (`cluster.chaos.history`); for groups, `deliver` and `ack` events
carry the partition queue (`queue`, e.g. "orders.3") and the member (`process`), and the group
workload adds `join` / `leave` operations, single `crash` observations (the harness killed a
member) and `assigned` / `revoked` notices (a member saw one; `queue` is the partition).

- **Holding.** A member holds a delivery from its `deliver` event until it invokes the ack (the
  earliest the settle can apply), or until the member crashed or left if it never acked, or to
  the end of the history.
- **Double ownership** (invalidates the run): member B receives a delivery of partition P while
  another member A holds a delivery of P whose ack later completed ok. The machine hands P to B
  only after A's checked-out messages of P are settled or returned, and a settle from a fenced
  member is refused: an ok settle after B's delivery means A still had it checked out then.
- **Zombie overlaps** (reported only): the same overlap where A's ack failed or is unknown, or
  A never acked: A's messages were returned (its node or connection was considered down) while
  A was still alive and working on them. That is at-least-once delivery, not double ownership.
- **Order violations** (invalidates): on one partition, the first deliveries of the messages of
  one enqueuer come in an order other than their sequence numbers.
- **Recovery after a crash**: for each `crash` of member X at t, the partitions X owned (its
  assigned-but-not-revoked notices, or, without notices, the partitions whose latest delivery
  before t went to X); `recovery_s` is the time from t until every one of them was delivered
  to another member again (None for a partition never delivered again: listed `unrecovered`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cluster.chaos.history import Event, iter_ops

NS_PER_S = 1_000_000_000
OVERLAPS_LISTED_MAX = 50  # the report lists this many overlaps of each kind (all are counted)


@dataclass(frozen=True, slots=True)
class Holding:
    """One delivery, the member that held it and for how long (ns on the history clock)."""

    partition: str
    member: str
    value: str
    start_ns: int
    end_ns: float  # math.inf: held to the end of the history
    acked_ok: bool


@dataclass(frozen=True, slots=True)
class Overlap:
    """Member `later` got a delivery of `partition` while `earlier` held one."""

    partition: str
    earlier: str
    earlier_value: str
    later: str
    later_value: str
    at_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "partition": self.partition, "earlier": self.earlier,
            "earlier_value": self.earlier_value, "later": self.later,
            "later_value": self.later_value, "at_s": round(self.at_s, 3),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class CrashRecovery:
    """How long the partitions of one crashed member went without a consumer."""

    member: str
    at_s: float
    partitions: tuple[str, ...]
    recovery_s: float | None
    unrecovered: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "member": self.member, "at_s": round(self.at_s, 3),
            "partitions": list(self.partitions),
            "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 3),
            "unrecovered": list(self.unrecovered),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class GroupVerdict:
    """The group checks' result."""

    valid: bool
    deliveries: int
    double_ownership: list[Overlap] = field(default_factory=list)
    zombie_overlaps: list[Overlap] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    crashes: list[CrashRecovery] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists capped; counts complete)."""
        recoveries = [c.recovery_s for c in self.crashes if c.recovery_s is not None]
        return {
            "valid": self.valid,
            "deliveries": self.deliveries,
            "double_ownership_count": len(self.double_ownership),
            "zombie_overlap_count": len(self.zombie_overlaps),
            "order_violation_count": len(self.order_violations),
            "double_ownership": [o.to_dict() for o in self.double_ownership[:OVERLAPS_LISTED_MAX]],
            "zombie_overlaps": [o.to_dict() for o in self.zombie_overlaps[:OVERLAPS_LISTED_MAX]],
            "order_violations": self.order_violations[:OVERLAPS_LISTED_MAX],
            "crash_recovery": [c.to_dict() for c in self.crashes],
            "crash_recovery_max_s": round(max(recoveries), 3) if recoveries else None,
        }


def check_groups(events: Iterable[Event]) -> GroupVerdict:
    """Check a consumer-group history (see the module docstring)."""
    history = list(events)
    holdings = holdings_of(history)
    double, zombie = overlaps(holdings)
    order = order_violations(history)
    crashes = crash_recoveries(history)
    return GroupVerdict(
        valid=not double and not order,
        deliveries=len(holdings),
        double_ownership=double,
        zombie_overlaps=zombie,
        order_violations=order,
        crashes=crashes,
    )


def _member_ends(history: list[Event]) -> dict[str, list[int]]:
    """Times at which each member ended (crash observed, or a leave invoked)."""
    ends: dict[str, list[int]] = defaultdict(list)
    for event in history:
        if event.f == "crash" or (event.f == "leave" and event.type == "invoke"):
            ends[event.process].append(event.t_ns)
    return ends


def holdings_of(history: list[Event]) -> list[Holding]:
    """Every delivery with its holding interval, in delivery order."""
    acks: dict[int, tuple[int, bool]] = {}  # delivery op -> (ack invoke time, completed ok)
    for invoke, completion in iter_ops(e for e in history if e.f == "ack"):
        if invoke.delivery is not None:
            ok = completion is not None and completion.type == "ok"
            acks[invoke.delivery] = (invoke.t_ns, ok)
    ends = _member_ends(history)
    out = []
    for event in history:
        if event.f != "deliver" or event.queue is None or event.value is None:
            continue
        ack = acks.get(event.op)
        if ack is not None:
            end: float = ack[0]
        else:
            later = [t for t in ends.get(event.process, ()) if t >= event.t_ns]
            end = min(later) if later else math.inf
        out.append(
            Holding(
                event.queue, event.process, event.value, event.t_ns, end,
                acked_ok=ack is not None and ack[1],
            )
        )  # fmt: skip
    return out


def overlaps(holdings: list[Holding]) -> tuple[list[Overlap], list[Overlap]]:
    """(double ownership, zombie overlaps): a delivery to one member while another holds one."""
    double: list[Overlap] = []
    zombie: list[Overlap] = []
    held: dict[str, list[Holding]] = defaultdict(list)  # partition -> holdings still open
    for holding in holdings:  # in delivery (time) order
        still = [h for h in held[holding.partition] if h.end_ns > holding.start_ns]
        for other in still:
            if other.member == holding.member:
                continue
            overlap = Overlap(
                holding.partition, other.member, other.value, holding.member, holding.value,
                holding.start_ns / NS_PER_S,
            )  # fmt: skip
            (double if other.acked_ok else zombie).append(overlap)
        still.append(holding)
        held[holding.partition] = still
    return double, zombie


def order_violations(history: list[Event]) -> list[str]:
    """Per partition and enqueuer, first deliveries out of sequence order, as readable lines."""
    published: dict[str, tuple[str, int]] = {}
    for event in history:
        if (
            event.f == "publish" and event.type == "invoke" and event.value is not None
            and event.enqueuer is not None and event.seq is not None
        ):  # fmt: skip
            published[event.value] = (event.enqueuer, event.seq)
    seen: set[str] = set()
    last: dict[tuple[str, str], tuple[int, str]] = {}
    out = []
    for event in history:
        if event.f != "deliver" or event.value is None or event.queue is None:
            continue
        if event.value in seen or event.value not in published:
            continue
        seen.add(event.value)
        enqueuer, seq = published[event.value]
        key = (event.queue, enqueuer)
        before = last.get(key)
        if before is not None and before[0] > seq:
            out.append(
                f"{event.queue}: {event.value} (seq {seq}) first delivered after "
                f"{before[1]} (seq {before[0]}) of enqueuer {enqueuer}"
            )
        if before is None or before[0] < seq:
            last[key] = (seq, event.value)
    return out


def _owned_at(history: list[Event], member: str, t_ns: int) -> list[str]:
    """The partitions `member` owned at `t_ns`: its notices, or else its latest deliveries."""
    notices = [
        e for e in history
        if e.process == member and e.f in ("assigned", "revoked") and e.t_ns <= t_ns
    ]  # fmt: skip
    if notices:
        owned: dict[str, bool] = {}
        for notice in notices:
            if notice.queue is not None:
                owned[notice.queue] = notice.f == "assigned"
        return sorted(partition for partition, yes in owned.items() if yes)
    latest: dict[str, str] = {}
    for event in history:
        if event.t_ns > t_ns:
            break
        if event.f == "deliver" and event.queue is not None:
            latest[event.queue] = event.process
    return sorted(partition for partition, holder in latest.items() if holder == member)


def crash_recoveries(history: list[Event]) -> list[CrashRecovery]:
    """For each member crash: the time until its partitions were delivered to others again."""
    out = []
    for crash in (e for e in history if e.f == "crash"):
        partitions = _owned_at(history, crash.process, crash.t_ns)
        waits: dict[str, float] = {}
        for event in history:
            if (
                event.f == "deliver" and event.t_ns > crash.t_ns and event.queue in partitions
                and event.process != crash.process and event.queue not in waits
            ):  # fmt: skip
                waits[event.queue] = (event.t_ns - crash.t_ns) / NS_PER_S
        unrecovered = tuple(p for p in partitions if p not in waits)
        recovery = None if unrecovered or not partitions else max(waits.values())
        out.append(
            CrashRecovery(
                crash.process, crash.t_ns / NS_PER_S, tuple(partitions),
                0.0 if not partitions else recovery, unrecovered,
            )
        )  # fmt: skip
    return out
