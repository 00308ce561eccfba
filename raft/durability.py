"""The journal pysyncobj writes through: checksummed, fsynced by policy, no mmap.

Policies (`cluster.toml` `fsync`):
- `always`: every journal record is flushed (fdatasync) as it is added.
- `batch` (default): the journal is flushed once per AppendEntries message before the node
  acknowledges it (follower); once per burst of appended entries, right after sending them and
  before any ack is processed (leader); and before any reply is sent to a client.
- `never`: nothing is flushed; data survives a process crash but not a power loss.

Guarantee with `always` or `batch`: when a publish is confirmed, the log entry holding it is on
stable storage on a majority of the members (each follower counted towards the commit fsynced it
before acking; the leader fsynced it before its loop could read any ack for it).
With `never` the entry is only in the page cache of a majority (it survives kill -9, not a
kernel crash or a power loss).
The `.meta` file (term, vote, commit index) is written atomically (temporary file, fsync, rename,
directory fsync); so is a compacted journal and the snapshot (not under `never`).

Memory: the journal keeps each entry's offset, index and term (24 bytes), not its bytes. An
entry is read back from the file (`pread`, checksums verified: damage found then raises
`StorageError` rather than serve it) when pysyncobj asks for it, except the most recent ones, kept
in a bounded cache (`TAIL_CACHE_ENTRIES`, `TAIL_CACHE_BYTES`): sending AppendEntries and applying
committed entries read those, so the steady state does not touch the disk. A slice is a lazy view
read in chunks of `READ_CHUNK_BYTES` (applying a whole journal after a restart, a lagging
follower's catch-up). Before, every entry's bytes stayed in memory until log compaction (at
least 300 s): 21 MiB per node after the 120k-message benchmark.

The formats and what a start does with damage are in `raft.storage`. pysyncobj's own journal is
a MAP_SHARED mmap: a write to it on a full disk raises SIGBUS and kills the process with no log
line. This one writes with `pwrite`: a full disk is an ENOSPC error, the write is undone, the
node says `disk_full` to its clients (`DurableFileJournal.disk_full`) and probes once a second
until space returns.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import pysyncobj.journal as pysyncobj_journal
import pysyncobj.syncobj as pysyncobj_syncobj
import structlog
from pysyncobj.journal import Journal

from raft import storage
from raft.errors import DiskFullError, EntryGoneError, StorageError
from raft.export import entry_blob
from raft.retention import RetainedStore
from raft.storage import fsync_dir

__all__ = ["POLICIES", "DurableFileJournal", "fsync_dir", "install", "register"]

log = structlog.get_logger("raft.journal")

POLICIES = ("always", "batch", "never")
PROBE_INTERVAL_S = 1.0
PROBE_BYTES = 64 * 1024
# test-only fault hook: while the file this names exists, journal writes fail with ENOSPC
# (a relative path is relative to the node's working directory: its data dir under the launcher)
FAULT_ENOSPC_ENV = "QUORUMQ_TEST_ENOSPC_FLAG"
# test-only power-loss layer: when set, the journal records how much of it is on stable storage
# in `<journal>.synced` after every sync, so a fault can drop the rest (`raft.storage.power_loss`)
FAULT_POWER_LOSS_ENV = "QUORUMQ_TEST_POWER_LOSS"
# the most recent entries, kept in memory (AppendEntries and apply read them); the rest is read
# back from the file. 2 MiB is eight 256 KiB group-committed entries: more than a follower in
# step lags by; each node holds it whatever the backlog (issue 32's RAM per queued message)
TAIL_CACHE_ENTRIES = 4096
TAIL_CACHE_BYTES = 2 * 1024 * 1024
# other single entries pysyncobj reads back (mostly the log's first two, read every tick); a
# body read (`read_entry`) does not fill it: the bodies have their own cache (raft.bodies), and
# whole group-committed entries kept here held a drained leader's memory (up to 64 entries)
READ_CACHE_ENTRIES = 64
READ_CACHE_BYTES = 1024 * 1024  # and at most this many command bytes (64 group-committed
# entries of 16 KiB publishes held 16 MiB: pysyncobj reads the entry before each AppendEntries
# for its term, on both sides, and a follower behind the tail cache is sent from the file)
# a view is read back in chunks of about this many bytes (one pread each)
READ_CHUNK_BYTES = 1024 * 1024
# slices of at most this many entries are returned as lists; longer ones as lazy views
EAGER_SLICE_MAX = 64
# a compaction prepared off the loop copies the log in passes until less than this is left for
# the loop to copy at the swap (or the passes run out: appends outran the copy)
PREPARE_LEFT_BYTES = 1024 * 1024
PREPARE_PASSES_MAX = 8
COMPACTING_SUFFIX = ".compacting"
Entry = tuple[bytes, int, int]
_registered: dict[str, tuple[str, str | None]] = {}
_registered_lock = threading.Lock()
_original_create_journal = pysyncobj_journal.createJournal


class DurableFileJournal(Journal):  # type: ignore[misc]
    """A format-2 journal file (see `raft.storage`) with an fsync policy and `sync()`."""

    # entries read back, by absolute position (_dropped + position), their command bytes, and
    # the log's first entry apart (`_entry`)
    _read_cache: OrderedDict[int, Entry]
    _read_cache_bytes: int
    _first: Entry | None

    def __init__(self, journal_file: str, policy: str, node_id: str | None = None) -> None:
        self.path = Path(journal_file)
        self.meta_path = Path(journal_file + ".meta")
        self.policy = policy
        self.node_id = node_id
        self.dirty = False
        self.syncs = 0
        self.disk_full_since: float | None = None
        # the first damage found reading the journal back while running (a record that no
        # longer verifies, a file cut short under us): the node stops on it (raft.node)
        self.damage: StorageError | None = None
        self._next_probe = 0.0
        self._fault_flag = os.environ.get(FAULT_ENOSPC_ENV)
        self._track_synced = bool(os.environ.get(FAULT_POWER_LOSS_ENV))
        self._dir = self.path.parent
        self._fd = -1  # -1: not open
        storage.private_dir(self._dir)
        self._lock = threading.RLock()  # pysyncobj's status calls read from other threads
        # per entry, by position in the log: where its record starts, its index and term
        self._offsets, self._indexes, self._terms = array("Q"), array("Q"), array("Q")
        self._end = storage.JOURNAL_HEADER_BYTES
        # the last len(_tail) entries of the log; _tail_bytes: their command bytes
        self._tail: deque[Entry] = deque()
        self._tail_bytes = 0
        self._tail_max_entries = TAIL_CACHE_ENTRIES
        self._tail_max_bytes = TAIL_CACHE_BYTES
        self._eager_max = EAGER_SLICE_MAX
        self._clear_read_cache()
        self._dropped = 0  # entries compacted away from the front since the journal was opened
        # entries kept below the log's start because a snapshot names them live
        retained_dir = Path(journal_file + ".retained")
        self.retained = RetainedStore(
            retained_dir, policy, node_id, fault_flag=self._fault_flag, journal=self.path
        )
        self._snapshot_live: Sequence[int] = ()  # what the newest dump names live
        self._kept_below = -1  # retained trimmed to _snapshot_live below this (-1: not yet)
        self._snapshot_below = 0
        self._epoch = 0  # bumped when positions are reused (tail cut, clear): views go stale
        self._prepared: _Prepared | None = None  # written off the loop for deleteEntriesTo
        self.compacted_on_loop = 0  # entries the last compaction copied on the loop
        self._load()
        meta = storage.read_meta(self.meta_path, node_id)
        if meta is None and any(term > 0 for term in self._terms):
            raise StorageError(
                f"{self.meta_path}: missing while {self.path} holds entries of term > 0; the "
                f"term and vote are lost, so the node refuses to start (it could vote twice in a "
                f"term); {storage.recovery_hint(node_id)}",
                str(self.meta_path),
                0,
            )
        self._note_synced()  # what a start finds is what survived
        self._meta: dict[str, Any] = meta or {}
        self._meta_saved = True
        if meta is not None and not self.meta_path.read_bytes().startswith(storage.META_MAGIC):
            self._store_meta()  # format 1 -> 2
        elif meta is not None:
            os.chmod(self.meta_path, storage.FILE_MODE)

    # --- loading -----------------------------------------------------------------------------

    def _load(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # a prepare cut short by a crash
            os.unlink(self.path.with_name(self.path.name + COMPACTING_SUFFIX))
        if not self.path.exists():
            storage.write_atomically(self.path, storage.JOURNAL_HEADER, self.policy != "never")
        data = self.path.read_bytes()
        size = len(data)
        scan = storage.scan_journal(self.path, data, self.node_id, keep_commands=False)
        del data  # not kept: entries are read back when asked for
        if scan.torn_at is not None:
            last = scan.entries[-1][1] if scan.entries else None
            log.warning(
                "journal_torn_tail_truncated",
                file=str(self.path),
                offset=scan.torn_at,
                bytes=size - scan.torn_at,
                reason=scan.torn_reason,
                last_index=last,
                action="cut off; the node catches up from the leader",
            )
        if scan.version != storage.JOURNAL_VERSION or scan.end == 0:
            if scan.version != storage.JOURNAL_VERSION:
                log.info("journal_migrated", file=str(self.path), entries=len(scan.entries))
            self._rewrite(scan.entries)  # format 1 (commands kept) or an empty v2
        else:
            self._offsets = array("Q", scan.offsets)
            self._indexes = array("Q", (index for _cmd, index, _term in scan.entries))
            self._terms = array("Q", (term for _cmd, _index, term in scan.entries))
            self._end = scan.end
            if scan.torn_at is not None:
                os.truncate(self.path, scan.end)
            self._open()
            if scan.torn_at is not None and self.policy != "never":
                os.fsync(self._fd)

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR)
        os.fchmod(self._fd, storage.FILE_MODE)

    def _rewrite(self, entries: list[Entry]) -> None:
        """Replace the file with one holding `entries`, atomically (migration)."""
        self._write_new_file(iter([entries]))
        self._indexes = array("Q", (index for _cmd, index, _term in entries))
        self._terms = array("Q", (term for _cmd, _index, term in entries))
        self._tail.clear()
        self._tail_bytes = 0
        self._clear_read_cache()
        self._epoch += 1
        self._drop_prepared()

    def _write_new_file(self, batches: Iterator[list[Entry]]) -> None:
        """Write the entries of `batches` as a new file renamed over the old one (the old one is
        read until the rename); reopen it; set offsets and end. Nothing changes on an error."""
        offsets = array("Q")
        end = storage.JOURNAL_HEADER_BYTES

        def chunks() -> Iterator[bytes]:
            nonlocal end
            yield storage.JOURNAL_HEADER
            for batch in batches:
                records = []
                for command, index, term in batch:
                    record = storage.encode_record(end, command, index, term)
                    offsets.append(end)
                    records.append(record)
                    end += len(record)
                yield b"".join(records)

        self._check_fault()
        storage.write_atomically(self.path, chunks(), self.policy != "never")
        if self._fd >= 0:
            os.close(self._fd)
        self._open()
        self._offsets, self._end = offsets, end

    # --- reading back ----------------------------------------------------------------------------

    def _pread(self, offset: int, length: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < length:
            part = os.pread(self._fd, length - got, offset + got)
            if not part:
                raise StorageError(
                    f"{self.path}: journal ends at {offset + got} on read-back, its records run "
                    f"to {offset + length} (it was cut on disk after it was written); "
                    f"{storage.recovery_hint(self.node_id)}",
                    str(self.path),
                    offset + got,
                )
            parts.append(part)
            got += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_range(self, lo: int, hi: int) -> list[Entry]:
        """Entries at positions lo..hi-1 from the file (one pread), each verified against its
        checksums, its offset, and the index and term kept for it; damage raises StorageError
        and is kept in `damage` (the first found)."""
        try:
            return self._read_verified(lo, hi)
        except StorageError as err:
            if self.damage is None:
                self.damage = err
                log.error(
                    "journal_damaged",
                    file=str(self.path),
                    offset=err.offset,
                    error=str(err),
                    action="the node stops (exit 65)",
                )
            raise

    def _read_verified(self, lo: int, hi: int) -> list[Entry]:
        count = len(self._offsets)
        start = self._offsets[lo]
        buf = self._pread(start, (self._offsets[hi] if hi < count else self._end) - start)
        out: list[Entry] = []
        for position in range(lo, hi):
            offset = self._offsets[position]
            command, index, term, size = storage.decode_record(
                self.path, buf, offset - start, offset, self.node_id
            )
            after = self._offsets[position + 1] if position + 1 < count else self._end
            if (index, term) != (self._indexes[position], self._terms[position]) or (
                offset + size != after
            ):
                raise StorageError(
                    f"{self.path}: journal record at offset {offset} on read-back holds index "
                    f"{index} term {term} ({size} bytes), written as index "
                    f"{self._indexes[position]} term {self._terms[position]} "
                    f"({after - offset} bytes); {storage.recovery_hint(self.node_id)}",
                    str(self.path),
                    offset,
                )
            out.append((command, index, term))
        return out

    def _clear_read_cache(self) -> None:
        self._read_cache = OrderedDict()
        self._read_cache_bytes = 0
        self._first = None

    def _entry(self, position: int, cache: bool = True) -> Entry:
        """The entry at a valid position: from the tail cache, the read cache, or the file
        (kept in the read cache if `cache`). The log's first entry is kept apart: pysyncobj
        reads it (for its index) before each AppendEntries it sends, and other entries read
        back would push it out of the read cache."""
        in_tail = position - (len(self._offsets) - len(self._tail))
        if in_tail >= 0:
            return self._tail[in_tail]
        key = self._dropped + position
        if position == 0 and self._first is not None:
            return self._first
        entry = self._read_cache.get(key)
        if entry is not None:
            self._read_cache.move_to_end(key)
            return entry
        entry = self._read_range(position, position + 1)[0]
        if not cache:
            return entry
        if position == 0:
            self._first = entry
            return entry
        cached = self._read_cache
        cached[key] = entry
        self._read_cache_bytes += len(entry[0])
        while cached and (
            len(cached) > READ_CACHE_ENTRIES or self._read_cache_bytes > READ_CACHE_BYTES
        ):
            self._read_cache_bytes -= len(cached.popitem(last=False)[1][0])
        return entry

    def _chunk_end(self, lo: int, hi: int, chunk_bytes: int = READ_CHUNK_BYTES) -> int:
        """Where a chunk read from position lo (of a range ending at hi) stops: the entries
        starting within `chunk_bytes` of lo's, at least one."""
        stop = bisect.bisect_left(self._offsets, self._offsets[lo] + chunk_bytes, lo + 1, hi)
        return max(stop, lo + 1)

    def entries_within(self, position: int, chunk_bytes: int) -> int:
        """How many entries from `position` (valid) start within `chunk_bytes` of its start, at
        least one: from the offsets kept in memory, nothing read."""
        with self._lock:
            return self._chunk_end(position, len(self._offsets), chunk_bytes) - position

    def _fetch(self, lo: int, hi: int) -> list[Entry]:
        """Entries at positions lo..hi-1: the cached tail from memory, the rest in one read."""
        tail_from = len(self._offsets) - len(self._tail)
        if lo >= tail_from:
            return [self._tail[p - tail_from] for p in range(lo, hi)]
        cut = min(hi, tail_from)
        entries = self._read_range(lo, cut)
        entries.extend(self._tail[p - tail_from] for p in range(cut, hi))
        return entries

    # --- writing -----------------------------------------------------------------------------

    def _check_fault(self) -> None:
        if self._fault_flag is not None and os.path.exists(self._fault_flag):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def _pwrite(self, data: bytes, offset: int) -> None:
        self._check_fault()
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def _disk_full(self, err: OSError, what: str) -> DiskFullError:
        if self.disk_full_since is None:
            self.disk_full_since = time.monotonic()
            log.error(
                "disk_full",
                file=str(self.path),
                during=what,
                error=str(err),
                action="refusing client commands until space returns",
            )
        self._next_probe = time.monotonic() + PROBE_INTERVAL_S
        return DiskFullError(f"{self.path}: {err.strerror} while {what}")

    def add(self, command: Any, idx: int, term: int) -> None:
        """Append a record (undone on ENOSPC: DiskFullError, nothing added); flush under
        `always`."""
        command = pysyncobj_journal.to_bytes(command)
        record = storage.encode_record(self._end, command, idx, term)
        try:
            self._pwrite(record, self._end)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)
            if storage.is_enospc(err):
                raise self._disk_full(err, f"appending entry {idx}") from err
            raise
        entry = (command, idx, term)
        with self._lock:
            self._offsets.append(self._end)
            self._indexes.append(idx)
            self._terms.append(term)
            self._end += len(record)
            self._tail.append(entry)
            self._tail_bytes += len(command)
            while len(self._tail) > 1 and (
                len(self._tail) > self._tail_max_entries or self._tail_bytes > self._tail_max_bytes
            ):
                self._tail_bytes -= len(self._tail.popleft()[0])
        self.dirty = True
        if self.policy == "always":
            self.sync()

    def clear(self) -> None:
        """Drop every entry (a snapshot from the leader replaces the log)."""
        os.ftruncate(self._fd, storage.JOURNAL_HEADER_BYTES)
        with self._lock:
            self._offsets, self._indexes, self._terms = array("Q"), array("Q"), array("Q")
            self._end = storage.JOURNAL_HEADER_BYTES
            self._tail.clear()
            self._tail_bytes = 0
            self._clear_read_cache()
            self._epoch += 1
            self._drop_prepared()
        self.dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Cut the tail (conflicting entries); made durable before the next ack."""
        count = len(self._offsets)
        if entryFrom >= count:
            return
        with self._lock:
            self._end = self._offsets[entryFrom] if entryFrom > 0 else storage.JOURNAL_HEADER_BYTES
            os.ftruncate(self._fd, self._end)
            del self._offsets[entryFrom:]
            del self._indexes[entryFrom:]
            del self._terms[entryFrom:]
            for _ in range(min(count - len(self._offsets), len(self._tail))):
                self._tail_bytes -= len(self._tail.pop()[0])
            self._clear_read_cache()
            self._epoch += 1
            self._drop_prepared()
        self.dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop compacted entries, after making the dump's rename durable. The live entries
        among them (`_snapshot_live`) go to the retained store with the old file (`_adopt`);
        the new file is the one `prepare_compaction` wrote off the loop, when it matches (only
        the entries added since are copied here), or else all the kept entries are rewritten."""
        if self.policy != "never":
            fsync_dir(self._dir)  # the dump was renamed into place just before this call
        self.sync()
        with self._lock:
            kept = range(len(self._offsets))[entryTo:]
            dropped_bytes = self._offsets[kept.start] if kept else self._end
            adopted = self._adopt(kept.start)
            try:
                self._replace_file(kept)
            except BaseException:
                if adopted is not None:
                    self.retained.abandon(adopted)
                raise
            self._indexes = self._indexes[kept.start :]
            self._terms = self._terms[kept.start :]
            self._dropped += kept.start
            self._clear_read_cache()  # (entries below the new first one are gone)
            while len(self._tail) > len(self._offsets):
                self._tail_bytes -= len(self._tail.popleft()[0])
            below = self._indexes[0] if len(self._indexes) else 0
        log.info(
            "journal_compacted",
            dropped=kept.start,
            dropped_mib=round(dropped_bytes / 2**20, 1),
            kept=len(kept),
            copied_on_loop=self.compacted_on_loop,
            retained_segment=adopted,
        )
        # the dump naming _snapshot_live is durable: what it does not name below the log goes
        if below != self._kept_below:
            self._keep_only(self._snapshot_live, below)
        self.dirty = False
        if self.policy != "never":
            self._note_synced()

    def _adopt(self, stop: int) -> int | None:
        """Under the lock: hand the live entries (`_snapshot_live`) the log holds below position
        `stop` and the retained store does not to the retained store in place, the journal file
        becoming one of its segments (`RetainedStore.adopt`; the replace that follows leaves it
        there): nothing is copied. Copying them (a backlog's gigabyte at its first snapshot)
        saturated the disk and stalled the loops on their fsyncs (issue 32). The segment's
        number, or None if none was live."""
        count = len(self._indexes)
        if not count or stop == 0:
            return None
        first = self._indexes[0]
        below = self._indexes[stop] if stop < count else self._indexes[-1] + 1
        live = self._snapshot_live
        placed = []
        for index in live[bisect.bisect_left(live, first) : bisect.bisect_left(live, below)]:
            if index in self.retained:
                continue
            position = index - first
            end = self._offsets[position + 1] if position + 1 < count else self._end
            offset = self._offsets[position]
            placed.append((index, offset, end - offset, self._terms[position]))
        if not placed:
            return None
        try:
            return self.retained.adopt(placed, self._end, below)
        except OSError as err:
            if storage.is_enospc(err):
                raise self._disk_full(err, "handing live entries to the retained store") from err
            raise

    def _replace_file(self, kept: range) -> None:
        """Under the lock: make the journal file hold the `kept` positions only."""
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared.start == kept.start:
            self.compacted_on_loop = len(kept) - (prepared.stop - prepared.start)
            self._swap_in(prepared, kept.stop)
            return
        if prepared is not None:
            prepared.discard()
        self.compacted_on_loop = len(kept)

        def batches() -> Iterator[list[Entry]]:  # streamed from the old file, verified
            position = kept.start
            while position < kept.stop:
                stop = self._chunk_end(position, kept.stop)
                yield self._fetch(position, stop)
                position = stop

        self._write_new_file(batches())

    def prepare_compaction(
        self, first_index: int, interrupt: threading.Event | None = None
    ) -> None:
        """Snapshot thread, before pysyncobj compacts the log to `first_index`: write the file
        that compaction leaves (the entries from `first_index` on, as many as the log holds,
        copied in passes while the loop appends), synced, for `deleteEntriesTo` to finish and
        rename. Copied on the loop at a backlog's first snapshot, these were seconds of
        appends: a 0.8 s stall (issue 32). A cut, clear or compaction meanwhile discards it
        (the loop then rewrites as before), and so does a set `interrupt` (the job was
        cancelled); a write error discards it and raises (ENOSPC: DiskFullError, reported as
        for a journal write)."""
        self._drop_prepared()
        with self._lock:
            if not len(self._indexes) or not self._indexes[0] <= first_index <= self._indexes[-1]:
                return
            stamp = (self._epoch, self._dropped)
            start = first_index - self._indexes[0]
        prepared: _Prepared | None = None
        left: int | None = None
        try:
            prepared = _Prepared(self.path.with_name(self.path.name + COMPACTING_SUFFIX), start)
            for _ in range(PREPARE_PASSES_MAX):
                with self._lock:
                    target = len(self._offsets)
                left = self._copy_into(prepared, target, stamp, interrupt)
                if left is None or left < PREPARE_LEFT_BYTES:
                    break
            if left is not None and self.policy != "never":
                os.fsync(prepared.fd)
        except OSError as err:
            if prepared is not None:
                prepared.discard()
            if storage.is_enospc(err):
                raise self._disk_full(err, "writing the compacted journal") from err
            raise
        with self._lock:
            if left is not None and stamp == (self._epoch, self._dropped):
                self._prepared, prepared = prepared, None
        if prepared is not None:
            prepared.discard()

    def _copy_into(
        self,
        prepared: _Prepared,
        target: int,
        stamp: tuple[int, int],
        interrupt: threading.Event | None = None,
    ) -> int | None:
        """Copy the log's entries up to position `target` into `prepared`, a chunk at a time
        under the lock; the bytes the log then holds past them, or None if its positions
        changed (`stamp`) or `interrupt` was set."""
        while True:
            if interrupt is not None and interrupt.is_set():
                return None
            with self._lock:
                if stamp != (self._epoch, self._dropped):
                    return None
                if prepared.stop >= target:
                    count = len(self._offsets)
                    return self._end - self._offsets[prepared.stop] if prepared.stop < count else 0
                entries = self._fetch(prepared.stop, self._chunk_end(prepared.stop, target))
            self._check_fault()
            prepared.write(entries)

    def _swap_in(self, prepared: _Prepared, count: int) -> None:
        """Loop, under the lock: append the entries since the prepare, sync, rename over the
        journal, and read from the new file."""
        try:
            while prepared.stop < count:
                self._check_fault()
                prepared.write(self._fetch(prepared.stop, self._chunk_end(prepared.stop, count)))
            if self.policy != "never":
                os.fsync(prepared.fd)
            os.replace(prepared.path, self.path)
        except BaseException:
            prepared.discard()
            raise
        if self.policy != "never":
            fsync_dir(self._dir)
        os.close(self._fd)
        self._fd = prepared.fd
        self._offsets, self._end = prepared.offsets, prepared.end

    def _drop_prepared(self) -> None:
        with self._lock:
            prepared, self._prepared = self._prepared, None
        if prepared is not None:
            prepared.discard()

    def read_entry(self, raft_index: int) -> bytes:
        """The entry blob (our replicated method's argument, the CBOR map of `raft.entry`) of
        the entry at `raft_index`, from the log or the entries retained after compaction;
        checksums verified. EntryGoneError if none is held there; StorageError on damage.
        Thread-safe: the read is one pread under the journal lock (microseconds from the page
        cache), so the loop's appends wait at most that long."""
        command: bytes | None = None
        with self._lock:
            count = len(self._indexes)
            first = self._indexes[0] if count else None
            position = raft_index - first if first is not None else -1
            if 0 <= position < count:
                command = self._entry(position, cache=False)[0]
        if command is None:
            command = self.retained.read(raft_index)
        if command is None:
            where = "past the log's end" if first is None or raft_index >= first else "compacted"
            raise EntryGoneError(raft_index, f"{where} and not retained")
        kind, blob = entry_blob(command)
        if blob is None:
            raise EntryGoneError(raft_index, f"it holds no entry blob (a {kind} entry)")
        return blob

    # --- retention (raft.retention) ------------------------------------------------------------

    def read_record(self, raft_index: int) -> Entry | None:
        """(command, index, term) at `raft_index` from the log or the retained entries, or None
        if neither holds it (any thread; StorageError on damage)."""
        with self._lock:
            count = len(self._indexes)
            position = raft_index - self._indexes[0] if count else -1
            if 0 <= position < count:
                return self._entry(position)
        return self.retained.read_record(raft_index)

    @property
    def snapshot_live(self) -> tuple[Sequence[int], int]:
        """The live list the newest dump names and the index below which it is retained."""
        return self._snapshot_live, self._snapshot_below

    def add_retained(self, records: Iterable[Entry], what: str) -> int:
        """`retained.add`; a full disk raises DiskFullError and is reported as for a journal
        write (`disk_full`, probed until space returns); nothing is published."""
        try:
            return self.retained.add(records)
        except OSError as err:
            if storage.is_enospc(err):
                raise self._disk_full(err, what) from err
            raise

    def note_snapshot_live(self, live: Sequence[int], below: int) -> None:
        """The dump being written names `live`: the compaction that follows it keeps those."""
        self._snapshot_live, self._snapshot_below = live, below
        self._kept_below = -1

    def forget_dead(
        self, live: Sequence[int], below: int, interrupt: threading.Event | None = None
    ) -> None:
        """The dump naming `live` is durable: drop the retained entries it does not name below
        `below` (its first entry in the log) and reclaim their segments, paced (a set
        `interrupt` stops that: retention.Interrupted). Any thread (the snapshot worker): the
        compaction that follows skips this work once it is done."""
        self._snapshot_live, self._snapshot_below = live, below
        self._keep_only(live, below, paced=True, interrupt=interrupt)

    def _keep_only(
        self,
        live: Sequence[int],
        below: int,
        paced: bool = False,
        interrupt: threading.Event | None = None,
    ) -> None:
        """`retained.keep_only`; a full disk while rewriting a segment (reclaiming space) is
        reported as disk_full and leaves that segment as it was: the next snapshot tries again."""
        try:
            self.retained.keep_only(live, below, paced, interrupt)
        except OSError as err:
            if not storage.is_enospc(err):
                raise
            self._disk_full(err, "rewriting a retained segment")
        self._kept_below = below

    def load_live(self, live: Sequence[int], below: int, trust_log: bool = True) -> None:
        """A dump naming `live` was loaded (start, or a snapshot installed): keep `live` as
        the list the next compaction keeps; StorageError if one of them below `below` (the
        snapshot's first entry in the log) is neither retained nor in the log (with
        `trust_log` False, a snapshot from the leader about to replace the log: retained)."""
        self._snapshot_live, self._snapshot_below = live, below
        self._kept_below = -1
        with self._lock:
            first = self._indexes[0] if len(self._indexes) and trust_log else below
        gone = self.retained.missing(live, min(first, below))
        if gone:
            raise StorageError(
                f"{self.retained.directory}: the snapshot names {len(gone)} live entries that "
                f"are neither retained nor in the journal (first: index {gone[0]}); "
                f"{storage.recovery_hint(self.node_id)}",
                str(self.retained.directory),
                0,
            )

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> Sequence[Entry]: ...

    def __getitem__(self, item: int | slice) -> Entry | Sequence[Entry]:
        """An entry (negative positions count from the end), or a slice: a list if short, else
        a lazy view read back in chunks (valid until the log's tail is cut or cleared)."""
        if item == -1:  # the last entry, from the tail cache: pysyncobj asks ~17 times a tick
            with self._lock:
                if self._tail:
                    return self._tail[-1]
        with self._lock:
            count = len(self._offsets)
            if isinstance(item, slice):
                positions = range(count)[item]
                if not positions:
                    return []
                if len(positions) > self._eager_max:
                    return _View(self, positions)
                if positions.step == 1:  # one read (the read cache is for single entries)
                    return self._fetch(positions.start, positions.stop)
                return [self._entry(p) for p in positions]
            position = item + count if item < 0 else item
            if not 0 <= position < count:
                raise IndexError(f"journal position {item} out of range ({count} entries)")
            return self._entry(position)

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def file_bytes(self) -> int:
        """The journal file's length."""
        return self._end

    def _destroy(self) -> None:
        self._drop_prepared()
        self.retained.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def flush(self) -> None:
        """pysyncobj's flush: `sync()` does it under the policy."""

    def sync(self) -> bool:
        """fdatasync the journal if anything changed since the last sync; True if it did."""
        if not self.dirty or self.policy == "never":
            self.dirty = False
            return False
        os.fdatasync(self._fd)
        self.dirty = False
        self.syncs += 1
        self._note_synced()
        return True

    def _note_synced(self) -> None:
        """Test-only power-loss layer: record the journal's length now on stable storage."""
        if self._track_synced:
            storage.write_atomically(
                Path(f"{self.path}.synced"), str(self._end).encode("ascii"), sync=False
            )

    # --- disk full -----------------------------------------------------------------------------

    @property
    def disk_full(self) -> bool:
        """Whether the last journal write failed for lack of space (and no probe succeeded)."""
        return self.disk_full_since is not None

    def probe_space(self) -> bool:
        """While the disk is full, once a second: write (and cut off) a block past the end; True
        when space has returned."""
        if self.disk_full_since is None:
            return True
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + PROBE_INTERVAL_S
        try:
            self._pwrite(b"\0" * PROBE_BYTES, self._end)
            if self.policy != "never":
                os.fdatasync(self._fd)
        except OSError as err:
            if not storage.is_enospc(err):
                log.error("disk_probe_failed", file=str(self.path), error=str(err))
            return False
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)
        log.info(
            "disk_space_returned",
            file=str(self.path),
            after_s=round(now - self.disk_full_since, 1),
        )
        self.disk_full_since = None
        return True

    # --- meta --------------------------------------------------------------------------------

    def _store_meta(self) -> None:
        storage.write_atomically(
            self.meta_path, storage.encode_meta(self._meta), self.policy != "never"
        )
        self._meta_saved = True

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # pysyncobj sets it on every AppendEntries a follower handles: an unchanged value is
        # already what the file holds (or will, at the next one-second timer), nothing to write
        if self._meta.get("raftCommitIndex") == raftCommitIndex:
            return
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return int(self._meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # Raft: term and vote are durable before any message reflecting them is sent
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            try:
                self._store_meta()
            except OSError as err:  # the commit index is only a hint: retried next second
                log.error("meta_write_failed", file=str(self.meta_path), error=str(err))


class _Prepared:
    """A compacted journal file being written (`DurableFileJournal.prepare_compaction`): the
    log's entries from position `start` to `stop` (exclusive), at `offsets`, up to `end`."""

    __slots__ = ("end", "fd", "offsets", "path", "start", "stop")

    def __init__(self, path: Path, start: int) -> None:
        self.path, self.start, self.stop = path, start, start
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, storage.FILE_MODE)
        self.offsets = array("Q")
        self.end = 0
        try:
            os.fchmod(self.fd, storage.FILE_MODE)
            self._put(storage.JOURNAL_HEADER)
        except OSError:
            self.discard()
            raise

    def write(self, entries: list[Entry]) -> None:
        records = []
        for command, index, term in entries:
            record = storage.encode_record(self.end, command, index, term)
            self.offsets.append(self.end)
            records.append(record)
            self.end += len(record)
        data = b"".join(records)
        self.end -= len(data)
        self._put(data)
        self.stop += len(entries)

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, self.end)
            view, self.end = view[written:], self.end + written

    def discard(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _View(Sequence[Entry]):
    """A slice of the journal, read back chunk by chunk as it is iterated (the chunk last read
    is kept, so slicing what was just iterated does not read it again). It raises RuntimeError
    if used after the journal reused positions (a tail cut, a clear): it never answers entries
    other than those it was taken over."""

    __slots__ = ("_absolute", "_chunk", "_chunk_at", "_epoch", "_journal")

    def __init__(self, journal: DurableFileJournal, positions: range) -> None:
        self._journal = journal
        dropped = journal._dropped
        self._absolute = range(positions.start + dropped, positions.stop + dropped, positions.step)
        self._epoch = journal._epoch
        self._chunk_at = 0  # absolute position of _chunk[0]
        self._chunk: list[Entry] = []

    def _position(self, absolute: int) -> int:
        journal = self._journal
        position = absolute - journal._dropped
        if journal._epoch != self._epoch or not 0 <= position < len(journal._offsets):
            raise RuntimeError("journal view used after the entries it covers changed")
        return position

    def __len__(self) -> int:
        return len(self._absolute)

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        if isinstance(item, slice):
            sub = _View.__new__(_View)
            sub._journal, sub._epoch = self._journal, self._epoch
            sub._absolute = self._absolute[item]
            sub._chunk_at, sub._chunk = self._chunk_at, self._chunk
            return list(sub)
        absolute = self._absolute[item]
        if 0 <= absolute - self._chunk_at < len(self._chunk):
            return self._chunk[absolute - self._chunk_at]
        with self._journal._lock:
            return self._journal._entry(self._position(absolute))

    def __iter__(self) -> Iterator[Entry]:
        absolute = self._absolute
        if absolute.step != 1:
            for i in range(len(absolute)):
                yield self[i]
            return
        at = absolute.start
        while at < absolute.stop:
            if not 0 <= at - self._chunk_at < len(self._chunk):
                journal = self._journal
                with journal._lock:
                    lo = self._position(at)
                    hi = journal._chunk_end(lo, self._position(absolute.stop - 1) + 1)
                    self._chunk_at, self._chunk = at, journal._fetch(lo, hi)
            yield self._chunk[at - self._chunk_at]
            at += 1

    def __reversed__(self) -> Iterator[Entry]:
        for i in range(len(self._absolute) - 1, -1, -1):
            yield self[i]


def _create_journal(journal_file: str | None = None) -> Any:
    with _registered_lock:
        registered = _registered.get(journal_file) if journal_file else None
    if journal_file is None or registered is None:
        return _original_create_journal(journal_file)
    policy, node_id = registered
    return DurableFileJournal(journal_file, policy, node_id)


def register(journal_file: str, policy: str, node_id: str | None = None) -> None:
    """Make SyncObj instances created afterwards with `journal_file` use a durable journal."""
    if policy not in POLICIES:
        raise ValueError(f"fsync policy must be one of {POLICIES}, got {policy!r}")
    with _registered_lock:
        _registered[journal_file] = (policy, node_id)


def install() -> None:
    """Patch pysyncobj to build our journals (idempotent)."""
    pysyncobj_syncobj.createJournal = _create_journal
