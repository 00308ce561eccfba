"""The consumer-group checks on hand-made histories: double ownership, zombies, order, recovery,
and for publishes to a partitioned queue's base name: lost / unexpected, routing by key,
per-key order, duplicates after dedup (each check catches its planted violation)."""

from __future__ import annotations

from pathlib import Path

from cluster.chaos.groups import check_groups
from cluster.chaos.history import Event, EventType, Function, read_history, write_history
from cluster.client.groups import partition_of

NS = 1_000_000_000


class GroupScript:
    """Builds a group history by hand, with an explicit clock (seconds)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._op = 0

    def _event(self, at_s: float, f: Function, type_: EventType = "ok", **fields: object) -> int:
        self._op += 1
        self.events.append(Event(op=self._op, type=type_, f=f, t_ns=int(at_s * NS), **fields))  # type: ignore[arg-type]
        return self._op

    def publish(
        self,
        at_s: float,
        value: str,
        seq: int,
        enqueuer: str = "e1",
        *,
        queue: str | None = None,
        key: str | None = None,
        outcome: EventType | None = "ok",
        took_s: float = 0.0,
    ) -> None:
        """A publish of `value` as `seq` of `enqueuer` (to `queue`, with partition `key`),
        completed with `outcome` (None: never) `took_s` after it was invoked."""
        op = self._event(
            at_s, "publish", "invoke", value=value, enqueuer=enqueuer, seq=seq, queue=queue, key=key
        )
        if outcome is not None:
            t_ns = int((at_s + took_s) * NS)
            self.events.append(Event(op=op, type=outcome, f="publish", t_ns=t_ns, value=value))

    def deliver(
        self, at_s: float, member: str, partition: str, value: str, redelivered: bool = False
    ) -> int:
        """A delivery observed by `member`; returns its op."""
        return self._event(
            at_s, "deliver", process=member, queue=partition, value=value, redelivered=redelivered
        )

    def ack(
        self, at_s: float, member: str, delivery: int, outcome: EventType | None = "ok"
    ) -> None:
        """The ack of `delivery` invoked at `at_s`, completed (if at all) a little later."""
        op = self._event(at_s, "ack", "invoke", process=member, delivery=delivery)
        if outcome is not None:
            self.events.append(
                Event(op=op, type=outcome, f="ack", t_ns=int((at_s + 0.01) * NS), process=member)
            )

    def notice(self, at_s: float, member: str, kind: Function, partition: str) -> None:
        """An assigned / revoked notice seen by `member`."""
        self._event(at_s, kind, process=member, queue=partition)

    def crash(self, at_s: float, member: str) -> None:
        """The harness killed `member`."""
        self._event(at_s, "crash", process=member)


def test_a_clean_hand_over_after_a_crash_is_valid_and_its_recovery_time_is_measured() -> None:
    """A settles, crashes; B gets the partition 1.5 s later: no overlap, recovery 1.5 s."""
    s = GroupScript()
    s.publish(0.1, "m1", 1)
    s.publish(0.2, "m2", 2)
    s.ack(1.1, "A", s.deliver(1.0, "A", "orders.0", "m1"))
    s.crash(2.0, "A")
    s.ack(3.6, "B", s.deliver(3.5, "B", "orders.0", "m2"))
    verdict = check_groups(s.events)
    assert verdict.valid and verdict.deliveries == 2
    assert verdict.double_ownership == verdict.zombie_overlaps == []
    [crash] = verdict.crashes
    assert (crash.member, crash.partitions, crash.recovery_s) == ("A", ("orders.0",), 1.5)


def test_a_delivery_to_another_member_while_an_ok_settled_one_is_held_is_double_ownership() -> None:
    """A holds m1 of orders.0 when B gets m2 of orders.0, and A's later settle is accepted."""
    s = GroupScript()
    first = s.deliver(1.0, "A", "orders.0", "m1")
    s.ack(1.6, "B", s.deliver(1.5, "B", "orders.0", "m2"))
    s.ack(2.0, "A", first)
    verdict = check_groups(s.events)
    assert not verdict.valid
    [overlap] = verdict.double_ownership
    assert (overlap.partition, overlap.earlier, overlap.later) == ("orders.0", "A", "B")
    assert verdict.to_dict()["double_ownership_count"] == 1


def test_a_settle_invoked_before_the_other_delivery_is_no_overlap() -> None:
    """A invoked its ack before B's delivery: its settle may have applied first."""
    s = GroupScript()
    first = s.deliver(1.0, "A", "orders.0", "m1")
    s.ack(1.4, "A", first)
    s.deliver(1.5, "B", "orders.0", "m2")
    assert check_groups(s.events).double_ownership == []


def test_an_overlap_whose_settle_was_refused_is_a_zombie_not_double_ownership() -> None:
    """A was fenced (its messages returned): its late ack fails, the run stays valid (B's
    settle consumes m1)."""
    s = GroupScript()
    s.publish(0.1, "m1", 1)
    first = s.deliver(1.0, "A", "orders.0", "m1")
    s.ack(1.6, "B", s.deliver(1.5, "B", "orders.0", "m1", redelivered=True))
    s.ack(2.0, "A", first, outcome="fail")
    verdict = check_groups(s.events)
    assert verdict.valid and len(verdict.zombie_overlaps) == 1 and verdict.double_ownership == []


def test_an_unacked_delivery_is_held_until_the_member_crashes() -> None:
    """Never acked: held to the crash. B's delivery before the crash is a zombie overlap,
    after it is none."""
    s = GroupScript()
    s.deliver(1.0, "A", "orders.0", "m1")
    s.deliver(1.5, "B", "orders.0", "m1")
    s.crash(2.0, "A")
    s.deliver(2.5, "C", "orders.0", "m1")
    verdict = check_groups(s.events)
    assert [(o.earlier, o.later) for o in verdict.zombie_overlaps] == [("A", "B"), ("B", "C")]


def test_the_same_member_or_another_partition_never_overlaps() -> None:
    """Several deliveries to one member, or to two members on different partitions: fine."""
    s = GroupScript()
    for seq, value in enumerate(("m1", "m2", "m3"), start=1):
        s.publish(0.1 * seq, value, seq)
    s.ack(1.05, "A", s.deliver(1.0, "A", "orders.0", "m1"))
    s.ack(1.15, "A", s.deliver(1.1, "A", "orders.0", "m2"))
    s.ack(1.25, "B", s.deliver(1.2, "B", "orders.1", "m3"))
    verdict = check_groups(s.events)
    assert verdict.valid and verdict.zombie_overlaps == [] and verdict.double_ownership == []


def test_first_deliveries_out_of_sequence_on_a_partition_are_order_violations() -> None:
    """Seq 2 before seq 1 of one enqueuer on one partition invalidates; a redelivery of an
    earlier message after a later one does not, nor do two enqueuers interleaving."""
    s = GroupScript()
    for seq, value in enumerate(("m1", "m2", "m3"), start=1):
        s.publish(0.1 * seq, value, seq)
    s.publish(0.5, "x1", 1, enqueuer="e2")
    s.deliver(1.0, "A", "orders.0", "m1")
    s.deliver(1.1, "A", "orders.0", "x1")
    s.deliver(1.2, "A", "orders.0", "m2")
    s.deliver(1.3, "B", "orders.0", "m1")  # a redelivery: not a first delivery
    assert check_groups(s.events).order_violations == []
    s.deliver(1.4, "B", "orders.1", "m3")  # another partition: its own order
    assert check_groups(s.events).order_violations == []
    s.publish(1.5, "m4", 4)
    s.publish(1.6, "m5", 5)
    s.deliver(1.7, "B", "orders.0", "m5")
    s.deliver(1.8, "B", "orders.0", "m4")
    verdict = check_groups(s.events)
    assert not verdict.valid and len(verdict.order_violations) == 1
    assert "m4 (seq 4) first delivered after m5 (seq 5)" in verdict.order_violations[0]


def test_recovery_uses_the_notices_and_lists_partitions_never_consumed_again() -> None:
    """A owned orders.0 and orders.2 (orders.1 revoked before): orders.0 came back after 0.5 s,
    orders.2 never did, so there is no recovery time; orders.1 is not waited for."""
    s = GroupScript()
    for partition in ("orders.0", "orders.1", "orders.2"):
        s.notice(0.1, "A", "assigned", partition)
    s.notice(0.5, "A", "revoked", "orders.1")
    s.crash(1.0, "A")
    s.deliver(1.5, "B", "orders.0", "m1")
    [crash] = check_groups(s.events).crashes
    assert crash.partitions == ("orders.0", "orders.2")
    assert crash.recovery_s is None and crash.unrecovered == ("orders.2",)
    s.deliver(2.0, "C", "orders.2", "m2")
    [crash] = check_groups(s.events).crashes
    assert crash.recovery_s == 1.0 and crash.unrecovered == ()


def test_group_events_round_trip_through_a_history_file(tmp_path: Path) -> None:
    """The new functions (join, leave, crash, assigned, revoked) are valid history lines."""
    s = GroupScript()
    for kind in ("join", "leave", "crash", "assigned", "revoked"):
        s._event(1.0, kind, process="A", queue="orders.0", detail="g")
    path = tmp_path / "history.jsonl"
    write_history(path, s.events)
    assert read_history(path) == s.events


# --- publishes to the base name of a partitioned queue: total queue, routing, key order, dedup

P = 4


def _part(key: str) -> str:
    """The partition of `orders` that `key` routes to."""
    return f"orders.{partition_of(key, P)}"


def _other_part(key: str) -> str:
    """A partition of `orders` that `key` does not route to."""
    return f"orders.{(partition_of(key, P) + 1) % P}"


def _routed() -> GroupScript:
    """A valid history: two producers publish keyed (k1, k2) and keyless messages to `orders`;
    member A consumes and settles each from the partition the machine routed it to."""
    s = GroupScript()
    s.publish(0.1, "a1", 1, "e1", queue="orders", key="k1", took_s=0.05)
    s.publish(0.2, "b1", 1, "e2", queue="orders", key="k1", took_s=0.05)
    s.publish(0.3, "a2", 2, "e1", queue="orders", key="k2", took_s=0.05)
    s.publish(0.4, "b2", 2, "e2", queue="orders", took_s=0.05)  # round robin
    s.ack(1.05, "A", s.deliver(1.0, "A", _part("k1"), "a1"))
    s.ack(1.15, "A", s.deliver(1.1, "A", _part("k1"), "b1"))
    s.ack(1.25, "A", s.deliver(1.2, "A", _part("k2"), "a2"))
    s.ack(1.35, "A", s.deliver(1.3, "A", "orders.3", "b2"))
    return s


def test_a_routed_history_is_valid_and_counts_keyed_keyless_and_resends() -> None:
    """Every check passes; the report counts the publishes to the base name."""
    verdict = check_groups(_routed().events, queue="orders", partitions=P)
    assert verdict.valid, verdict
    report = verdict.to_dict()
    assert (report["keyed_publishes"], report["keyless_publishes"], report["resends"]) == (3, 1, 0)
    for name in ("routing_violation", "key_order_violation", "duplicated", "resend_duplicated"):
        assert report[f"{name}_count"] == 0
    assert report["lost_count"] == report["unexpected_count"] == 0


def test_a_keyed_message_delivered_from_another_partition_is_a_routing_violation() -> None:
    """k1's message comes out of a partition k1 does not map to: invalid; without the queue
    and partition count the routing is not checked."""
    s = _routed()
    s.publish(2.0, "a3", 3, "e1", queue="orders", key="k1")
    s.ack(2.15, "A", s.deliver(2.1, "A", _other_part("k1"), "a3"))
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert not verdict.valid
    [line] = verdict.routing_violations
    assert line.startswith("a3 (key 'k1') delivered from") and _part("k1") in line
    assert verdict.to_dict()["routing_violation_count"] == 1
    assert check_groups(s.events).routing_violations == []


def test_a_keyless_message_delivered_from_outside_the_partitions_is_a_routing_violation() -> None:
    """Round robin may pick any partition of `orders`, never another queue."""
    s = _routed()
    s.publish(2.0, "b3", 3, "e2", queue="orders")
    s.ack(2.15, "A", s.deliver(2.1, "A", f"orders.{P}", "b3"))
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert not verdict.valid
    assert verdict.routing_violations == [f"b3 (no key) delivered from orders.{P}, not a "
                                          "partition of orders"]  # fmt: skip


def test_a_confirmed_message_never_consumed_is_lost_and_one_never_published_unexpected() -> None:
    """A confirmed publish whose only ack failed is lost; a delivery nobody published is
    unexpected; either invalidates."""
    s = _routed()
    s.publish(2.0, "a3", 3, "e1", queue="orders", key="k2")
    s.ack(2.15, "A", s.deliver(2.1, "A", _part("k2"), "a3"), outcome="fail")
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert not verdict.valid and verdict.lost == ["a3"] and verdict.unexpected == []
    s = _routed()
    s.ack(2.15, "A", s.deliver(2.1, "A", "orders.0", "ghost"))
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert not verdict.valid and verdict.unexpected == ["ghost"] and verdict.lost == []
    assert verdict.to_dict()["unexpected_count"] == 1


def test_a_key_delivered_against_real_time_publish_order_is_a_key_order_violation() -> None:
    """a3 (producer e1) was confirmed before b3 (producer e2) was published, both with key k1:
    b3 coming out first breaks the key's order, even across enqueuers."""
    s = _routed()
    s.publish(2.0, "a3", 3, "e1", queue="orders", key="k1", took_s=0.1)
    s.publish(2.5, "b3", 3, "e2", queue="orders", key="k1", took_s=0.1)
    s.ack(3.05, "B", s.deliver(3.0, "B", _part("k1"), "b3"))
    s.ack(3.15, "B", s.deliver(3.1, "B", _part("k1"), "a3"))
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert not verdict.valid and verdict.order_violations == []  # per enqueuer all is fine
    [line] = verdict.key_order_violations
    assert line.startswith("key 'k1': a3 (confirmed at 2.100 s) first delivered after b3")
    assert verdict.to_dict()["key_order_violation_count"] == 1


def test_concurrent_unconfirmed_or_other_key_publishes_order_nothing() -> None:
    """No violation when the publishes overlapped (b3 invoked before a3 was confirmed), when
    the earlier one was never confirmed, or when the keys differ; a redelivery of an earlier
    message after a later one is not a first delivery."""
    cases: tuple[tuple[EventType, float, str], ...] = (
        ("ok", 1.0, "k1"),  # a3 confirmed at 3.0, after b3 was invoked at 2.5: concurrent
        ("info", 0.1, "k1"),  # a3 unknown: it may have been stored at any time
        ("ok", 0.1, "k2"),  # another key: another order
    )
    for a3_outcome, took_s, b3_key in cases:
        s = _routed()
        s.publish(2.0, "a3", 3, "e1", queue="orders", key="k1", outcome=a3_outcome, took_s=took_s)
        s.publish(2.5, "b3", 3, "e2", queue="orders", key=b3_key, took_s=0.1)
        s.ack(3.05, "B", s.deliver(3.0, "B", _part(b3_key), "b3"))
        s.ack(3.15, "B", s.deliver(3.1, "B", _part("k1"), "a3"))
        s.ack(3.25, "C", s.deliver(3.2, "C", _part("k1"), "a1", redelivered=True))
        verdict = check_groups(s.events, queue="orders", partitions=P)
        assert verdict.key_order_violations == [], (a3_outcome, took_s, b3_key)
        assert verdict.valid, verdict


def test_a_resend_after_an_unknown_outcome_stored_twice_is_a_duplicate() -> None:
    """b3's publish timed out and the producer resent it (same enqueuer and seq): two fresh
    deliveries mean dedup stored it twice, invalid; one fresh and one flagged redelivery is
    what dedup promises."""
    s = _routed()
    s.publish(2.0, "b3", 3, "e2", queue="orders", outcome="info", took_s=5.0)
    s.publish(7.1, "b3", 3, "e2", queue="orders", took_s=0.1)  # the resend: confirmed
    s.ack(8.05, "A", s.deliver(8.0, "A", "orders.0", "b3"))
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert verdict.valid and verdict.resends == 1 and verdict.keyless_publishes == 3
    s.ack(8.15, "B", s.deliver(8.1, "B", "orders.1", "b3", redelivered=True))
    assert check_groups(s.events, queue="orders", partitions=P).valid
    s.ack(8.25, "B", s.deliver(8.2, "B", "orders.1", "b3"))  # a second stored copy
    verdict = check_groups(s.events, queue="orders", partitions=P)
    assert not verdict.valid
    assert verdict.duplicated == verdict.resend_duplicated == ["b3"]
    report = verdict.to_dict()
    assert report["duplicated_count"] == report["resend_duplicated_count"] == 1


def test_base_name_publishes_round_trip_with_their_key(tmp_path: Path) -> None:
    """The `key` field of a publish survives the history file; a keyless one has none."""
    s = _routed()
    path = tmp_path / "history.jsonl"
    write_history(path, s.events)
    events = read_history(path)
    assert events == s.events
    assert [e.key for e in events if e.f == "publish" and e.type == "invoke"] == [
        "k1", "k1", "k2", None,
    ]  # fmt: skip


def test_a_delivery_after_a_revoke_once_the_partition_was_handed_over_is_double_ownership() -> None:
    """Issue 24 (c107): A sees P revoked, B gets m1 of P and acks it, then A gets m1 too (its
    node caught up late): double ownership, invalid."""
    s = GroupScript()
    s.publish(0.1, "m1", 1)
    s.publish(0.2, "m2", 2)
    s.notice(0.5, "A", "assigned", "P")
    s.ack(0.7, "A", s.deliver(0.6, "A", "P", "m2"))
    s.notice(1.0, "A", "revoked", "P")
    s.notice(1.1, "B", "assigned", "P")
    s.ack(1.3, "B", s.deliver(1.2, "B", "P", "m1"))
    s.ack(1.5, "A", s.deliver(1.4, "A", "P", "m1"), outcome="fail")  # late, its ack refused
    verdict = check_groups(s.events)
    assert [(o.earlier, o.later, o.later_value) for o in verdict.double_ownership] == [
        ("B", "A", "m1")
    ]
    assert not verdict.valid


def test_a_revoked_member_getting_a_message_nobody_else_got_or_as_a_new_membership_is_fine() -> (
    None
):
    """A still settling what it held when P was revoked (nobody else got that message), A
    assigned P again, or A back as a new membership (another consumer tag): no overlap."""
    s = GroupScript()
    for seq, value in enumerate(("m1", "m2", "m3", "m4"), start=1):
        s.publish(0.1 * seq, value, seq)
    s.notice(0.5, "A", "revoked", "P")
    s.ack(0.7, "A", s.deliver(0.6, "A", "P", "m1"))
    s.ack(0.9, "B", s.deliver(0.8, "B", "P", "m2"))
    s.notice(1.0, "A", "assigned", "P")
    s.ack(1.2, "A", s.deliver(1.1, "A", "P", "m3"))
    s.notice(1.3, "A", "revoked", "P")
    s.ack(1.5, "B", s.deliver(1.4, "B", "P", "m4"), outcome="fail")
    rejoined = s._event(
        1.6, "deliver", process="A", queue="P", value="m4", detail="A.2", redelivered=True
    )
    s.ack(1.7, "A", rejoined)
    verdict = check_groups(s.events)
    assert verdict.double_ownership == []
    assert verdict.valid
