"""raft/sim's checkers and fault schedules, on hand-written histories and schedules."""

from __future__ import annotations

import random

import pytest

from raft.sim.checkers import check_queue
from raft.sim.faults import Fault, FaultSyntaxError, encode_faults, generate_faults, parse_faults
from raft.sim.workload import Event


def _ev(client: str, kind: str, f: str, value: str, again: bool = False) -> Event:
    return (0.0, client, kind, f, value, again)


def test_a_confirmed_message_never_consumed_is_lost() -> None:
    history = [_ev("p", "invoke", "enqueue", "a"), _ev("p", "ok", "enqueue", "a")]
    verdict = check_queue(history)
    assert verdict.lost == ["a"] and not verdict.valid


def test_a_consumed_message_with_an_ok_ack_is_valid() -> None:
    history = [
        _ev("p", "invoke", "enqueue", "a"),
        _ev("p", "ok", "enqueue", "a"),
        _ev("c", "ok", "dequeue", "a"),
        _ev("c", "ok", "ack", "a"),
    ]
    assert check_queue(history).valid


def test_a_message_redelivered_after_an_ok_ack_is_invalid() -> None:
    history = [
        _ev("p", "invoke", "enqueue", "a"),
        _ev("p", "ok", "enqueue", "a"),
        _ev("c", "ok", "dequeue", "a"),
        _ev("c", "ok", "ack", "a"),
        _ev("drain", "ok", "drain", "a", again=True),
    ]
    verdict = check_queue(history)
    assert verdict.redelivered_after_ack == ["a"] and not verdict.valid


def test_a_message_never_published_is_unexpected() -> None:
    verdict = check_queue([_ev("drain", "ok", "drain", "zz")])
    assert verdict.unexpected == ["zz"] and not verdict.valid


def test_an_unknown_ack_counts_as_consumed() -> None:
    history = [
        _ev("p", "invoke", "enqueue", "a"),
        _ev("p", "ok", "enqueue", "a"),
        _ev("c", "ok", "dequeue", "a"),
        _ev("c", "info", "ack", "a"),
    ]
    assert check_queue(history).valid


def test_a_schedule_round_trips_through_its_text() -> None:
    faults = generate_faults(random.Random(3), ["n1", "n2", "n3"], 30.0)
    assert faults and parse_faults(encode_faults(faults)) == faults


def test_a_schedule_names_its_ops() -> None:
    assert parse_faults("1.50:crash:n2/power,3:heal:") == [
        Fault(1.5, "crash", ("n2", "power")),
        Fault(3.0, "heal"),
    ]
    with pytest.raises(FaultSyntaxError):
        parse_faults("1.0:explode:n1")
