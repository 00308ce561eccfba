"""The node's periodic pass shares the raft ticker's loop wake-up (cluster.node.pacing), and an
unchanged status.json is not rewritten (issue 25 item 3: an idle leader's CPU)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cluster.node.pacing import EARLY_S, LATE_S, next_pass_at, sleep_until
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


def test_sleeping_until_the_raft_timer_wakes_the_loop_once_for_both() -> None:
    """Counted, not timed: the selector's blocking waits between two wake-ups that share an
    instant (one), against two timers 5 ms apart, as the pass and the heartbeat were (two)."""

    def blocking_waits(offset_s: float) -> int:
        loop = asyncio.new_event_loop()
        selector: Any = loop._selector  # type: ignore[attr-defined]
        real_select = selector.select
        waits: list[float | None] = []

        def counting(timeout: float | None = None) -> Any:
            if timeout is None or timeout > 0:
                waits.append(timeout)
            return real_select(timeout)

        selector.select = counting
        fired: list[str] = []

        async def main() -> None:
            at = loop.time() + 0.03
            loop.call_at(at, fired.append, "raft")  # the ticker's timer
            await sleep_until(loop, at + offset_s)  # the periodic pass
            fired.append("pass")

        try:
            waits.clear()
            loop.run_until_complete(main())
        finally:
            loop.close()
        assert fired == ["raft", "pass"]
        return len(waits)

    assert blocking_waits(0.0) == 1
    assert blocking_waits(0.005) == 2


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
