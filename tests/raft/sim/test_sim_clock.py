"""raft/sim's scheduler: a runaway seed fails with SimulationError instead of eating memory."""

from __future__ import annotations

import random
import sys
import time

import pysyncobj.monotonic
import pytest

from raft.sim import clock
from raft.sim.clock import Scheduler, SimulationError, VirtualLoop
from raft.sim.patches import simulated


def test_too_many_pending_events_fail_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "PENDING_EVENTS_MAX", 100)
    loop = VirtualLoop(Scheduler(), "n1")
    for i in range(100):
        loop.call_later(i, print)
    with pytest.raises(SimulationError, match="more than 100 events pending"):
        loop.call_later(1.0, print)


def test_every_raft_module_reads_the_virtual_clock_inside_a_simulation() -> None:
    # a module that imports pysyncobj's monotonic clock (or the time module) reads the wall
    # clock in a simulation unless patches.py replaces it there: a seed then no longer replays
    # (raft.snapshot_hooks' transfer hold was missed when it was added)
    import raft.node
    import raft.replica  # noqa: F401

    exempt = {"raft.export", "raft.snapshotter"}  # not run by the simulator / durations only
    with simulated(lambda: 1234.5, random.Random(1)):
        wall = [
            name
            for name, module in sorted(sys.modules.items())
            if name.startswith("raft.") and not name.startswith("raft.sim") and name not in exempt
            and (
                getattr(module, "monotonic_time", None) is pysyncobj.monotonic.monotonic
                or getattr(module, "time", None) is time
            )
        ]
    assert wall == []
