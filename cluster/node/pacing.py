"""When the node's periodic pass runs: on the raft ticker's own wake-up when that is near.

The node server's periodic pass (memory sample, storage damage, leader timers, sweeps, status)
runs about every `period`. The raft ticker wakes the loop on its own timer (an idle leader: its
heartbeat, every 100 ms; a follower: its tick period). Two timers 100 ms apart each but out of
phase cost two loop wake-ups (two context switches, two passes through the selector) where
one would do: `next_pass_at` moves the pass onto the ticker's timer when that falls within
[period - EARLY_S, period + LATE_S] of now, to the very same loop instant (asyncio runs every
timer due at one wake-up together). Otherwise the pass keeps its own `period`.
"""

from __future__ import annotations

import asyncio

# how much sooner / later than `period` the pass may run to share the raft ticker's wake-up
EARLY_S = 0.025
LATE_S = 0.05


def next_pass_at(now: float, period: float, raft_timer_at: float | None) -> float:
    """The loop time of the next periodic pass: the raft ticker's timer (`raft_timer_at`, loop
    time, None when not armed) if it falls within the window around `now + period`, else
    `now + period`."""
    wanted = now + period
    if raft_timer_at is not None and wanted - EARLY_S <= raft_timer_at <= wanted + LATE_S:
        return raft_timer_at
    return wanted


async def sleep_until(loop: asyncio.AbstractEventLoop, at: float) -> None:
    """Sleep until loop time `at` exactly (`asyncio.sleep` would add the time spent since `at`
    was computed, and miss the other timer's wake-up by microseconds)."""
    woken: asyncio.Future[None] = loop.create_future()
    handle = loop.call_at(at, _wake, woken)
    try:
        await woken
    finally:
        handle.cancel()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
