"""The total-queue checker on hand-made histories: one test per verdict, then combinations."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.chaos.checker import check
from cluster.chaos.history import Event, EventType, Recorder, read_history, write_history


class Script:
    """Builds a history by hand, with op ids allocated like the recorder does."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._op = 0

    def _next(self) -> int:
        self._op += 1
        return self._op

    def publish(self, value: str, outcome: EventType | None = "ok") -> None:
        """A publish of `value`; outcome None leaves it without completion."""
        op = self._next()
        self.events.append(Event(op=op, type="invoke", f="publish", value=value, queue="q"))
        if outcome is not None:
            self.events.append(Event(op=op, type=outcome, f="publish", value=value))

    def consume(self, value: str, redelivered: bool = False, ack: EventType | None = "ok") -> None:
        """A delivery of `value`, then its ack with `ack` as outcome (None: no completion)."""
        delivery = self._next()
        self.events.append(
            Event(op=delivery, type="ok", f="deliver", value=value, redelivered=redelivered)
        )
        op = self._next()
        self.events.append(Event(op=op, type="invoke", f="ack", value=value, delivery=delivery))
        if ack is not None:
            self.events.append(Event(op=op, type=ack, f="ack", value=value))

    def deliver_only(self, value: str, redelivered: bool = False) -> None:
        """A delivery never acked (the consumer stopped before settling it)."""
        op = self._next()
        self.events.append(
            Event(op=op, type="ok", f="deliver", value=value, redelivered=redelivered)
        )


def test_clean_history_is_valid_with_nothing_to_report() -> None:
    """Every confirmed message consumed once: valid, every verdict empty."""
    s = Script()
    for v in ("a", "b", "c"):
        s.publish(v)
    for v in ("b", "a", "c"):
        s.consume(v)
    verdict = check(s.events)
    assert verdict.valid
    assert (verdict.attempted, verdict.ok, verdict.failed, verdict.unknown) == (3, 3, 0, 0)
    assert verdict.lost == verdict.unexpected == verdict.duplicated == verdict.recovered == []
    assert verdict.consumed == 3


def test_confirmed_but_never_consumed_is_lost() -> None:
    """A confirmed publish that never comes out is lost and invalidates the run."""
    s = Script()
    s.publish("a")
    s.publish("b")
    s.consume("a")
    verdict = check(s.events)
    assert verdict.lost == ["b"]
    assert not verdict.valid


def test_consumed_but_never_published_is_unexpected() -> None:
    """A delivery of a body nobody tried to publish is unexpected and invalidates the run."""
    s = Script()
    s.publish("a")
    s.consume("a")
    s.consume("ghost")
    verdict = check(s.events)
    assert verdict.unexpected == ["ghost"]
    assert verdict.lost == []
    assert not verdict.valid


def test_two_fresh_deliveries_are_duplicated_but_still_valid() -> None:
    """Consumed twice without the redelivered flag (the first ack's outcome unknown):
    duplicated, yet valid (as in Jepsen)."""
    s = Script()
    s.publish("a")
    s.consume("a", ack="info")
    s.consume("a")
    verdict = check(s.events)
    assert verdict.duplicated == ["a"]
    assert verdict.valid


def test_a_fresh_delivery_after_a_confirmed_ack_is_late_and_invalidates_the_run() -> None:
    """Issue 24: delivered again without the redelivered flag after an ack of it completed ok
    (a node sent what its state no longer held): a late delivery, the run is invalid."""
    s = Script()
    s.publish("a")
    s.consume("a")
    s.consume("a", ack="fail")
    verdict = check(s.events)
    assert verdict.delivered_after_ack == ["a"]
    assert verdict.redelivered_after_ack == []
    assert verdict.to_dict()["delivered_after_ack_count"] == 1
    assert not verdict.valid


def test_redelivery_with_the_flag_is_not_a_duplicate() -> None:
    """A nacked message delivered again with the redelivered flag is no duplicate."""
    s = Script()
    s.publish("a")
    s.consume("a", ack="fail")
    s.consume("a", redelivered=True)
    verdict = check(s.events)
    assert verdict.duplicated == []
    assert verdict.valid
    assert verdict.redelivered_after_ack == []


def test_unknown_publish_that_comes_out_is_recovered() -> None:
    """A publish with an info outcome (or none at all) that is consumed counts as recovered."""
    s = Script()
    s.publish("a", outcome="info")
    s.publish("b", outcome=None)
    s.publish("c", outcome="info")
    s.consume("a")
    s.consume("b")
    verdict = check(s.events)
    assert verdict.recovered == ["a", "b"]
    assert verdict.unknown == 3
    assert verdict.lost == []  # c was never confirmed, so it may be absent
    assert verdict.valid


def test_failed_publish_that_comes_out_is_recovered_and_flagged() -> None:
    """A failed publish that is consumed is recovered (Jepsen) and listed for a closer look."""
    s = Script()
    s.publish("a", outcome="fail")
    s.publish("b", outcome="fail")
    s.consume("a")
    verdict = check(s.events)
    assert verdict.failed == 2
    assert verdict.recovered == ["a"]
    assert verdict.failed_but_consumed == ["a"]
    assert verdict.valid


def test_delivery_with_failed_ack_does_not_count_as_consumed() -> None:
    """A delivery whose ack definitely failed went back to the queue: if it never returns, lost."""
    s = Script()
    s.publish("a")
    s.consume("a", ack="fail")
    verdict = check(s.events)
    assert verdict.lost == ["a"]
    assert verdict.consumed == 0


def test_delivery_never_acked_does_not_count_as_consumed() -> None:
    """A delivery without any ack is not consumed: the message is still in the queue."""
    s = Script()
    s.publish("a")
    s.deliver_only("a")
    verdict = check(s.events)
    assert verdict.lost == ["a"]
    assert verdict.delivered == 1


def test_ack_with_unknown_outcome_counts_as_consumed() -> None:
    """An ack that timed out may have settled the message, so it is not reported lost."""
    s = Script()
    s.publish("a")
    s.publish("b")
    s.consume("a", ack="info")
    s.consume("b", ack=None)
    verdict = check(s.events)
    assert verdict.lost == []
    assert verdict.consumed == 2


def test_redelivery_after_a_confirmed_ack_invalidates_the_run() -> None:
    """A message redelivered after its settle was confirmed ok makes the run invalid."""
    s = Script()
    s.publish("a")
    s.consume("a")
    s.consume("a", redelivered=True)
    verdict = check(s.events)
    assert verdict.redelivered_after_ack == verdict.delivered_after_ack == ["a"]
    assert verdict.duplicated == []
    assert not verdict.valid


def test_redelivery_after_an_unknown_or_failed_ack_is_fine() -> None:
    """Only an ack that completed ok promises the message is gone."""
    s = Script()
    s.publish("a")
    s.consume("a", ack="info")
    s.consume("a", redelivered=True)
    s.publish("b")
    s.consume("b", ack="fail")
    s.consume("b", redelivered=True)
    verdict = check(s.events)
    assert verdict.redelivered_after_ack == []
    assert verdict.valid


def test_lost_unexpected_duplicated_and_recovered_together() -> None:
    """Every verdict in one history, each attributed to the right message."""
    s = Script()
    s.publish("ok1")
    s.publish("lost1")
    s.publish("dup1")
    s.publish("unk1", outcome="info")
    s.publish("unk2", outcome="info")
    s.consume("ok1")
    s.consume("dup1")
    s.consume("dup1")
    s.consume("unk1")
    s.consume("ghost")
    verdict = check(s.events)
    assert verdict.lost == ["lost1"]
    assert verdict.unexpected == ["ghost"]
    assert verdict.duplicated == ["dup1"]
    assert verdict.recovered == ["unk1"]
    assert (verdict.attempted, verdict.ok, verdict.unknown) == (5, 3, 2)
    assert not verdict.valid
    report = verdict.to_dict()
    assert report["lost_count"] == 1 and report["unexpected_count"] == 1
    assert report["duplicated_count"] == 1 and report["recovered_count"] == 1


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    """A recorded history written to disk reads back equal, and checks the same."""
    path = tmp_path / "history.jsonl"
    recorder = Recorder(path)
    op = recorder.invoke("publish", "producer-0", queue="q", value="a", enqueuer="e", seq=1)
    recorder.complete(op, "ok", "publish", "producer-0", value="a")
    delivery = recorder.observe("deliver", "consumer-0", value="a", redelivered=False)
    ack = recorder.invoke("ack", "consumer-0", value="a", delivery=delivery)
    recorder.complete(ack, "ok", "ack", "consumer-0", value="a")
    recorder.close()
    events = read_history(path)
    assert events == recorder.events()
    assert [e.t_ns for e in events] == sorted(e.t_ns for e in events)
    assert check(events).valid and check(events).consumed == 1
    copy = tmp_path / "copy.jsonl"
    write_history(copy, events)
    assert read_history(copy) == events


@pytest.mark.parametrize(
    "line",
    ["[1, 2]", '{"op": 1, "type": "maybe", "f": "publish"}', '{"type": "ok", "f": "ack"}'],
)
def test_malformed_history_lines_are_refused(line: str) -> None:
    """A line that is not an event raises ValueError instead of being silently skipped."""
    with pytest.raises(ValueError):
        Event.from_json(line)
