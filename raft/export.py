"""Export a node's replicated log from disk (journal + dump), running or stopped, streaming.

The journal is read through `raft.storage` (either format, checksums verified). A command is
one type byte plus a pickle; for a REGULAR command the pickle is `(funcID, args[, kwargs])` and
our entry blob is `args[0]`. Pickles are read ONLY with `raft.safe_pickle`'s allow-list
unpickler. The entries are replayed through `ReplicatedState` so each command gets the exact meta
it was applied with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fifo
from fifo.meta import Meta
from fifo.replies import Error
from raft import safe_pickle, storage
from raft.entry import Entry, command_index, decode_entry
from raft.errors import EntryError, RaftError, StorageError
from raft.logfile import EndRecord, EntryRecord, Header, LoggedCommand, LogWriter, SnapshotRecord
from raft.machine_clock import machine_time
from raft.replicated import ReplicatedState

JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"
HEADER_BYTES = 40  # name (24) + version (8) + format (4) + last record offset (4)
LAST_OFFSET_AT = 36
REGULAR, NO_OP, MEMBERSHIP, VERSION = 0, 1, 2, 3
RAFT_KINDS = {NO_OP: "no_op", MEMBERSHIP: "membership", VERSION: "version"}
ProgressCallback = Callable[[int, int], None]  # (entries done, entries total)


class ExportError(RaftError):
    """Raised when a node's journal or dump cannot be read, or they do not line up."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One raw journal record."""

    index: int
    term: int
    command: bytes


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote."""

    node: str
    snapshot_index: int | None
    first_index: int | None
    last_index: int
    entries: int
    commands: int
    hellos: int
    upgrades: int
    commit_index: int
    effective_version: int
    digest: str
    bytes_written: int


# --- reading the journal -------------------------------------------------------------------------


def read_journal(path: Path) -> Iterator[JournalRecord]:
    """Yield the records of a journal (either format), verified; a torn tail is left out."""
    try:
        records = storage.scan_journal(path, path.read_bytes()).entries
    except StorageError as err:
        raise ExportError(str(err)) from err
    for command, index, term in records:
        yield JournalRecord(int(index), int(term), bytes(command))


def journal_bounds(path: Path) -> tuple[int, int, int]:
    """(first index, last index, count) of a journal, reading only its framing."""
    first, last, count = 0, 0, 0
    for record in read_journal(path):
        if count == 0:
            first = record.index
        last, count = record.index, count + 1
    return first, last, count


def entry_blob(command: bytes) -> tuple[str, bytes | None]:
    """(kind, our entry blob) of a journal command: kind is `cmds`-capable `regular` or raft's."""
    if not command:
        return "undecodable", None
    kind = command[0]
    if kind != REGULAR:
        return RAFT_KINDS.get(kind, "undecodable"), None
    try:
        decoded = safe_pickle.loads(command[1:])
    except Exception:  # a refused global or garbage: reported, never executed
        return "undecodable", None
    args = decoded[1] if isinstance(decoded, tuple) and len(decoded) >= 2 else ()
    blob = args[0] if isinstance(args, (list, tuple)) and args else None
    return (
        ("regular", bytes(blob)) if isinstance(blob, (bytes, bytearray)) else ("undecodable", None)
    )


def read_commit_index(journal: Path) -> int:
    """The commit index pysyncobj last saved next to the journal (0 if none)."""
    try:
        meta = storage.read_meta(Path(f"{journal}.meta")) or {}
    except StorageError:  # unreadable: nothing is known to be committed
        return 0
    value = meta.get("raftCommitIndex", 0) if isinstance(meta, dict) else 0
    return int(value) if isinstance(value, int) else 0


def read_dump(path: Path) -> dict[str, Any] | None:
    """Our CBOR dump (snapshot map + `raft` section), or None if the node never wrote one."""
    if not path.exists():
        return None
    try:
        return storage.read_dump_body(path)
    except StorageError as err:
        raise ExportError(f"{path} is not a readable quorumq dump: {err}") from err


# --- exporting -----------------------------------------------------------------------------------


class _Exporter:
    """Replays entries through a ReplicatedState and writes one record per entry."""

    def __init__(self, writer: LogWriter, members: list[str], commit_index: int) -> None:
        self.writer = writer
        self.state = ReplicatedState(members)
        self.commit_index = commit_index
        self.counts = {"entries": 0, "commands": 0, "hello": 0, "upgrade": 0}
        self.last_index = 0

    def start_from(self, dump: dict[str, Any]) -> int:
        """Write the snapshot record; returns its index."""
        raft = dump["raft"]
        index, term = int(raft["last"][1]), int(raft["last"][2])
        state = {k: v for k, v in dump.items() if k != "raft"}
        self.state.restore(state)
        self.writer.write(SnapshotRecord(index, term, state))
        self.last_index = index
        return index

    def entry(self, record: JournalRecord) -> None:
        """Apply and write one journal record."""
        kind, blob = entry_blob(record.command)
        uncommitted = record.index > self.commit_index
        base: dict[str, Any] = {"index": record.index, "term": record.term}
        if uncommitted:
            base["uncommitted"] = True
        entry: Entry | None = None
        if blob is not None:
            try:
                entry = decode_entry(blob)
            except EntryError:
                kind = "undecodable"
        self.counts["entries"] += 1
        self.last_index = record.index
        if entry is None:
            self.writer.write(EntryRecord("raft", raft_kind=kind, **base))  # type: ignore[arg-type]
            return
        self.writer.write(self._apply(entry, base))

    def _apply(self, entry: Entry, base: dict[str, Any]) -> EntryRecord:
        index, term = base["index"], base["term"]
        meta = self.state.meta
        now, _skew = machine_time(meta.last_time_ms, meta.effective_version, entry)
        before = self.state.meta.effective_version
        stale = self._stale_connections(entry, Meta(index, term, now, before))
        # every version this code knows, released or not: the log shows the cluster ran it
        # (a node runs an unreleased one only when allowed), so replaying it is no choice
        outcome = self.state.apply_entry(index, term, entry, max(fifo.MACHINES))
        base.update(ts_ms=entry.ts_ms, origin=entry.origin)
        refusal = next((r.message for r in outcome.replies if isinstance(r, Error)), None)
        if entry.kind == "cmds":
            commands = tuple(
                LoggedCommand(Meta(command_index(index, i), term, now, before), blob)
                for i, blob in enumerate(entry.cmds)
            )
            self.counts["commands"] += len(commands)
            return EntryRecord("cmds", commands=commands, **base)
        self.counts[entry.kind] += 1
        if entry.kind == "hello":
            return EntryRecord(
                "hello",
                commands=stale if refusal is None else (),
                node=entry.node,
                version=entry.version,
                incarnation=entry.incarnation,
                accepted=refusal is None,
                **base,
            )
        after = self.state.meta.effective_version
        return EntryRecord(
            "upgrade",
            from_version=before,
            version=entry.version,
            applied=after != before,
            reason=refusal,
            **base,
        )

    def _stale_connections(self, entry: Entry, meta: Meta) -> tuple[LoggedCommand, ...]:
        """The ConnectionDowns an accepted hello applies (as `ReplicatedState._apply_hello`)."""
        if entry.kind != "hello":
            return ()
        stale = self.state.stale_connection_downs(entry.node, entry.incarnation)
        return tuple(
            LoggedCommand(
                Meta(
                    command_index(meta.index, i),
                    meta.term,
                    meta.system_time_ms,
                    meta.machine_version,
                ),
                fifo.encode(command),
            )
            for i, command in enumerate(stale)
        )


def export_node(
    node_dir: Path,
    node_id: str,
    members: list[str],
    writer: LogWriter,
    progress: ProgressCallback | None = None,
) -> ExportSummary:
    """Write the header, the dump's snapshot, every journal entry above it and the end record."""
    journal, dump_path = node_dir / JOURNAL_FILE, node_dir / DUMP_FILE
    if not journal.exists() and not dump_path.exists():
        raise ExportError(f"{node_dir} holds no {JOURNAL_FILE} nor {DUMP_FILE}")
    commit_index = read_commit_index(journal)
    dump = read_dump(dump_path)
    total = journal_bounds(journal)[2] if journal.exists() else 0
    writer.write(Header(node_id, str(journal.resolve()), commit_index, int(time.time() * 1000)))
    exporter = _Exporter(writer, members, commit_index)
    snapshot_index = exporter.start_from(dump) if dump is not None else None
    first: int | None = None
    done = 0
    for record in read_journal(journal) if journal.exists() else iter(()):
        done += 1
        if snapshot_index is not None and record.index <= snapshot_index:
            continue
        if first is None:
            first = record.index
            _check_joins(snapshot_index, record.index)
        elif record.index != exporter.last_index + 1:
            raise ExportError(
                f"journal jumps from {exporter.last_index} to {record.index}: the node compacted "
                "its log during the export; run it again"
            )
        exporter.entry(record)
        if progress is not None and done % 256 == 0:
            progress(done, total)
    if progress is not None:
        progress(total, total)
    return _finish(exporter, node_id, snapshot_index, first)


def _check_joins(snapshot_index: int | None, first: int) -> None:
    expected = 1 if snapshot_index is None else snapshot_index + 1
    if first != expected:
        raise ExportError(
            f"the journal starts at {first} but the state is known up to {expected - 1} "
            "(compacted meanwhile, or a dump is missing); run it again"
        )


def _finish(
    exporter: _Exporter, node_id: str, snapshot_index: int | None, first: int | None
) -> ExportSummary:
    meta = exporter.state.meta
    digest = exporter.state.digest()
    counts = exporter.counts
    exporter.writer.write(
        EndRecord(
            counts["entries"],
            counts["commands"],
            exporter.last_index,
            meta.effective_version,
            digest,
            fifo.digest(exporter.state.state),
        )
    )
    return ExportSummary(
        node=node_id,
        snapshot_index=snapshot_index,
        first_index=first,
        last_index=exporter.last_index,
        entries=counts["entries"],
        commands=counts["commands"],
        hellos=counts["hello"],
        upgrades=counts["upgrade"],
        commit_index=exporter.commit_index,
        effective_version=meta.effective_version,
        digest=digest,
        bytes_written=exporter.writer.bytes_written,
    )


def export_to_file(
    node_dir: Path,
    node_id: str,
    members: list[str],
    out: Path,
    progress: ProgressCallback | None = None,
) -> ExportSummary:
    """`export_node` into a new file at `out` (removed again if the export fails)."""
    try:
        with LogWriter.open(out) as writer:
            return export_node(node_dir, node_id, members, writer, progress)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
