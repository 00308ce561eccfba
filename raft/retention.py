"""Entries kept after log compaction because the state still refers to their bodies (issue 32).

From machine v4 a message's body stays in the journal entry that enqueued it. A snapshot names
the entries still live (`fifo.live_entry_indexes`); when the journal is compacted up to the
snapshot, the live entries below it move here, and the rest are gone. Ra keeps the log segments
that hold live entries the same way.

Layout: `<journal>.retained/`, segment files `0000000001.seg`, `0000000002.seg`, ... (format in
`raft.storage`: a header, then journal records with their checksums). A compaction that leaves
live entries below the snapshot hands over the journal file itself (`adopt`: a hard link, made
just before the compacted file replaces it, so nothing is copied): `0000000003-below-N.seg`,
the journal's format, of which only the records below index N count (those at N and after are
the compacted journal's). A start finds such a link still naming the journal (a crash between
the link and the replace) and removes it: the journal holds them all. New entries go to the
newest segment until it holds `segment_bytes_max`, then a new one starts. A snapshot that no
longer names an entry drops it (in memory: its bytes are dead); a segment whose entries are all
dead is deleted, and one whose live share fell under `LIVE_SHARE_MIN_PERCENT` is rewritten (its
live entries copied to the newest segment, synced, then the old file deleted). So every sealed
segment is at least half live: the disk holds at most 2x the live bytes plus one segment.

Crash safety (the order the callers keep): entries are copied here and synced before the dump
naming them is renamed into place; entries are dropped and files deleted only after it is, so
the dump on disk never names an entry that is not here or in the journal. A start keeps what
the dump names (duplicates left by a crash during a rewrite are identical: any copy serves).

Threads: one writer at a time (the loop, or the snapshot worker); `read` from any thread.
Records are published (made readable) under the lock only once written; files are deleted under
it. Memory: 28 bytes per retained entry (index, place, length, term in arrays).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import threading
import time
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog

from raft import storage
from raft.errors import StorageError

__all__ = ["LIVE_SHARE_MIN_PERCENT", "REWRITE_BYTES_PER_S", "SEGMENT_BYTES_MAX", "RetainedStore"]

log = structlog.get_logger("raft.retention")

SEGMENT_BYTES_MAX = 8 * 1024 * 1024
LIVE_SHARE_MIN_PERCENT = 50
SEGMENT_SUFFIX = ".seg"
ADOPTED_MARK = "-below-"
# rewriting a segment copies at most this fast (the snapshot worker sleeps between batches): a
# rewrite of an adopted journal is up to half a gigabyte, and at disk speed it queued the nodes'
# journal fsyncs behind it
REWRITE_BYTES_PER_S = 16 * 1024 * 1024
REWRITE_BATCH_BYTES = 4 * 1024 * 1024
# a big segment is deleted (by the snapshot worker) a step at a time (`_shrink_gradually`)
SHRINK_STEP_BYTES = 32 * 1024 * 1024
SHRINK_PAUSE_S = 0.02
_OFFSET_BITS = 40  # a place is segment number << 40 | offset (segments are far below 1 TiB)
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
Record = tuple[bytes, int, int]  # (command, raft index, term), as the journal holds them
Placed = tuple[int, int, int, int]  # (raft index, place, record length, term)


class Interrupted(Exception):
    """The snapshot worker's reclaiming was stopped by its `interrupt` event (the job was
    cancelled: a snapshot from the leader, a shutdown). Every entry still has one place: the
    batches already copied were published, the rest stayed in their segment."""


def _pause(seconds: float, interrupt: threading.Event | None) -> None:
    """Sleep `seconds`, or until `interrupt` is set: then Interrupted."""
    if interrupt is None:
        time.sleep(seconds)
    elif interrupt.wait(seconds):
        raise Interrupted


class RetainedStore:
    """The retained entries of one node, in segment files under `directory`."""

    def __init__(
        self,
        directory: Path,
        policy: str,
        node_id: str | None = None,
        segment_bytes_max: int = SEGMENT_BYTES_MAX,
        fault_flag: str | None = None,
        journal: Path | None = None,
    ) -> None:
        self.directory = directory
        self._journal = journal  # the file `adopt` links from
        # test-only: while this file exists, writes fail with ENOSPC (the journal's hook,
        # raft.durability.FAULT_ENOSPC_ENV)
        self._fault_flag = fault_flag
        self.node_id = node_id
        self._sync = policy != "never"
        self._segment_bytes_max = segment_bytes_max
        self._lock = threading.RLock()
        self._indexes = array("Q")  # sorted raft indexes held
        self._places = array("Q")
        self._lengths = array("I")
        self._terms = array("Q")
        self._sizes: dict[int, int] = {}  # segment number -> its file's length
        self._live: dict[int, int] = {}  # segment number -> bytes of the records it holds
        self._fds: dict[int, int] = {}
        self._below: dict[int, int] = {}  # adopted segment number -> the index its records end
        self._active: int | None = None  # the segment appended to
        # the first damage found reading a record back while running: the node stops on it,
        # as on journal damage (DurableFileJournal.damage, raft.node)
        self.damage: StorageError | None = None
        if directory.exists():
            self._load()

    # --- loading -----------------------------------------------------------------------------

    def _path(self, segment: int) -> Path:
        below = self._below.get(segment)
        mark = "" if below is None else f"{ADOPTED_MARK}{below}"
        return self.directory / f"{segment:010d}{mark}{SEGMENT_SUFFIX}"

    def _load(self) -> None:
        found: dict[int, Placed] = {}
        for path in sorted(self.directory.glob("*" + SEGMENT_SUFFIX)):
            number, _mark, below = path.name[: -len(SEGMENT_SUFFIX)].partition(ADOPTED_MARK)
            segment = int(number)
            if below:
                if self._journal is not None and _same_file(path, self._journal):
                    log.warning("retained_adoption_undone", file=str(path))
                    path.unlink()  # the crash came before the replace: the journal holds all
                    continue
                self._below[segment] = int(below)
            for placed in self._scan(segment, path):
                if placed[0] < self._below.get(segment, placed[0] + 1):
                    found[placed[0]] = placed  # a later segment's copy wins (same bytes)
        for index in sorted(found):
            self._append_placed(found[index])
        if self._sizes:
            last = max(self._sizes)
            self._active = last if self._sizes[last] < self._segment_bytes_max else None

    def _scan(self, segment: int, path: Path) -> list[Placed]:
        data = path.read_bytes()
        header = storage.JOURNAL_HEADER if segment in self._below else storage.SEGMENT_HEADER
        scan = storage.scan_segment(path, data, self.node_id, header)
        if scan.torn_at is not None:
            log.warning(
                "retained_torn_tail_truncated",
                file=str(path),
                offset=scan.torn_at,
                reason=scan.torn_reason,
            )
            if scan.end < storage.SEGMENT_HEADER_BYTES:
                path.unlink()
                self._below.pop(segment, None)
                return []
            os.truncate(path, scan.end)
        self._sizes[segment] = scan.end
        self._live[segment] = 0
        ends = [*scan.offsets[1:], scan.end]
        return [
            (index, segment << _OFFSET_BITS | offset, end - offset, term)
            for (_command, index, term), offset, end in zip(
                scan.entries, scan.offsets, ends, strict=True
            )
        ]

    def _append_placed(self, placed: Placed) -> None:
        index, place, length, term = placed
        self._indexes.append(index)
        self._places.append(place)
        self._lengths.append(length)
        self._terms.append(term)
        self._live[place >> _OFFSET_BITS] += length

    # --- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._indexes)

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and self._position(index) is not None

    def indexes(self) -> list[int]:
        """The raft indexes held, sorted."""
        with self._lock:
            return list(self._indexes)

    def _position(self, index: int) -> int | None:
        at = bisect.bisect_left(self._indexes, index)
        return at if at < len(self._indexes) and self._indexes[at] == index else None

    def read(self, index: int) -> bytes | None:
        """The command of the retained entry at `index` (checksums verified), or None if it is
        not held; StorageError if its record no longer verifies (never served)."""
        record = self.read_record(index)
        return None if record is None else record[0]

    def read_record(self, index: int) -> Record | None:
        """(command, index, term) of the retained entry at `index`, as `read`."""
        with self._lock:
            at = self._position(index)
            if at is None:
                return None
            place, length, term = self._places[at], self._lengths[at], self._terms[at]
            segment, offset = place >> _OFFSET_BITS, place & _OFFSET_MASK
            path = self._path(segment)
            buf = os.pread(self._fd(segment), length, offset)
        try:
            command, found, found_term, size = storage.decode_record(
                path, buf, 0, offset, self.node_id
            )
            if (found, found_term, size) != (index, term, length):
                raise StorageError(
                    f"{path}: retained record at offset {offset} holds index {found} term "
                    f"{found_term} ({size} bytes), written as index {index} term {term} "
                    f"({length} bytes); {storage.recovery_hint(self.node_id)}",
                    str(path),
                    offset,
                )
        except StorageError as err:
            if self.damage is None:
                self.damage = err
                log.error(
                    "retained_entry_damaged",
                    file=str(path),
                    index=index,
                    error=str(err),
                    action="the node stops (exit 65)",
                )
            raise
        return command, index, term

    def _fd(self, segment: int) -> int:
        fd = self._fds.get(segment)
        if fd is None:
            fd = os.open(self._path(segment), os.O_RDWR)
            self._fds[segment] = fd
        return fd

    def missing(self, live: Sequence[int], below: int) -> list[int]:
        """The indexes of `live` below `below` that are not held."""
        with self._lock:
            return [index for index in live if index < below and self._position(index) is None]

    def stats(self) -> dict[str, int]:
        """entries, live_bytes (their records), disk_bytes (the segment files), segments."""
        with self._lock:
            return {
                "entries": len(self._indexes),
                "live_bytes": sum(self._live.values()),
                "disk_bytes": sum(self._sizes.values()),
                "segments": len(self._sizes),
            }

    # --- writing -----------------------------------------------------------------------------

    def add(self, records: Iterable[Record]) -> int:
        """Write the entries not held yet, sync, then make them readable; the number added.
        On an error (ENOSPC) nothing is published."""
        placed = self._write(record for record in records if record[1] not in self)
        placed.sort()
        with self._lock:
            if not placed or not self._indexes or placed[0][0] > self._indexes[-1]:
                for item in placed:
                    self._append_placed(item)
                return len(placed)
        self._merge(placed)
        return len(placed)

    def _merge(self, placed: list[Placed]) -> None:
        """Publish `placed` (sorted) among the entries held."""
        with self._lock:
            held = [
                (index, place, length, term)
                for index, place, length, term in zip(
                    self._indexes, self._places, self._lengths, self._terms, strict=True
                )
            ]
            self._indexes, self._places = array("Q"), array("Q")
            self._lengths, self._terms = array("I"), array("Q")
            self._live = dict.fromkeys(self._sizes, 0)
            for item in sorted(held + placed):
                self._append_placed(item)

    def adopt(self, placed: Sequence[Placed], size: int, below: int) -> int:
        """Take the journal file as a sealed segment holding the records `placed` (index,
        offset in the journal, record length, term; sorted, none held yet, all below `below`):
        a hard link, synced. The caller then replaces the journal by its compacted file (or
        calls `abandon` if it could not). The new segment's number."""
        if self._journal is None:
            raise ValueError("this store was opened without its journal")
        segment = max(self._sizes, default=0) + 1
        self._check_fault()
        storage.private_dir(self.directory)
        self._below[segment] = below
        try:
            os.link(self._journal, self._path(segment))
            if self._sync:
                storage.fsync_dir(self.directory)
        except OSError:
            self._path(segment).unlink(missing_ok=True)
            del self._below[segment]
            raise
        with self._lock:
            self._sizes[segment], self._live[segment] = size, 0
            at_end = not self._indexes or placed[0][0] > self._indexes[-1]
            if at_end:
                for index, offset, length, term in placed:
                    self._append_placed((index, segment << _OFFSET_BITS | offset, length, term))
        if not at_end:  # below what is held already (entries installed from a leader)
            self._merge([(i, segment << _OFFSET_BITS | o, n, t) for i, o, n, t in placed])
        return segment

    def abandon(self, segment: int) -> None:
        """Undo `adopt` (the journal was not replaced: the link must not outlive it)."""
        with self._lock:
            kept = [at for at, place in enumerate(self._places) if place >> _OFFSET_BITS != segment]
        self._keep_positions(kept)
        self._delete(segment)

    def _write(self, records: Iterable[Record]) -> list[Placed]:
        """Write records to the active segment (starting new ones as they fill); synced."""
        placed: list[Placed] = []
        touched: set[int] = set()
        for command, index, term in records:
            segment = self._writable_segment()
            offset = self._sizes[segment]
            record = storage.encode_record(offset, command, index, term)
            with self._lock:
                fd = self._fd(segment)
            try:
                self._check_fault()
                _pwrite_all(fd, record, offset)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, offset)
                raise
            self._sizes[segment] = offset + len(record)
            touched.add(segment)
            placed.append((index, segment << _OFFSET_BITS | offset, len(record), term))
        if self._sync:
            for segment in sorted(touched):
                with self._lock:
                    fd = self._fd(segment)
                os.fdatasync(fd)
        return placed

    def _writable_segment(self) -> int:
        active = self._active
        if active is not None and self._sizes[active] < self._segment_bytes_max:
            return active
        segment = max(self._sizes, default=0) + 1
        self._check_fault()
        storage.private_dir(self.directory)
        fd = os.open(self._path(segment), os.O_RDWR | os.O_CREAT | os.O_EXCL, storage.FILE_MODE)
        _pwrite_all(fd, storage.SEGMENT_HEADER, 0)
        if self._sync:
            os.fsync(fd)
            storage.fsync_dir(self.directory)
        with self._lock:
            self._fds[segment] = fd
            self._sizes[segment] = storage.SEGMENT_HEADER_BYTES
            self._live[segment] = 0
        self._active = segment
        return segment

    def _check_fault(self) -> None:
        if self._fault_flag is not None and os.path.exists(self._fault_flag):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def keep_only(
        self,
        live: Sequence[int],
        below: int,
        paced: bool = False,
        interrupt: threading.Event | None = None,
    ) -> None:
        """Keep the entries whose index is in `live` (sorted) and below `below`; drop the rest,
        then delete the segments left empty (the active one too) and rewrite the sealed ones
        under the live share (`paced`: at most REWRITE_BYTES_PER_S, for the snapshot worker,
        which a set `interrupt` stops between batches and steps: Interrupted). Call only once
        the dump naming `live` is durable."""
        wanted = set(live)
        # the one writer is this thread: the arrays are read without the lock, and only the
        # swap to the new ones takes it (readers wait for the swap, not the filtering)
        kept = [at for at, index in enumerate(self._indexes) if index < below and index in wanted]
        if len(kept) != len(self._indexes):
            self._keep_positions(kept)
        self._reclaim(paced, interrupt)

    def _keep_positions(self, kept: list[int]) -> None:
        indexes = array("Q", (self._indexes[at] for at in kept))
        places = array("Q", (self._places[at] for at in kept))
        lengths = array("I", (self._lengths[at] for at in kept))
        terms = array("Q", (self._terms[at] for at in kept))
        live = dict.fromkeys(self._sizes, 0)
        for place, length in zip(places, lengths, strict=True):
            live[place >> _OFFSET_BITS] += length
        with self._lock:
            self._indexes, self._places, self._lengths, self._terms = (
                indexes,
                places,
                lengths,
                terms,
            )
            self._live = live

    def _reclaim(self, paced: bool, interrupt: threading.Event | None) -> None:
        """Delete empty sealed segments; rewrite sealed ones whose live share is too low."""
        for segment in sorted(self._sizes):
            if interrupt is not None and interrupt.is_set():
                raise Interrupted
            live, size = self._live[segment], self._sizes[segment]
            if live == 0:  # the active one too: a drained queue leaves no segment behind
                self._delete(segment, paced, interrupt)
                if segment == self._active:
                    self._active = None
            elif segment == self._active:
                continue
            elif live * 100 < size * LIVE_SHARE_MIN_PERCENT:
                self._rewrite(segment, paced, interrupt)

    def _rewrite(self, segment: int, paced: bool, interrupt: threading.Event | None) -> None:
        """Copy a segment's held entries to the active one, a synced batch at a time (`paced`:
        at most REWRITE_BYTES_PER_S), each published as it is written; then delete it."""
        with self._lock:
            positions = [
                at for at, place in enumerate(self._places) if place >> _OFFSET_BITS == segment
            ]
            moving = [(self._indexes[at], self._terms[at], self._lengths[at]) for at in positions]
        started, copied, at = time.monotonic(), 0, 0
        while at < len(moving):
            batch: list[Record] = []
            batch_bytes = 0
            while at < len(moving) and (not batch or batch_bytes < REWRITE_BATCH_BYTES):
                index, term, length = moving[at]
                command = self.read(index)
                if command is None:  # (only this thread drops entries: never)
                    path = self._path(segment)
                    raise StorageError(f"{path}: index {index} vanished", str(path), 0)
                batch.append((command, index, term))
                batch_bytes += length
                at += 1
            placed = self._write(batch)
            with self._lock:
                for position, (_index, place, length, _term) in zip(
                    positions[at - len(batch) : at], placed, strict=True
                ):
                    self._places[position] = place
                    self._live[place >> _OFFSET_BITS] += length
                    self._live[segment] -= length
            copied += batch_bytes
            if paced:
                wait = started + copied / REWRITE_BYTES_PER_S - time.monotonic()
                _pause(max(0.0, wait), interrupt)
        log.info("retained_segment_rewritten", segment=segment, entries=len(moving))
        self._delete(segment, paced, interrupt)

    def _delete(
        self, segment: int, paced: bool = False, interrupt: threading.Event | None = None
    ) -> None:
        """Remove a segment no entry is placed in (`paced`: a big one shrunk first, unless
        `interrupt` is set: then it goes whole)."""
        with self._lock:
            path = self._path(segment)
            fd = self._fds.pop(segment, None)
            del self._sizes[segment], self._live[segment]
            self._below.pop(segment, None)
        if fd is not None:
            os.close(fd)
        if paced and not (self._journal is not None and _same_file(path, self._journal)):
            with contextlib.suppress(Interrupted):
                _shrink_gradually(path, interrupt)
        path.unlink(missing_ok=True)
        if self._sync:
            storage.fsync_dir(self.directory)

    def close(self) -> None:
        """Close the segment files."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _shrink_gradually(path: Path, interrupt: threading.Event | None = None) -> None:
    """Truncate a file SHRINK_STEP_BYTES at a time (a pause between steps) before it is
    unlinked. Unlinked whole, an adopted journal's gigabyte was freed (and, mounted with
    `discard`, trimmed) in one filesystem transaction, and the loops' fsyncs waited behind it:
    stalls of 110-140 ms on two nodes at once."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        while size > SHRINK_STEP_BYTES:
            size -= SHRINK_STEP_BYTES
            os.ftruncate(fd, size)
            _pause(SHRINK_PAUSE_S, interrupt)
    finally:
        os.close(fd)


def _same_file(one: Path, other: Path) -> bool:
    try:
        a, b = one.stat(), other.stat()
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
