"""Group commit: client commands arriving within a short window become one log entry.

Runs on the node's asyncio loop. A batch is flushed when the window (1 ms) elapses, or when it
reaches `count_max` commands or `bytes_max` bytes; with nothing in flight it is flushed at the end
of the current loop iteration (no added latency for a lone command); with `inflight_max` entries
of this node in flight it waits for one of them to be applied (bigger entries under load), but
never for an entry older than `stuck_s`: one whose answer will not come (a deposed leader's entry
replaced under a snapshot, a forward whose reply was lost) must not hold the node's commands until
the sweep fails it. Each
command keeps its own reply sink; the sinks are resolved when the submitting node applies the
entry (`resolve`, in log order), or failed with a SubmitError when pysyncobj reports a failure
or the batch times out.

Admission: the commands taken and not yet answered (buffered, or in entries in flight) are
counted in bytes; at `admit_bytes_max` and over, `room()` holds the node's readers (a client
session waits on it before reading more) until answers bring the count below it again, or its
entries grow older than `stuck_s`. Without it a node read whatever its clients sent: a
publisher's whole window (1,000 x 16 KiB) sat in the leader as commands, their decoded copies
and their entries, for tens of MiB of transient heap (issue 32).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from pysyncobj import FAIL_REASON

from fifo.commands import Command
from fifo.replies import Reply as FifoReply
from raft.entry import SUB_INDEX_SPAN, Entry, Origin
from raft.errors import SubmitError
from raft.machine_clock import MachineClock
from raft.node import RaftNode
from raft.replicated import InternalFailure, Outcome

log = structlog.get_logger("raft.batcher")

Reply = FifoReply | InternalFailure | SubmitError  # what a proposal is answered with
Sink = Callable[[Reply], None]

WINDOW_S_DEFAULT = 0.001
COUNT_MAX_DEFAULT = SUB_INDEX_SPAN
BYTES_MAX_DEFAULT = 256 * 1024
TIMEOUT_S_DEFAULT = 10.0
INFLIGHT_MAX_DEFAULT = 3
ADMIT_BYTES_MAX_DEFAULT = 4 * 1024 * 1024  # commands taken and unanswered before readers wait
# a command this long is decoded again when applied rather than kept decoded until then: the
# decode saved is per command, the copy kept is per byte (a 16 KiB body held twice in flight)
DECODED_KEPT_BYTES_MAX = 4 * 1024
STUCK_S_DEFAULT = 0.5  # an entry unanswered this long no longer holds new commands back

_FAILURES = {
    FAIL_REASON.QUEUE_FULL: ("unavailable", "the node's command queue is full"),
    FAIL_REASON.MISSING_LEADER: ("unavailable", "no leader"),
    FAIL_REASON.DISCARDED: ("unavailable", "the entry was discarded by a new leader"),
    FAIL_REASON.NOT_LEADER: ("unavailable", "the node asked is not the leader"),
    FAIL_REASON.LEADER_CHANGED: ("unavailable", "the leader changed: outcome unknown, retry"),
    FAIL_REASON.REQUEST_DENIED: ("unavailable", "request denied"),
    FAIL_REASON.UNKNOWN_OUTCOME: ("unavailable", "outcome unknown, retry"),
}

DISK_FULL_MESSAGE = (
    "this node's disk is full: it takes no commands until space returns (nothing was written; "
    "retry, or use another node)"
)


@dataclass
class _Batch:
    sinks: list[Sink]
    nbytes: int = 0
    submitted_s: float = field(default_factory=time.monotonic)


class GroupCommitter:
    """Batches commands into `cmds` entries and routes each reply back to its sink."""

    def __init__(
        self,
        node: RaftNode,
        loop: asyncio.AbstractEventLoop,
        window_s: float = WINDOW_S_DEFAULT,
        count_max: int = COUNT_MAX_DEFAULT,
        bytes_max: int = BYTES_MAX_DEFAULT,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        inflight_max: int = INFLIGHT_MAX_DEFAULT,
        clock: MachineClock | None = None,
        stuck_s: float | None = None,
        admit_bytes_max: int = ADMIT_BYTES_MAX_DEFAULT,
    ) -> None:
        self.node = node
        self.clock = clock if clock is not None else MachineClock()  # stamps entries (issue 31)
        self.loop = loop
        self.window_s = window_s
        self.count_max = min(count_max, SUB_INDEX_SPAN)
        self.bytes_max = bytes_max
        self.timeout_s = timeout_s
        self.inflight_max = inflight_max
        self.stuck_s = STUCK_S_DEFAULT if stuck_s is None else stuck_s
        self.admit_bytes_max = admit_bytes_max
        self._room = asyncio.Event()  # set when an answer brought the bytes taken under the max
        self._bytes_pending = 0  # bytes of the commands in the entries in flight
        self._buffer: list[bytes] = []
        self._sinks: list[Sink] = []
        self._decoded: list[Command | None] = []
        self._bytes = 0
        self._timer: asyncio.Handle | None = None
        self._held = False  # a window elapsed while inflight_max entries were in flight
        self._pending: dict[int, _Batch] = {}
        self._ids = itertools.count(1)
        self.entries_submitted = 0
        self.commands_submitted = 0

    def _origin(self, batch_id: int) -> Origin:
        return (self.node.settings.node_id, self.node.settings.incarnation, batch_id)

    def submit(self, command_blob: bytes, sink: Sink, decoded: Command | None = None) -> None:
        """Queue one encoded command (loop thread); the sink gets its reply later.

        `decoded` is the command object the blob encodes, if the caller has it: this node's
        apply then skips decoding it again (for blobs up to DECODED_KEPT_BYTES_MAX).
        """
        self._buffer.append(command_blob)
        self._sinks.append(sink)
        self._decoded.append(decoded if len(command_blob) <= DECODED_KEPT_BYTES_MAX else None)
        self._bytes += len(command_blob)
        if len(self._buffer) >= self.count_max or self._bytes >= self.bytes_max:
            self.flush()
        elif self._timer is None and not self._pending:
            # nothing in flight: go at the end of this loop iteration (a lone command waits for
            # no window; commands read in the same iteration still share the entry)
            self._timer = self.loop.call_soon(self.flush)
        elif self._timer is None and not self._held:
            self._timer = self.loop.call_later(self.window_s, self._window_elapsed)

    def _window_elapsed(self) -> None:
        # with enough entries in flight, hold the batch until one of them is applied: under a
        # trickle of commands (acks) this makes fewer, larger entries instead of one per window;
        # look again when the oldest of them is stuck_s old
        self._timer = None
        young = self._young_in_flight()
        if len(young) >= self.inflight_max:
            self._held = True
            wait = max(0.0, min(young) + self.stuck_s - time.monotonic())
            self._timer = self.loop.call_later(wait + self.window_s, self._window_elapsed)
        else:
            self.flush()

    @property
    def bytes_taken(self) -> int:
        """Bytes of the commands taken and not yet answered."""
        return self._bytes + self._bytes_pending

    async def room(self) -> None:
        """Return once the commands taken and unanswered hold under `admit_bytes_max` bytes,
        those of entries older than `stuck_s` not counted (one whose answer will not come
        must not hold the node's readers until the sweep)."""
        while self._bytes_young() >= self.admit_bytes_max:
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), self.stuck_s)

    def _bytes_young(self) -> int:
        since = time.monotonic() - self.stuck_s
        young = (b.nbytes for b in self._pending.values() if b.submitted_s > since)
        return self._bytes + sum(young)

    def _young_in_flight(self) -> list[float]:
        """When each entry in flight that is younger than stuck_s was submitted."""
        since = time.monotonic() - self.stuck_s
        return [b.submitted_s for b in self._pending.values() if b.submitted_s > since]

    def _release(self) -> None:
        if self._held and len(self._young_in_flight()) < self.inflight_max:
            self._held = False
            self.flush()

    def flush(self) -> None:
        """Submit the buffered commands as one entry now."""
        self._held = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer:
            return
        cmds, sinks, decoded, nbytes = tuple(self._buffer), self._sinks, self._decoded, self._bytes
        self._buffer, self._sinks, self._decoded, self._bytes = [], [], [], 0
        batch_id = next(self._ids)
        if all(d is not None for d in decoded):
            self.node.hand_decoded(batch_id, tuple(d for d in decoded if d is not None))
        wall_ms, machine_ms = self.clock.stamp()
        entry = Entry("cmds", wall_ms, self._origin(batch_id), cmds=cmds, machine_ms=machine_ms)
        self._send(batch_id, entry, sinks, nbytes)
        self.commands_submitted += len(cmds)

    def submit_entry(self, make: Callable[[Origin], Entry], sink: Sink) -> None:
        """Submit a non-command entry (hello, upgrade) built for its origin; one reply."""
        batch_id = next(self._ids)
        self._send(batch_id, make(self._origin(batch_id)), [sink])

    def _send(self, batch_id: int, entry: Entry, sinks: list[Sink], nbytes: int = 0) -> None:
        self._pending[batch_id] = _Batch(sinks, nbytes)
        self._bytes_pending += nbytes
        self.entries_submitted += 1

        def on_done(_result: Any, reason: int) -> None:  # inside a tick (the loop)
            if reason != FAIL_REASON.SUCCESS:
                code, message = _FAILURES.get(reason, ("unavailable", f"failure {reason}"))
                self.loop.call_soon_threadsafe(self.fail, batch_id, SubmitError(code, message))

        if self.node.disk_full():
            # the journal cannot take the entry: say so now rather than time out in 10 s
            self.fail(batch_id, SubmitError("disk_full", DISK_FULL_MESSAGE))
            return
        try:
            self.node.submit(entry, callback=on_done)
        except Exception as err:  # e.g. the node is shutting down
            self.fail(batch_id, SubmitError("unavailable", f"cannot submit: {err}"))

    def resolve(self, outcome: Outcome) -> None:
        """Hand the replies of an applied entry to their sinks (loop thread, log order)."""
        origin = outcome.origin
        if origin is None or origin[:2] != self._origin(0)[:2]:
            return
        batch = self._pop(origin[2])
        if batch is None:
            return  # already failed (timeout, leader change): the client retries with dedup
        for sink, reply in zip(batch.sinks, outcome.replies, strict=False):
            _call(sink, reply)
        for sink in batch.sinks[len(outcome.replies) :]:
            _call(sink, SubmitError("internal", "entry applied without a reply for this command"))
        self._release()

    def fail(self, batch_id: int, error: SubmitError) -> None:
        """Fail every command of a batch that will not be answered."""
        self.node.forget_decoded(batch_id)
        batch = self._pop(batch_id)
        if batch is not None:
            for sink in batch.sinks:
                _call(sink, error)
            self._release()

    def _pop(self, batch_id: int) -> _Batch | None:
        batch = self._pending.pop(batch_id, None)
        if batch is not None:
            self._bytes_pending -= batch.nbytes
            if self._bytes + self._bytes_pending < self.admit_bytes_max:
                self._room.set()
        return batch

    def sweep(self) -> None:
        """Fail batches older than the timeout (pysyncobj has no timeout on async calls)."""
        deadline = time.monotonic() - self.timeout_s
        for batch_id in [b for b, batch in self._pending.items() if batch.submitted_s < deadline]:
            self.fail(batch_id, SubmitError("not_leader_timeout", "no commit within the timeout"))

    def fail_all(self, error: SubmitError) -> None:
        """Fail everything pending (shutdown)."""
        self.flush()
        for batch_id in list(self._pending):
            self.fail(batch_id, error)


def _call(sink: Sink, value: Reply) -> None:
    try:
        sink(value)
    except Exception:
        log.exception("reply_sink_failed")
