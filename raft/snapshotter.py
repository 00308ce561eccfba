"""Snapshots taken off the event loop: a forked child encodes, a thread writes (issue 32).

Measured with `scripts/bench_snapshot_stall.py` (200,000 queued messages, see raft/README.md):
encoding on the loop stalled it about 470 ms; a frozen copy for another thread cost more on the
loop than the encoding itself (`copy.deepcopy`, ~2.9 s, and the C encoder holds the GIL), while
`os.fork()` stalled it about 1 ms. So a snapshot is a copy-on-write fork:

1. on the loop, inside pysyncobj's tick: `fork()`. The child holds the state as of this
   instant; it encodes the dump (state without bodies + the live entry list), writes it to the
   temporary dump file and the live list to `<dump>.live.tmp`, fsyncs, and `_exit`s. It touches
   no lock, no logger, no socket.
2. the loop polls the child (`waitpid`, non-blocking) on every tick. When it exited 0, a thread
   renames the dump into place (directory fsynced), drops the retained entries the dump no
   longer names and rewrites the segments gone mostly dead (raft.retention), then writes the
   compacted journal (the entries from the snapshot on, in passes while the loop appends:
   `DurableFileJournal.prepare_compaction`), synced: all file I/O, off the loop. A failure
   there (ENOSPC) fails the snapshot with the dump already in place: the journal is compacted
   at the next one (or at a start, as below).
3. the next poll reports success: pysyncobj compacts the journal. On the loop that is: the
   journal file becomes a retained segment if it holds live entries below the snapshot (a hard
   link: nothing copied), the compacted file gets the entries appended since the last pass and
   replaces it. Before, the live entries were copied (a backlog's gigabyte at its first
   snapshot: the disk saturated and the loops stalled on their fsyncs) and the kept entries
   rewritten on the loop (a 0.8 s stall).

Crash safety: until the compaction, the live entries below the snapshot are in the journal; a
start that finds the dump renamed but the journal not compacted compacts it then
(`RaftNode._align_journal_to_snapshot`), with the dump's live list.

pysyncobj's hooks: the serializer starts the job and raises `SnapshotStarted` (pysyncobj catches
it and does not rename anything), and `serializeChecker` is `poll`. A snapshot installed from the
leader meanwhile `cancel`s the job (kills the child, waits for the thread, renames nothing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog
from pysyncobj.config import SERIALIZER_STATE

from raft import storage
from raft.durability import DurableFileJournal
from raft.retention import Interrupted

__all__ = ["DumpEncoder", "SnapshotJob", "SnapshotStarted"]

log = structlog.get_logger("raft.snapshot")

# what the child hands back: the dump file's bytes and the live entry list it names
DumpEncoder = Callable[[], tuple[bytes, Sequence[int]]]
_EXIT_OK, _EXIT_FAILED = 0, 70
# a child still encoding after this long is killed (the snapshot fails; pysyncobj retries it)
CHILD_TIMEOUT_S = 600.0


class SnapshotStarted(Exception):  # not an error: pysyncobj's serializer protocol
    """Raised by the serializer hook once the job started: pysyncobj then renames nothing and
    asks `serializeChecker` (`SnapshotJob.poll`) until it is done."""


class SnapshotJob:
    """The snapshot being taken, if any (loop thread: start, poll, cancel)."""

    def __init__(self, journal: DurableFileJournal | None, dump_path: Path, sync: bool) -> None:
        self.journal = journal
        self.dump_path = dump_path
        self.tmp_path = dump_path.with_name(dump_path.name + ".tmp")
        self.live_path = dump_path.with_name(dump_path.name + ".live.tmp")
        self.sync = sync
        self._pid = 0
        self._thread: threading.Thread | None = None
        self._outcome: int | None = None  # SERIALIZER_STATE once the thread finished
        self._cancelled = threading.Event()
        self._pending = SERIALIZER_STATE.NOT_SERIALIZING  # answered once when no job runs
        self._below = 0
        self._started = 0.0
        self.fork_ms = 0.0  # the loop's cost of the last start (the fork itself)

    @property
    def running(self) -> bool:
        """Whether a child or a retention thread is still at work."""
        return self._pid != 0 or self._thread is not None

    def start(self, encode: DumpEncoder, below: int, in_child: bool = True) -> None:
        """Fork a child that runs `encode` and writes its result (loop thread). With
        `in_child` False everything runs here and now, done at the next poll (the simulator:
        a child and a thread would make its runs depend on real time)."""
        if self.running:
            raise RuntimeError("a snapshot is already being taken")
        self._below, self._started = below, time.perf_counter()
        self._cancelled.clear()
        if not in_child:
            data, live = encode()
            _write(self.tmp_path, data, self.sync)
            _write(self.live_path, storage.encode_indexes(live), self.sync)
            self._finish()
            return
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(encode)
        self._pid = pid
        self.fork_ms = (time.perf_counter() - self._started) * 1000

    def _child(self, encode: DumpEncoder) -> None:
        code = _EXIT_FAILED
        try:
            # a signal to the child must not wake the parent's loop (the wakeup fd is shared)
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)
                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_DFL)
            # the lowest CPU priority: three nodes' children encoding at once on two cores took
            # the loops' CPU (stalls of 100-200 ms); a separate process, so no GIL to invert
            with contextlib.suppress(OSError):
                os.nice(19)
            data, live = encode()
            _write(self.tmp_path, data, self.sync)
            _write(self.live_path, storage.encode_indexes(live), self.sync)
            code = _EXIT_OK
        finally:
            os._exit(code)

    def poll(self) -> int:
        """pysyncobj's serializeChecker: SERIALIZING while at work, then SUCCESS or FAILED
        once, then NOT_SERIALIZING."""
        if self._pid != 0:
            self._reap()
        if self.running:
            return int(SERIALIZER_STATE.SERIALIZING)
        if self._outcome is not None:
            outcome, self._outcome = self._outcome, None
            return outcome
        pending, self._pending = self._pending, SERIALIZER_STATE.NOT_SERIALIZING
        return int(pending)

    def _reap(self) -> None:
        pid, status = os.waitpid(self._pid, os.WNOHANG)
        if pid == 0:
            if time.perf_counter() - self._started > CHILD_TIMEOUT_S:
                log.error("snapshot_child_stuck", pid=self._pid, after_s=CHILD_TIMEOUT_S)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGKILL)
            return
        self._pid = 0
        if os.waitstatus_to_exitcode(status) != _EXIT_OK:
            log.error("snapshot_child_failed", exit=os.waitstatus_to_exitcode(status))
            self._outcome = int(SERIALIZER_STATE.FAILED)
            return
        self._thread = threading.Thread(target=self._finish, name="snapshot-retain", daemon=True)
        self._thread.start()

    def _finish(self) -> None:
        """Thread: rename the dump into place, drop the retained entries it no longer names,
        write the compacted journal (last: the rewrites of retained segments are paced and
        can take many seconds, and what the loop appends meanwhile would be its to copy)."""
        outcome = SERIALIZER_STATE.FAILED
        try:
            live = storage.decode_indexes(self.live_path, self.live_path.read_bytes())
            if self._cancelled.is_set():
                return
            os.replace(self.tmp_path, self.dump_path)
            if self.sync:
                storage.fsync_dir(self.dump_path.parent)
            prepared_ms = 0.0
            if self.journal is not None:
                self.journal.forget_dead(live, self._below, self._cancelled)
                prepared_at = time.perf_counter()
                self.journal.prepare_compaction(self._below, self._cancelled)
                prepared_ms = (time.perf_counter() - prepared_at) * 1000
            log.info(
                "snapshot_written",
                index=self._below + 1,
                bytes=self.dump_path.stat().st_size,
                live_entries=len(live),
                fork_ms=round(self.fork_ms, 2),
                compaction_prepared_ms=round(prepared_ms, 1),
                total_ms=round((time.perf_counter() - self._started) * 1000, 1),
            )
            outcome = SERIALIZER_STATE.SUCCESS
        except Interrupted:  # cancelled (it logs that): its paced work must not hold the loop
            pass
        except Exception as err:  # pysyncobj keeps the journal and tries again later
            log.error("snapshot_failed", error=repr(err))
        finally:
            self._outcome = int(outcome)
            self._thread = None

    def cancel(self) -> None:
        """Abandon the job (a snapshot from the leader replaces the state, a shutdown): kill the
        child, stop the thread's paced reclaiming between two batches (seconds of it on a
        backlog's adopted journal: the loop waited for all of it) and wait for it; nothing is
        renamed after. pysyncobj hears FAILED once. A job that finished
        and was not heard yet is dropped too: its SUCCESS would compact the leader's snapshot's
        log up to this job's index (campaign seed 9464: every entry gone)."""
        if not self.running:
            if self._outcome is not None:
                self._outcome = None
                self._pending = SERIALIZER_STATE.FAILED
            return
        self._cancelled.set()
        if self._pid != 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, 0)
            self._pid = 0
        thread = self._thread
        if thread is not None:
            thread.join()
        self._outcome = None
        self._pending = SERIALIZER_STATE.FAILED
        log.info("snapshot_cancelled", index=self._below + 1)


def _write(path: Path, data: bytes, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, storage.FILE_MODE)
    try:
        os.fchmod(fd, storage.FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
