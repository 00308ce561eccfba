"""raft/sim's scheduler: a runaway seed fails with SimulationError instead of eating memory."""

from __future__ import annotations

import pytest

from raft.sim import clock
from raft.sim.clock import Scheduler, SimulationError, VirtualLoop


def test_too_many_pending_events_fail_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "PENDING_EVENTS_MAX", 100)
    loop = VirtualLoop(Scheduler(), "n1")
    for i in range(100):
        loop.call_later(i, print)
    with pytest.raises(SimulationError, match="more than 100 events pending"):
        loop.call_later(1.0, print)
