"""When the node's periodic pass runs: on the raft ticker's own wake-up when that is near.

The node server's periodic pass (memory sample, storage damage, leader timers, sweeps, status)
runs about every `period`. The raft ticker wakes the loop on its own timer (an idle leader: its
heartbeat, every 200 ms; a follower: its tick period). Two timers 200 ms apart each but out of
phase cost two loop wake-ups (two context switches, two passes through the selector) where
one would do: `next_pass_at` moves the pass onto the ticker's timer when that falls within
[period - EARLY_S, period + LATE_S] of now, to just after its instant (asyncio runs every timer
due at one wake-up together, in order). Otherwise the pass keeps its own `period`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

log = structlog.get_logger("cluster.node")

# how much sooner / later than `period` the pass may run to share the raft ticker's wake-up
EARLY_S = 0.025
LATE_S = 0.05
# the pass runs this long after the ticker's timer: in the same loop iteration (the wake-up comes
# later than that), but after it, so that the pass sees the ticker's next timer, not the one
# being run (asyncio runs the timers of one iteration in order of their instants)
AFTER_S = 1e-6


def next_pass_at(now: float, period: float, raft_timer_at: float | None) -> float:
    """The loop time of the next periodic pass: the raft ticker's timer (`raft_timer_at`, loop
    time, None when not armed) if it falls within the window around `now + period`, else
    `now + period`."""
    wanted = now + period
    if raft_timer_at is not None and wanted - EARLY_S <= raft_timer_at <= wanted + LATE_S:
        return raft_timer_at + AFTER_S
    return wanted


class Repeating:
    """Runs `step()` on `loop` about every `period` (at `next_pass_at`, on the raft ticker's
    timer when near) as a plain timer callback: no task and no future, so a pass costs one
    callback in the loop iteration the wake-up brought, not a second iteration to resume a
    coroutine. `step` returns False to stop; an exception out of it is logged and the passes
    go on. `on_late(seconds)` hears how late each pass ran (the loop's stalls)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        period: float,
        raft_timer_at: Callable[[], float | None],
        step: Callable[[], bool],
        on_late: Callable[[float], None],
    ) -> None:
        self.loop = loop
        self.period = period
        self._raft_timer_at = raft_timer_at
        self._step = step
        self._on_late = on_late
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0
        self.passes = 0

    def start(self) -> None:
        """The first pass about `period` from now."""
        self._schedule()

    def cancel(self) -> None:
        """No more passes."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        self._at = next_pass_at(self.loop.time(), self.period, self._raft_timer_at())
        self._handle = self.loop.call_at(self._at, self._run)

    def _run(self) -> None:
        self._handle = None
        self._on_late(self.loop.time() - self._at)
        self.passes += 1
        try:
            go_on = self._step()
        except Exception:
            log.exception("periodic_failed")
            go_on = True
        if go_on and self._handle is None:
            self._schedule()
