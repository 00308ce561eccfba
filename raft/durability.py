"""The journal pysyncobj writes through: checksummed, fsynced by policy, no mmap.

Policies (`cluster.toml` `fsync`):
- `always`: every journal record is flushed (fdatasync) as it is added.
- `batch` (default): the journal is flushed once per AppendEntries message before the node
  acknowledges it (follower); once per burst of appended entries, right after sending them and
  before any ack is processed (leader); and before any reply is sent to a client.
- `never`: nothing is flushed; data survives a process crash but not a power loss.

Guarantee with `always` or `batch`: when a publish is confirmed, the log entry holding it is on
stable storage on a majority of the members (each follower counted towards the commit fsynced it
before acking; the leader fsynced it before its tick thread could count any ack for it).
With `never` the entry is only in the page cache of a majority (it survives kill -9, not a
kernel crash or a power loss).
The `.meta` file (term, vote, commit index) is written atomically (temporary file, fsync, rename,
directory fsync); so is a compacted journal and the snapshot (not under `never`).

The formats and what a start does with damage are in `raft.storage`. pysyncobj's own journal is
a MAP_SHARED mmap: a write to it on a full disk raises SIGBUS and kills the process with no log
line. This one writes with `pwrite`: a full disk is an ENOSPC error, the write is undone, the
node says `disk_full` to its clients (`DurableFileJournal.disk_full`) and probes once a second
until space returns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pysyncobj.journal as pysyncobj_journal
import pysyncobj.syncobj as pysyncobj_syncobj
import structlog
from pysyncobj.journal import Journal

from raft import storage
from raft.errors import DiskFullError, StorageError
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
_registered: dict[str, tuple[str, str | None]] = {}
_registered_lock = threading.Lock()
_original_create_journal = pysyncobj_journal.createJournal


class DurableFileJournal(Journal):  # type: ignore[misc]
    """A format-2 journal file (see `raft.storage`) with an fsync policy and `sync()`."""

    def __init__(self, journal_file: str, policy: str, node_id: str | None = None) -> None:
        self.path = Path(journal_file)
        self.meta_path = Path(journal_file + ".meta")
        self.policy = policy
        self.node_id = node_id
        self.dirty = False
        self.syncs = 0
        self.disk_full_since: float | None = None
        self._next_probe = 0.0
        self._fault_flag = os.environ.get(FAULT_ENOSPC_ENV)
        self._track_synced = bool(os.environ.get(FAULT_POWER_LOSS_ENV))
        self._dir = self.path.parent
        self._fd = -1  # -1: not open
        storage.private_dir(self._dir)
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []
        self._load()
        meta = storage.read_meta(self.meta_path, node_id)
        if meta is None and any(term > 0 for _cmd, _idx, term in self._entries):
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
        if not self.path.exists():
            storage.write_atomically(self.path, storage.JOURNAL_HEADER, self.policy != "never")
        data = self.path.read_bytes()
        scan = storage.scan_journal(self.path, data, self.node_id)
        self._entries = scan.entries
        if scan.torn_at is not None:
            last = scan.entries[-1][1] if scan.entries else None
            log.warning(
                "journal_torn_tail_truncated",
                file=str(self.path),
                offset=scan.torn_at,
                bytes=len(data) - scan.torn_at,
                reason=scan.torn_reason,
                last_index=last,
                action="cut off; the node catches up from the leader",
            )
        if scan.version != storage.JOURNAL_VERSION or scan.end == 0:
            if scan.version != storage.JOURNAL_VERSION:
                log.info("journal_migrated", file=str(self.path), entries=len(scan.entries))
            self._rewrite(self._entries)
        else:
            self._offsets = scan.offsets
            self._end = scan.end
            if scan.torn_at is not None:
                os.truncate(self.path, scan.end)
            self._open()
            if scan.torn_at is not None and self.policy != "never":
                os.fsync(self._fd)

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR)
        os.fchmod(self._fd, storage.FILE_MODE)

    def _rewrite(self, entries: list[tuple[bytes, int, int]]) -> None:
        """Replace the file with one holding `entries`, atomically (compaction, migration)."""
        chunks = [storage.JOURNAL_HEADER]
        offsets: list[int] = []
        offset = storage.JOURNAL_HEADER_BYTES
        for command, index, term in entries:
            record = storage.encode_record(offset, command, index, term)
            offsets.append(offset)
            chunks.append(record)
            offset += len(record)
        self._check_fault()
        storage.write_atomically(self.path, b"".join(chunks), self.policy != "never")
        if self._fd >= 0:
            os.close(self._fd)
        self._open()
        self._entries, self._offsets, self._end = list(entries), offsets, offset

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
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self.dirty = True
        if self.policy == "always":
            self.sync()

    def clear(self) -> None:
        """Drop every entry (a snapshot from the leader replaces the log)."""
        os.ftruncate(self._fd, storage.JOURNAL_HEADER_BYTES)
        self._entries, self._offsets = [], []
        self._end = storage.JOURNAL_HEADER_BYTES
        self.dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Cut the tail (conflicting entries); made durable before the next ack."""
        if entryFrom >= len(self._entries):
            return
        self._end = self._offsets[entryFrom] if entryFrom > 0 else storage.JOURNAL_HEADER_BYTES
        os.ftruncate(self._fd, self._end)
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        self.dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop compacted entries, after making the dump's rename durable."""
        if self.policy != "never":
            fsync_dir(self._dir)  # the dump was renamed into place just before this call
        self.sync()
        self._rewrite(self._entries[entryTo:])
        self.dirty = False
        if self.policy != "never":
            self._note_synced()

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
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
