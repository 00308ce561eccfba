"""Checks of a consumer-group chaos history: total queue, double ownership, order, routing, dedup,
crash recovery.

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
- **Delivery after revoke** (double ownership, invalidates): member A receives a message of
  partition P after A saw P revoked (in the same membership, before it saw P assigned again),
  and another member had received that same message since the revoke: P was handed over with
  it, and A still got it.
- **Zombie overlaps** (reported only): the same overlap where A's ack failed or is unknown, or
  A never acked: A's messages were returned (its node or connection was considered down) while
  A was still alive and working on them. That is at-least-once delivery, not double ownership.
- **Order violations** (invalidates): on one partition, the first deliveries of the messages of
  one enqueuer come in an order other than their sequence numbers.
- **Total queue** (invalidates): the checks of `cluster.chaos.checker` over the same history:
  every confirmed publish consumed (`lost`), nothing delivered that was never published
  (`unexpected`).
- **Routing** (invalidates): a publish to the base name `Q` of a P-partition queue (its `queue`
  is Q, not a partition `Q.i`) with a partition `key` must be delivered from partition
  `Q.{partition_of(key, P)}`; one without a key from some partition `Q.0` .. `Q.{P-1}`. Every
  delivery of it counts. Checked when Q and P are given (`check_groups(h, queue=Q,
  partitions=P)`).
- **Per-key order** (invalidates): for two messages A and B of one key, when A's publish was
  confirmed (ok) before B's was first invoked, A was stored first on the key's one partition,
  so A's first delivery must come before B's. Real-time order, so it holds across producers
  and enqueuer generations; a publish never confirmed orders nothing after it.
- **Duplicates after dedup** (invalidates): a message (body id) delivered more than once
  without the redelivered flag was stored more than once. Every publish attempt of one body
  id carries the same (enqueuer, seq), including a producer's resends after an unknown outcome
  (`resends`: the attempts after the first), so publisher dedup must store it at most once;
  `resend_duplicated` are the duplicated ones that were resent.
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

from cluster.chaos.checker import check
from cluster.chaos.history import Event, iter_ops
from cluster.client.groups import partition_of

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
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    keyed_publishes: int = 0  # publish attempts to a base name with a key
    keyless_publishes: int = 0  # ... without one (round robin)
    resends: int = 0  # publish attempts of a body id after its first
    routing_violations: list[str] = field(default_factory=list)
    key_order_violations: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    resend_duplicated: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists capped; counts complete)."""
        recoveries = [c.recovery_s for c in self.crashes if c.recovery_s is not None]
        return {
            "valid": self.valid,
            "deliveries": self.deliveries,
            "double_ownership_count": len(self.double_ownership),
            "zombie_overlap_count": len(self.zombie_overlaps),
            "order_violation_count": len(self.order_violations),
            "lost_count": len(self.lost),
            "unexpected_count": len(self.unexpected),
            "keyed_publishes": self.keyed_publishes,
            "keyless_publishes": self.keyless_publishes,
            "resends": self.resends,
            "routing_violation_count": len(self.routing_violations),
            "key_order_violation_count": len(self.key_order_violations),
            "duplicated_count": len(self.duplicated),
            "resend_duplicated_count": len(self.resend_duplicated),
            "double_ownership": [o.to_dict() for o in self.double_ownership[:OVERLAPS_LISTED_MAX]],
            "zombie_overlaps": [o.to_dict() for o in self.zombie_overlaps[:OVERLAPS_LISTED_MAX]],
            "order_violations": self.order_violations[:OVERLAPS_LISTED_MAX],
            "lost": self.lost[:OVERLAPS_LISTED_MAX],
            "unexpected": self.unexpected[:OVERLAPS_LISTED_MAX],
            "routing_violations": self.routing_violations[:OVERLAPS_LISTED_MAX],
            "key_order_violations": self.key_order_violations[:OVERLAPS_LISTED_MAX],
            "duplicated": self.duplicated[:OVERLAPS_LISTED_MAX],
            "resend_duplicated": self.resend_duplicated[:OVERLAPS_LISTED_MAX],
            "crash_recovery": [c.to_dict() for c in self.crashes],
            "crash_recovery_max_s": round(max(recoveries), 3) if recoveries else None,
        }


def check_groups(
    events: Iterable[Event], queue: str | None = None, partitions: int | None = None
) -> GroupVerdict:
    """Check a consumer-group history (see the module docstring). `queue` and `partitions`: the
    base name and partition count of the partitioned queue (None: routing is not checked)."""
    history = list(events)
    total = check(history)
    holdings = holdings_of(history)
    double, zombie = overlaps(holdings)
    double = double + deliveries_after_revoke(history)
    order = order_violations(history)
    crashes = crash_recoveries(history)
    publishes = publishes_of(history)
    routing = routing_violations(history, publishes, queue, partitions)
    key_order = key_order_violations(history, publishes)
    duplicated = total.duplicated
    resent = sorted(v for v in duplicated if v in publishes and publishes[v].attempts > 1)
    base = [p for p in publishes.values() if p.queue == queue]
    broken = [double, order, total.lost, total.unexpected, routing, key_order, duplicated]
    return GroupVerdict(
        valid=not any(broken),
        deliveries=len(holdings),
        double_ownership=double,
        zombie_overlaps=zombie,
        order_violations=order,
        crashes=crashes,
        lost=total.lost,
        unexpected=total.unexpected,
        keyed_publishes=sum(p.attempts for p in base if p.key is not None),
        keyless_publishes=sum(p.attempts for p in base if p.key is None),
        resends=sum(p.attempts - 1 for p in publishes.values()),
        routing_violations=routing,
        key_order_violations=key_order,
        duplicated=duplicated,
        resend_duplicated=resent,
    )


@dataclass(slots=True)
class Published:
    """Every publish attempt of one body id, folded (a resend repeats queue, key, enqueuer, seq)."""

    value: str
    queue: str
    key: str | None
    first_invoke_ns: int
    first_ok_ns: float = math.inf  # the earliest ok completion (inf: never confirmed)
    attempts: int = 0


def publishes_of(history: list[Event]) -> dict[str, Published]:
    """Body id -> its publish attempts, from the publish operations."""
    out: dict[str, Published] = {}
    for invoke, completion in iter_ops(e for e in history if e.f == "publish"):
        if invoke.value is None or invoke.queue is None:
            continue
        published = out.get(invoke.value)
        if published is None:
            published = out[invoke.value] = Published(
                invoke.value, invoke.queue, invoke.key, invoke.t_ns
            )
        published.attempts += 1
        if completion is not None and completion.type == "ok":
            published.first_ok_ns = min(published.first_ok_ns, completion.t_ns)
    return out


def routing_violations(
    history: list[Event], publishes: dict[str, Published], queue: str | None, partitions: int | None
) -> list[str]:
    """Deliveries of publishes to the base name `queue` from a partition other than the key's
    (or, without a key, from no partition of `queue` at all), as readable lines."""
    if queue is None or partitions is None:
        return []
    out = []
    for event in history:
        if event.f != "deliver" or event.value is None or event.queue is None:
            continue
        published = publishes.get(event.value)
        if published is None or published.queue != queue:
            continue
        if published.key is not None:
            want = f"{published.queue}.{partition_of(published.key, partitions)}"
            if event.queue != want:
                out.append(
                    f"{event.value} (key {published.key!r}) delivered from {event.queue}, "
                    f"routed to {want}"
                )
        elif event.queue not in {f"{published.queue}.{i}" for i in range(partitions)}:
            out.append(
                f"{event.value} (no key) delivered from {event.queue}, not a partition of "
                f"{published.queue}"
            )
    return out


def key_order_violations(history: list[Event], publishes: dict[str, Published]) -> list[str]:
    """Per key, first deliveries against real-time publish order, as readable lines.

    Walking one key's first deliveries in order, the latest first publish invoke seen so far
    bounds what may still come: a message whose publish was confirmed before that invoke was
    stored earlier and should have come out earlier."""
    latest: dict[str, tuple[int, str]] = {}  # key -> (latest first invoke so far, its value)
    seen: set[str] = set()
    out = []
    for event in history:
        if event.f != "deliver" or event.value is None or event.value in seen:
            continue
        published = publishes.get(event.value)
        if published is None or published.key is None:
            continue
        seen.add(event.value)
        before = latest.get(published.key)
        if before is not None and published.first_ok_ns < before[0]:
            out.append(
                f"key {published.key!r}: {event.value} (confirmed at "
                f"{published.first_ok_ns / NS_PER_S:.3f} s) first delivered after {before[1]} "
                f"(first published at {before[0] / NS_PER_S:.3f} s)"
            )
        if before is None or published.first_invoke_ns > before[0]:
            latest[published.key] = (published.first_invoke_ns, event.value)
    return out


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


def deliveries_after_revoke(history: list[Event]) -> list[Overlap]:
    """Deliveries to a member of a message of a partition it saw revoked, when that message
    had been delivered to another member since the revoke: the partition was handed over
    with the message, and the old owner still got it (issue 24's c107). A new assign of the
    partition to the member, or a new membership of it (another consumer tag), ends the revoke.
    """
    revoked: dict[tuple[str, str], tuple[int, str | None]] = {}  # (member, P) -> (t, tag)
    tag_of: dict[str, str | None] = {}  # member -> consumer tag of its latest delivery
    given: dict[str, list[tuple[str, int]]] = defaultdict(list)  # value -> (member, t)
    out: list[Overlap] = []
    for event in history:
        if event.queue is None:
            continue
        key = (event.process, event.queue)
        if event.f == "revoked":
            revoked[key] = (event.t_ns, tag_of.get(event.process))
        elif event.f == "assigned":
            revoked.pop(key, None)
        elif event.f == "deliver" and event.value is not None:
            tag_of[event.process] = event.detail
            since = revoked.get(key)
            if since is not None and since[1] == event.detail:
                others = [m for m, t in given[event.value] if m != event.process and t >= since[0]]
                if others:
                    out.append(
                        Overlap(event.queue, others[-1], event.value, event.process, event.value,
                                event.t_ns / NS_PER_S)
                    )  # fmt: skip
            given[event.value].append((event.process, event.t_ns))
    return out


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
