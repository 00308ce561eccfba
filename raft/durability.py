"""Journal durability for pysyncobj, which never fsyncs on its own.

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
The `.meta` file (term, vote, commit index) and the snapshot rename are fsynced too (not `never`).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pysyncobj.journal as pysyncobj_journal
import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj.journal import FileJournal, MetaStorer

POLICIES = ("always", "batch", "never")
_policies: dict[str, str] = {}
_policies_lock = threading.Lock()
_original_create_journal = pysyncobj_journal.createJournal


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename or file creation in it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableFileJournal(FileJournal):  # type: ignore[misc]
    """pysyncobj's mmap journal plus an fsync policy and a `sync()` used before acks."""

    def __init__(self, journal_file: str, policy: str) -> None:
        super().__init__(journal_file)
        self.policy = policy
        self.dirty = False
        self.syncs = 0
        self._dir = Path(journal_file).parent

    def add(self, command: Any, idx: int, term: int) -> None:
        """Append a record; flush at once under `always`."""
        super().add(command, idx, term)
        self.dirty = True
        if self.policy == "always":
            self.sync()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Truncate the tail (conflicting entries) and make that durable before acking."""
        super().deleteEntriesFrom(entryFrom)
        self.dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop compacted entries, after making the dump's rename durable."""
        if self.policy != "never":
            fsync_dir(self._dir)  # the dump was renamed into place just before this call
        super().deleteEntriesTo(entryTo)
        self.dirty = True
        self.sync()

    def sync(self) -> bool:
        """msync + fsync the journal if anything changed since the last sync; True if it did."""
        if not self.dirty or self.policy == "never":
            self.dirty = False
            return False
        resizable = self._FileJournal__journalFile
        # the journal is a MAP_SHARED mmap of the file: its dirty pages are the file's page
        # cache, so fdatasync on the fd writes them (and the size) without a full-range msync
        os.fdatasync(resizable._ResizableFile__f.fileno())
        self.dirty = False
        self.syncs += 1
        return True


def _store_meta_durably(self: MetaStorer, meta: dict[str, Any]) -> None:
    """MetaStorer.storeMeta with fsync of the file and of its directory."""
    path = self.getPath()
    with open(path + ".tmp", "wb") as f:
        f.write(pysyncobj_journal.dumps(meta))
        f.flush()
        if _policies.get(path[: -len(".meta")], "batch") != "never":
            os.fsync(f.fileno())
    shutil.move(path + ".tmp", path)
    if _policies.get(path[: -len(".meta")], "batch") != "never":
        fsync_dir(Path(path).parent)


def _create_journal(journal_file: str | None = None) -> Any:
    with _policies_lock:
        policy = _policies.get(journal_file) if journal_file else None
    if journal_file is None or policy is None:
        return _original_create_journal(journal_file)
    return DurableFileJournal(journal_file, policy)


def register(journal_file: str, policy: str) -> None:
    """Make SyncObj instances created afterwards with `journal_file` use a durable journal."""
    if policy not in POLICIES:
        raise ValueError(f"fsync policy must be one of {POLICIES}, got {policy!r}")
    with _policies_lock:
        _policies[journal_file] = policy


def install() -> None:
    """Patch pysyncobj to build durable journals and fsync its meta file (idempotent)."""
    pysyncobj_syncobj.createJournal = _create_journal
    MetaStorer.storeMeta = _store_meta_durably
