"""pysyncobj driven from an asyncio event loop: no tick thread, no hand-offs.

pysyncobj normally runs its own thread: `_onTick` then `poll(autoTickPeriod)` on its own poller,
woken by a pipe when a command is queued. Every proposal then crossed two threads (loop -> tick
through the pipe, tick -> loop through `call_soon_threadsafe`), each a system call and a GIL
hand-over, on every node of the peer round trip.

Here the node's loop is the poller (`LoopPoller`: pysyncobj's sockets are `add_reader` /
`add_writer` registrations on the loop), and `LoopTicker` runs one tick
- right after each peer socket event (one event reads every frame the socket holds, up to a
  bound: a follower fsyncs once for all the AppendEntries in it, and answers them together),
  unless the node says the event needed none (`light_event`: an idle leader's heartbeat
  replies change nothing a tick would act on; its next heartbeat's tick comes anyway),
- right after a proposal is queued (instead of pysyncobj's pipe notifier),
- on a timer for Raft's timers, when the next one falls due: the node's `next_due()` names the
  earliest it knows (the leader's next heartbeat, a follower's election or pre-vote deadline),
  and a tick runs at least every `period` for the ones it does not (connection retries and
  handshake deadlines, the disk probe, the journal's one-second timer); sooner when the node
  asks (`wake_within`, e.g. for the held-back commit index). An idle node so ticks at its
  heartbeat period (leader) or every `period` (follower), not on a fixed short grid: a timer
  that fires before anything is due (a follower's election deadline, pushed back by each
  heartbeat since it was armed) re-arms itself without a tick.

A tick is never re-entered: a tick requested during one runs after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog
from pysyncobj.poller import POLL_EVENT_TYPE

log = structlog.get_logger("raft.ticker")

_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
_WRITE = POLL_EVENT_TYPE.WRITE


class LoopPoller:
    """pysyncobj's Poller interface over an asyncio loop's selector.

    `subscribe(fd, callback, mask)` registers the callback for READ (and ERROR: the loop reports
    an error or hang-up as readable, the read then fails) and/or WRITE; `poll()` is what
    pysyncobj calls at the end of each tick: it runs `on_tick_end` (nothing waits here, the loop
    does). Every event calls `on_event` after the callback (the ticker coalesces them).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None]) -> None:
        self.loop = loop
        self.on_event = on_event
        self.on_tick_end: Callable[[], None] | None = None
        self.on_failure: Callable[[], None] | None = None  # after a callback raised (logged)
        self._subscribed: dict[int, tuple[int, Callable[[int, int], None]]] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None:
        """Watch `descr` for the events in `mask` (replacing what was watched)."""
        old_mask, old_callback = self._subscribed.get(descr, (0, None))
        self._subscribed[descr] = (mask, callback)
        same = old_callback is callback or old_callback == callback
        if mask & _READ and not (old_mask & _READ and same):
            self._register(self.loop.add_reader, self.loop.remove_reader, descr, callback, _READ)
        elif not mask & _READ and old_mask & _READ:
            self.loop.remove_reader(descr)
        if mask & _WRITE and not (old_mask & _WRITE and same):
            self._register(self.loop.add_writer, self.loop.remove_writer, descr, callback, _WRITE)
        elif not mask & _WRITE and old_mask & _WRITE:
            self.loop.remove_writer(descr)

    def _register(
        self,
        add: Callable[..., Any],
        remove: Callable[[int], Any],
        descr: int,
        callback: Callable[[int, int], None],
        event: int,
    ) -> None:
        event = POLL_EVENT_TYPE.READ if event == _READ else POLL_EVENT_TYPE.WRITE
        try:
            add(descr, self._fire, callback, descr, event)
        except OSError:
            # a descriptor closed and reused without an unsubscribe: the selector still had
            # the old registration; drop it and register again
            remove(descr)
            add(descr, self._fire, callback, descr, event)

    def unsubscribe(self, descr: int) -> None:
        """Stop watching `descr`."""
        mask, _callback = self._subscribed.pop(descr, (0, None))
        if mask & _READ:
            self.loop.remove_reader(descr)
        if mask & _WRITE:
            self.loop.remove_writer(descr)

    def unsubscribe_all(self) -> None:
        """Drop every registration (the node is destroyed)."""
        for descr in list(self._subscribed):
            self.unsubscribe(descr)

    def _fire(self, callback: Callable[[int, int], None], descr: int, event: int) -> None:
        try:
            callback(descr, event)
        except Exception:  # as pysyncobj's tick thread: log it, keep going
            log.exception("raft_io_failed", fd=descr)
            if self.on_failure is not None:
                self.on_failure()
        self.on_event()

    def poll(self, _timeout: float) -> None:
        """The end of a pysyncobj tick: the loop waits for events, not us."""
        if self.on_tick_end is not None:
            self.on_tick_end()


# a deadline still past after a tick ran (pysyncobj did not act on it: a follower connected to
# nobody does not stand) is looked at again this often, as every tick was before
PAST_DUE_RETRY_S = 0.02
# a timer this close to the earliest deadline ticks (asyncio runs a timer up to its clock
# resolution early, and pysyncobj compares its deadlines with `>`)
DUE_SLACK_S = 0.001
# the `period` tick waits this much longer for a named deadline just after it (an idle leader's
# next heartbeat falls due a little after `period` from the tick that sent the last one, which
# started before the send): one tick, not one at the period that finds the heartbeat not yet due
# (pysyncobj then sends nothing) and another at the retry, PAST_DUE_RETRY_S later
PERIOD_STRETCH_S = 0.025


class LoopTicker:
    """Runs `tick()` on the loop when asked (coalesced), when the node's next timer falls due
    (`next_due()`: seconds from now, None when it knows of none) and at least every `period`
    seconds (for the timers `next_due` does not know)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        tick: Callable[[], None],
        period: float,
        next_due: Callable[[], float | None] | None = None,
    ) -> None:
        self.loop = loop
        self._tick = tick
        self.period = period
        self._next_due = next_due
        self._scheduled = False
        self._ticking = False
        self._stopped = False
        self._timer: asyncio.TimerHandle | None = None
        self._last_tick_at = loop.time()
        self._wake_at = float("inf")  # asked for by `wake_within`, until the next tick
        self.ticks = 0
        self.timer_wakeups = 0  # the timer fired (a tick followed only if something was due)
        # after a peer event, outside a tick: True when the node handled it without a tick (an
        # idle leader's heartbeat replies: `RaftNode._event_handled_lightly`)
        self.light_event: Callable[[], bool] | None = None
        self.light_events = 0  # peer events handled so, without a tick
        self.on_failure: Callable[[], None] | None = None  # after a tick raised (logged)

    def start(self) -> None:
        """Tick once soon, then when due (call before the loop runs, or on it)."""
        self.request()
        self._arm(self.period)

    def stop(self) -> None:
        """No more ticks (on the loop thread, or before/after it runs)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def tick_now(self) -> None:
        """Tick now (loop thread; after a peer socket event: the frames it read are answered
        at once, one fsync for all of them), or after the tick in progress; no tick when the
        node says the event needed none (`light_event`)."""
        if not self._ticking and not self._stopped and self._handled_lightly():
            self.light_events += 1
            return
        self._run_now()

    def _handled_lightly(self) -> bool:
        if self.light_event is None:
            return False
        try:
            return self.light_event()
        except Exception:  # never skip a tick over it
            log.exception("raft_light_event_failed")
            return False

    def request(self) -> None:
        """Tick at the next loop iteration (loop thread)."""
        if not self._scheduled and not self._stopped:
            self._scheduled = True
            self.loop.call_soon(self._run)

    def request_from_any_thread(self) -> None:
        """`request()` from the loop thread, or from any other thread (a test's)."""
        if asyncio._get_running_loop() is self.loop:
            self.request()
        elif not self._scheduled and not self._stopped:
            with contextlib.suppress(RuntimeError):  # the loop is closed: destroyed
                self.loop.call_soon_threadsafe(self.request)

    def run_or_request(self, function: Callable[[], None]) -> None:
        """Run `function` now as a (partial) tick if called on the loop outside a tick; else
        `request_from_any_thread()` (the next full tick does what it would have)."""
        if self._ticking or self._stopped or asyncio._get_running_loop() is not self.loop:
            self.request_from_any_thread()
            return
        self._ticking = True
        try:
            function()
        except Exception:
            log.exception("raft_tick_failed")
            self._failed()
        finally:
            self._ticking = False

    def timer_at(self) -> float | None:
        """The loop time the timer is armed for (None when not armed): others may share the
        loop's wake-up (cluster.node.pacing)."""
        return None if self._timer is None else self._timer.when()

    def wake_within(self, seconds: float) -> None:
        """Make sure a tick runs within `seconds` (e.g. a held-back message falls due)."""
        if self._stopped or seconds >= self.period:
            return
        self._wake_at = min(self._wake_at, self.loop.time() + max(0.0, seconds))
        self._arm(seconds)

    def _arm(self, seconds: float) -> None:
        """Have the timer fire within `seconds` (an earlier timer stays: it re-arms itself)."""
        when = self.loop.time() + max(0.0, seconds)
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._on_timer)

    def _wait(self, past_due_floor: float) -> float:
        """Seconds until a tick is due: the node's next timer (no sooner than
        `past_due_floor`), a `wake_within`, or `period` after the last tick (stretched to the
        node's timer when that falls due up to PERIOD_STRETCH_S later)."""
        now = self.loop.time()
        fallback, asked = self._last_tick_at + self.period - now, self._wake_at - now
        due = None
        if self._next_due is not None:
            try:
                due = self._next_due()
            except Exception:  # never stop ticking over it: `period` still holds
                log.exception("raft_next_due_failed")
        if due is None:
            return min(fallback, asked)
        due = max(due, past_due_floor)
        if due <= fallback + PERIOD_STRETCH_S:  # the period's tick waits for it
            return min(due, asked)
        return min(fallback, asked)

    def _on_timer(self) -> None:
        self._timer = None
        if self._stopped:
            return
        self.timer_wakeups += 1
        wait = self._wait(0.0)
        if wait > DUE_SLACK_S:  # nothing due yet: the deadline moved since the timer was armed
            self._arm(wait)
            return
        self._run_now()

    def _run(self) -> None:
        self._scheduled = False
        self._run_now()

    def _run_now(self) -> None:
        if self._stopped:
            return
        if self._ticking:  # asked from inside a tick: run after it
            self.request()
            return
        self._ticking = True
        self._last_tick_at = self.loop.time()
        self._wake_at = float("inf")
        try:
            self.ticks += 1
            self._tick()
        except Exception:  # as pysyncobj's tick thread: log it, tick again later
            log.exception("raft_tick_failed")
            self._failed()
        finally:
            self._ticking = False
        if not self._stopped:
            self._arm(self._wait(PAST_DUE_RETRY_S))

    def _failed(self) -> None:
        if self.on_failure is not None:
            self.on_failure()


class LoopThread:
    """A private event loop in a daemon thread, for RaftNodes built without a loop (tests and
    tools that drive a node in-process): the node's ticks and callbacks run in that thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Run the loop (everything registered before runs from now on)."""
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call_and_stop(self, function: Callable[[], None]) -> None:
        """Run `function` on the loop, stop it, wait for the thread, close the loop."""
        if not self._thread.is_alive():
            function()
            self.loop.close()
            return

        def last() -> None:
            try:
                function()
            finally:
                self.loop.stop()

        self.loop.call_soon_threadsafe(last)
        self._thread.join()
        self.loop.close()

    def is_alive(self) -> bool:
        """Whether the loop thread still runs."""
        return self._thread.is_alive()
