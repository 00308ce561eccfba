"""The consumer-group checks on hand-made histories: double ownership, zombies, order, recovery."""

from __future__ import annotations

from pathlib import Path

from cluster.chaos.groups import check_groups
from cluster.chaos.history import Event, EventType, Function, read_history, write_history

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

    def publish(self, at_s: float, value: str, seq: int, enqueuer: str = "e1") -> None:
        """A confirmed publish of `value` as `seq` of `enqueuer`."""
        op = self._event(at_s, "publish", "invoke", value=value, enqueuer=enqueuer, seq=seq)
        self.events.append(Event(op=op, type="ok", f="publish", t_ns=int(at_s * NS), value=value))

    def deliver(self, at_s: float, member: str, partition: str, value: str) -> int:
        """A delivery observed by `member`; returns its op."""
        return self._event(at_s, "deliver", process=member, queue=partition, value=value)

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
    """A was fenced (its messages returned): its late ack fails, the run stays valid."""
    s = GroupScript()
    first = s.deliver(1.0, "A", "orders.0", "m1")
    s.deliver(1.5, "B", "orders.0", "m1")
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
    s.deliver(1.0, "A", "orders.0", "m1")
    s.deliver(1.1, "A", "orders.0", "m2")
    s.deliver(1.2, "B", "orders.1", "m3")
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
