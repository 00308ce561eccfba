"""The node's periodic pass shares the raft ticker's loop wake-up (cluster.node.pacing), and an
unchanged status.json is not rewritten (issue 25 item 3: an idle leader's CPU)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cluster.node.memory import StatmReader, resident_bytes
from cluster.node.pacing import EARLY_S, LATE_S, Repeating, next_pass_at
from cluster.node.server import NodeServer

PERIOD_S = 0.1


@pytest.mark.parametrize(
    ("raft_timer_in", "expected_in"),
    [
        (None, PERIOD_S),  # no raft timer armed: the pass keeps its period
        (PERIOD_S + 0.0007, PERIOD_S + 0.0007),  # an idle leader's next heartbeat
        (PERIOD_S - EARLY_S, PERIOD_S - EARLY_S),  # the window's edges
        (PERIOD_S + LATE_S, PERIOD_S + LATE_S),
        (PERIOD_S - EARLY_S - 0.001, PERIOD_S),  # too soon (a busy leader's 50 ms)
        (PERIOD_S + LATE_S + 0.001, PERIOD_S),  # too late (a follower's election deadline)
    ],
)
def test_the_pass_moves_onto_the_raft_timer_only_within_its_window(
    raft_timer_in: float | None, expected_in: float
) -> None:
    now = 1000.0
    timer_at = None if raft_timer_in is None else now + raft_timer_in
    assert next_pass_at(now, PERIOD_S, timer_at) == pytest.approx(now + expected_in)


def _selects(raft_in: float, aligned: bool) -> tuple[list[float | None], list[str]]:
    """The selector waits of a loop running one raft timer (`raft_in` from now) and the first
    pass of a Repeating told of it (`aligned`) or not, until both ran."""
    loop = asyncio.new_event_loop()
    selector: Any = loop._selector  # type: ignore[attr-defined]
    real_select = selector.select
    waits: list[float | None] = []

    def counting(timeout: float | None = None) -> Any:
        waits.append(timeout)
        return real_select(timeout)

    selector.select = counting
    fired: list[str] = []

    def done(what: str) -> None:
        fired.append(what)
        if len(fired) == 2:
            loop.stop()

    def one_pass() -> bool:
        done("pass")
        return False

    raft_at = loop.time() + raft_in
    loop.call_at(raft_at, done, "raft")
    late: list[float] = []
    periodic = Repeating(
        loop, PERIOD_S, lambda: raft_at if aligned else None, one_pass, late.append
    )
    periodic.start()
    try:
        loop.run_forever()
    finally:
        loop.close()
    assert len(late) == 1 and late[0] >= 0
    return waits, fired


def test_a_pass_on_the_raft_timer_costs_no_wake_up_and_no_loop_iteration_of_its_own() -> None:
    """Counted, not timed: a pass moved onto the raft ticker's timer runs in the iteration that
    timer's wake-up brought (one selector wait in all); on its own timer 45 ms away it costs a
    second wake-up (and, as a coroutine resumed by a future, it cost a further iteration)."""
    waits, fired = _selects(PERIOD_S + LATE_S - 0.005, aligned=True)
    assert fired == ["raft", "pass"]  # the pass after the timer: it sees the next one
    assert len(waits) == 1, waits
    waits, fired = _selects(PERIOD_S + LATE_S - 0.005, aligned=False)
    assert fired == ["pass", "raft"]
    assert len(waits) >= 2, waits  # (one only if the first wake-up came 45 ms late)


def test_passes_go_on_after_an_exception_and_stop_when_told() -> None:
    loop = asyncio.new_event_loop()
    outcomes: list[object] = [RuntimeError("planted"), True, False]

    def step() -> bool:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is False:
            loop.call_later(0.05, loop.stop)  # a pass would have come by then
        return bool(outcome)

    periodic = Repeating(loop, 0.001, lambda: None, step, lambda _late: None)
    periodic.start()
    loop.call_later(30, loop.stop)  # (a bound: the passes stop it long before)
    try:
        loop.run_forever()
    finally:
        loop.close()
    assert outcomes == [] and periodic.passes == 3  # and none after the False


def test_an_unchanged_status_is_not_rewritten(tmp_path: Path) -> None:
    """status.json (temporary file, write, rename) is written when its text changed only."""
    status = {"role": "leader", "term": 1}
    node = SimpleNamespace(
        node_dir=tmp_path,
        _status_written="",
        status_extra=lambda: {"id": "n1"},
        replica=SimpleNamespace(status=lambda with_digest: dict(status)),
    )
    path = tmp_path / "status.json"
    NodeServer._write_status(node)  # type: ignore[arg-type]
    first = os.stat(path).st_ino
    NodeServer._write_status(node)  # type: ignore[arg-type]
    assert os.stat(path).st_ino == first  # not replaced
    status["term"] = 2
    NodeServer._write_status(node)  # type: ignore[arg-type]
    assert os.stat(path).st_ino != first
    assert '"term": 2' in path.read_text()


def test_the_resident_set_is_read_through_one_descriptor_kept_open() -> None:
    """One open, then one pread a sample; the figure is /proc's, as a fresh read gives it."""
    reader = StatmReader()
    first = reader.resident_bytes()
    descriptor = reader.fd
    assert descriptor >= 0 and first > 0
    grown = bytearray(64 * 1024 * 1024)  # touched: resident
    grown[::4096] = b"x" * len(grown[::4096])
    assert reader.resident_bytes() >= first + 32 * 1024 * 1024  # read again, not cached
    assert reader.fd == descriptor
    assert abs(reader.resident_bytes() - resident_bytes()) < 8 * 1024 * 1024
    del grown
    assert StatmReader("/nonexistent/statm").resident_bytes() == 0
