"""Whose clock the replicated machine follows (issue 31), and this node's reading of it.

The rule, from machine version 4 (`CLOCK_RULE_VERSION`): every entry carries its submitter's
wall clock (`ts`, as before) and its estimate of the machine's time (`machine_ms`: the machine
time of the last entry it applied plus its own monotonic time elapsed since it applied it). The
machine's time at an entry is `max(last time, machine_ms)`: it only ever moves by monotonic time
that some node measured, so a node's wall clock stepping (either way, running or restarted) moves
nothing. The one place a wall clock still counts is a `hello` (a node's first entry): it may move
the time forward by at most `CLOCK_STEP_MS_MAX` (a short whole-cluster outage is then not lost).
An entry whose wall clock is off from the machine's time by more than that bound, and from the
other nodes' clocks (`ClockSteps`), is a rejected step: logged once per episode and counted
(`quorumq_clock_steps_rejected_total`).
Before version 4, and for an entry without `machine_ms` (older code), the time is
`max(last time, ts)` as it always was. `machine_time` is pure (every replica computes the same);
`MachineClock` is the node's side (it reads clocks and is never called inside apply).

Test hook: `QUORUMQ_CLOCK_OFFSET_FILE` names a file whose content is a number of ms added to this
node's wall clock (re-read every `OFFSET_REREAD_S`; relative to the node's working directory,
its data dir when started by the launcher; missing or unreadable: 0). Tests use it to step one
node's clock; nothing else should.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import TypeVar

import structlog

from raft.entry import Entry, Origin

log = structlog.get_logger("raft.clock")
T = TypeVar("T")

CLOCK_RULE_VERSION = 4
CLOCK_STEP_MS_MAX = 10_000  # how far a hello's wall clock may move the time; beyond: rejected
CLOCK_OFFSET_FILE_ENV = "QUORUMQ_CLOCK_OFFSET_FILE"
OFFSET_REREAD_S = 0.1
SUBMITTERS_TRACKED_MAX = 256  # nodes whose rejected-step episode is remembered
MEDIAN_SUBMITTERS_MIN = 3  # judge a skew against the others' median once this many are known


def machine_time(last_ms: int, version: int, entry: Entry) -> tuple[int, int | None]:
    """The machine's time at `entry` (applied while `version` is effective, after a time of
    `last_ms`), and the entry's wall-clock skew from it (ms; None under the old rule)."""
    if version < CLOCK_RULE_VERSION or entry.machine_ms is None:
        return max(last_ms, entry.ts_ms), None
    if last_ms == 0:  # no time yet (a log that starts at version 4): the wall clock sets it
        now = max(entry.ts_ms, entry.machine_ms)
    else:
        now = max(last_ms, entry.machine_ms)
        if entry.kind == "hello" and 0 < entry.ts_ms - now <= CLOCK_STEP_MS_MAX:
            now = entry.ts_ms
    return now, entry.ts_ms - now


class ClockSteps:
    """Rejected wall-clock steps by submitting node, counted and logged once per episode (the
    entries of one node incarnation whose skew stays off by more than the bound).

    A skew is judged against the median of the latest skews of the nodes seen submitting (once
    at least `MEDIAN_SUBMITTERS_MIN` are known; before, against the machine's time): after a
    whole-cluster outage every clock is equally far ahead of the paused machine time, and none
    of them is wrong, while one node a day ahead or an hour behind is off from the others."""

    def __init__(self) -> None:
        self.rejected: dict[str, int] = {}  # node -> episodes counted since this process started
        self._episodes: dict[str, tuple[int, bool]] = {}  # node -> (incarnation, in an episode)
        self._skews: dict[str, int] = {}  # node -> skew of its latest entry

    def observe(self, origin: Origin | None, skew_ms: int | None, judge: bool = True) -> None:
        """One applied entry: its submitter and wall-clock skew (None: nothing to judge); not
        `judge`: only remember the skew (the node replays its journal at start: the episodes
        there were counted by the process that applied them live)."""
        if origin is None or skew_ms is None:
            return
        node, incarnation = origin[0], origin[1]
        _remember(self._skews, node, skew_ms)
        if not judge:
            return
        reference = 0
        if len(self._skews) >= MEDIAN_SUBMITTERS_MIN:
            reference = statistics.median_low(self._skews.values())
        beyond = abs(skew_ms - reference) > CLOCK_STEP_MS_MAX
        was_in = self._episodes.get(node) == (incarnation, True)
        if beyond and not was_in:
            self.rejected[node] = self.rejected.get(node, 0) + 1
            log.warning(
                "clock_step_rejected",
                node=node,
                incarnation=incarnation,
                skew_ms=skew_ms,
                others_skew_ms=reference,
                bound_ms=CLOCK_STEP_MS_MAX,
                hint="this node's wall clock is off from the machine's time and the other "
                "nodes' clocks (or it came back first after the cluster was idle or down that "
                "long): the machine does not follow it",
            )
        elif was_in and not beyond:
            log.info("clock_step_episode_over", node=node, incarnation=incarnation)
        _remember(self._episodes, node, (incarnation, beyond))


def _remember(by_node: dict[str, T], node: str, value: T) -> None:
    """`by_node[node] = value`, forgetting the oldest node past SUBMITTERS_TRACKED_MAX."""
    if node not in by_node and len(by_node) >= SUBMITTERS_TRACKED_MAX:
        by_node.pop(next(iter(by_node)))
    by_node[node] = value


class MachineClock:
    """This node's clocks: its wall clock (with the test hook's offset) and its estimate of the
    machine's time (last applied machine time + monotonic time elapsed since)."""

    def __init__(self, offset_file: str | None = None) -> None:
        path = offset_file if offset_file is not None else os.environ.get(CLOCK_OFFSET_FILE_ENV)
        self._offset_file = Path(path).resolve() if path else None
        self._offset_ms = 0
        self._offset_read_at: float | None = None
        self._applied: tuple[int, float] | None = None  # (machine ms, monotonic s then)
        self.steps = ClockSteps()

    def wall_ms(self) -> int:
        """The wall clock, in ms (plus the test hook's offset, if set)."""
        return int(time.time() * 1000) + self._offset()

    def stamp(self) -> tuple[int, int]:
        """What a new entry carries: (wall clock ms, estimate of the machine's time ms)."""
        return self.wall_ms(), self.estimate_ms()

    def applied(self, machine_ms: int) -> None:
        """An entry (or a snapshot) at machine time `machine_ms` was just applied here: the
        estimate moves to it only if that is ahead of it (an entry whose time did not move,
        or moved less than this node's clock since, must not take the elapsed time back)."""
        if self._applied is None or machine_ms > self.estimate_ms():
            self._applied = (machine_ms, time.monotonic())

    def estimate_ms(self) -> int:
        """The machine's time now, as this node can tell (0 before it applied anything)."""
        if self._applied is None:
            return 0
        machine_ms, at = self._applied
        return machine_ms + max(0, int((time.monotonic() - at) * 1000))

    def _offset(self) -> int:
        if self._offset_file is None:
            return 0
        now = time.monotonic()
        if self._offset_read_at is None or now - self._offset_read_at >= OFFSET_REREAD_S:
            self._offset_read_at = now
            try:
                self._offset_ms = int(self._offset_file.read_text().strip() or 0)
            except (OSError, ValueError):
                self._offset_ms = 0
        return self._offset_ms
