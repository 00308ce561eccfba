"""The exported log format (raft/logfile.py) and the journal + dump exporter (raft/export.py)."""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path
from typing import Any

import cbor2
import pytest
from pysyncobj.journal import FileJournal

import fifo
from fifo.commands import (
    Checkout,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    SimplePrefetch,
)
from fifo.meta import Meta
from raft.entry import Entry, command_index, encode_entry
from raft.export import ExportError, entry_blob, export_node, export_to_file, read_journal
from raft.logfile import (
    EndRecord,
    EntryRecord,
    Header,
    LogFileError,
    LoggedCommand,
    LogWriter,
    SnapshotRecord,
    read_log,
    read_records,
)
from raft.replicated import ReplicatedState

MEMBERS = ["n1", "n2", "n3"]
CONN = ConnectionId("n1", 7, 1)


def sample_records() -> list[Any]:
    command = LoggedCommand(Meta(command_index(3, 0), 2, 1000, 1), fifo.encode(DeclareQueue("q")))
    return [
        Header("n1", "/x/raft.journal", 4, 123),
        SnapshotRecord(2, 1, {"format": 1, "fifo": b"abc", "meta": {"x": 1}}),
        EntryRecord("cmds", 3, 2, 1000, ("n1", 7, 1), commands=(command,)),
        EntryRecord("hello", 4, 2, 1001, ("n2", 8, 1), node="n2", version=2, incarnation=8),
        EntryRecord(
            "upgrade",
            5,
            2,
            1002,
            None,
            True,
            from_version=1,
            version=2,
            applied=False,
            reason="n3 supports 1",
        ),
        EntryRecord("raft", 6, 3, raft_kind="no_op"),
        EndRecord(4, 1, 6, 1, "d" * 64, "f" * 64),
    ]


def write(records: list[Any]) -> bytes:
    buffer = io.BytesIO()
    writer = LogWriter(buffer)
    for record in records:
        writer.write(record)
    return buffer.getvalue()


def test_every_record_kind_round_trips_through_the_cbor_sequence() -> None:
    records = sample_records()
    assert list(read_records(io.BytesIO(write(records)))) == records


def test_the_file_is_a_plain_cbor_sequence_any_cbor_reader_can_walk() -> None:
    data = io.BytesIO(write(sample_records()))
    decoder = cbor2.CBORDecoder(data)
    kinds = [decoder.decode()["t"] for _ in range(7)]
    assert kinds == ["header", "snapshot", "cmds", "hello", "upgrade", "raft", "end"]
    assert data.read() == b""


def test_a_file_cut_short_is_reported_not_silently_accepted(tmp_path: Path) -> None:
    data = write(sample_records())
    path = tmp_path / "cut.log"
    path.write_bytes(data[:-5])  # inside the end record
    with pytest.raises(LogFileError, match="undecodable record"):
        list(read_log(path))
    path.write_bytes(data[: len(data) - len(cbor2.dumps({"t": "end"})) - 200])
    with pytest.raises(LogFileError):
        list(read_log(path))


def test_a_missing_end_record_means_cut_short_unless_asked_otherwise() -> None:
    data = write(sample_records()[:-1])
    with pytest.raises(LogFileError, match="cut short after index 6"):
        list(read_records(io.BytesIO(data)))
    assert len(list(read_records(io.BytesIO(data), require_end=False))) == 6


def test_records_are_yielded_before_a_bad_tail_is_reached() -> None:
    stream = io.BytesIO(write(sample_records()[:3]) + b"\xff\xff")
    reader = read_records(stream)
    assert isinstance(next(reader), Header)
    assert isinstance(next(reader), SnapshotRecord)
    assert isinstance(next(reader), EntryRecord)
    with pytest.raises(LogFileError):
        next(reader)


@pytest.mark.parametrize(
    "records, message",
    [
        ([EntryRecord("raft", 1, 1)], "first record must be the header"),
        ([Header("n", "s", 0, 0), Header("n", "s", 0, 0)], "second header"),
        (
            [Header("n", "s", 0, 0), EntryRecord("raft", 1, 1), EntryRecord("raft", 3, 1)],
            "entry 3 follows entry 1",
        ),
        (
            [Header("n", "s", 0, 0), EntryRecord("raft", 1, 1), SnapshotRecord(0, 0, {})],
            "snapshot record must come before",
        ),
        (
            [Header("n", "s", 0, 0), EndRecord(0, 0, 0, 1, ""), EntryRecord("raft", 1, 1)],
            "after the end record",
        ),
    ],
)
def test_the_writer_refuses_records_out_of_order(records: list[Any], message: str) -> None:
    with pytest.raises(LogFileError, match=message):
        write(records)


def test_a_foreign_cbor_file_is_refused_with_a_clear_message() -> None:
    other = cbor2.dumps({"t": "header", "format": "something-else", "version": 1})
    with pytest.raises(LogFileError, match="not a quorumq-log v1 file"):
        list(read_records(io.BytesIO(other)))
    with pytest.raises(LogFileError, match="must be a CBOR map"):
        list(read_records(io.BytesIO(cbor2.dumps([1, 2]))))
    with pytest.raises(LogFileError, match="empty log file"):
        list(read_records(io.BytesIO(b"")))


# --- the exporter, on journals written by pysyncobj's own FileJournal ----------------------------


def regular(blob: bytes) -> bytes:
    """A REGULAR journal command as pysyncobj writes it: type byte + pickle (funcID, args)."""
    return b"\x00" + pickle.dumps((0, (blob,)), protocol=2)


def cmds(ts: int, *commands: Any) -> bytes:
    return encode_entry(Entry("cmds", ts, ("n1", 7, 1), tuple(fifo.encode(c) for c in commands)))


def hello(node: str, version: int, incarnation: int = 1) -> bytes:
    return encode_entry(
        Entry("hello", 500, None, node=node, version=version, incarnation=incarnation)
    )


def upgrade(version: int) -> bytes:
    return encode_entry(Entry("upgrade", 900, None, version=version))


def traffic() -> list[bytes]:
    """A little log: hellos, a queue, enqueues, a checkout, a premature and a real upgrade."""
    return [
        hello("n1", 2),
        hello("n2", 2),
        cmds(1000, DeclareQueue("q", QueueConfig())),
        cmds(990, *(Enqueue("q", b"m%d" % i, connection=CONN) for i in range(3))),  # clock back
        upgrade(2),  # refused: n3 has not said hello yet
        hello("n3", 2),
        cmds(1100, Checkout("q", ConsumerId("c", CONN), SimplePrefetch(2))),
        upgrade(2),
        cmds(1200, Enqueue("q", b"late", connection=CONN)),
    ]


def write_journal(
    node_dir: Path, blobs: list[bytes], first: int = 1, raw: tuple[bytes, ...] = ()
) -> None:
    node_dir.mkdir(parents=True, exist_ok=True)
    journal = FileJournal(str(node_dir / "raft.journal"))
    index = first
    for command in [b"\x01", *raw]:  # pysyncobj starts a log with a NO_OP
        journal.add(command, index, 1)
        index += 1
    for blob in blobs:
        journal.add(regular(blob), index, 2)
        index += 1
    journal.setRaftCommitIndex(index - 2)
    journal.onOneSecondTimer()
    journal._destroy()


def replay(blobs: list[bytes], first: int = 2) -> ReplicatedState:
    from raft.entry import decode_entry

    state = ReplicatedState(MEMBERS)
    for offset, blob in enumerate(blobs):
        state.apply_entry(first + offset, 2, decode_entry(blob), 2)
    return state


def test_export_records_each_command_with_the_meta_it_was_applied_with(tmp_path: Path) -> None:
    write_journal(tmp_path / "n1", traffic())
    out = tmp_path / "out.log"
    summary = export_to_file(tmp_path / "n1", "n1", MEMBERS, out)
    records = list(read_log(out))
    entries = [r for r in records if isinstance(r, EntryRecord)]
    kinds = ["raft", "hello", "hello", "cmds", "cmds", "upgrade", "hello", "cmds", "upgrade"]
    kinds.append("cmds")
    assert [e.kind for e in entries] == kinds
    enqueues = entries[4].commands
    assert [c.meta for c in enqueues] == [
        Meta(command_index(5, i), 2, 1000, 1)
        for i in range(3)  # clock made monotonic
    ]
    refused, applied = entries[5], entries[8]
    assert (refused.applied, refused.reason is not None) == (False, True)
    assert "n3 supports unknown" in (refused.reason or "")
    assert (applied.applied, applied.from_version, applied.version) == (True, 1, 2)
    assert entries[9].commands[0].meta.machine_version == 2  # applied after the switch
    end = records[-1]
    assert isinstance(end, EndRecord)
    expected = replay(traffic())
    assert end.digest == expected.digest() == summary.digest
    assert end.fifo_digest == fifo.digest(expected.state)
    assert (summary.commands, summary.hellos, summary.upgrades) == (6, 3, 2)
    view = fifo.overview(expected.state, "q")
    assert view is not None and (view.total, view.checked_out) == (4, 2)


def test_entries_above_the_saved_commit_index_are_flagged(tmp_path: Path) -> None:
    write_journal(tmp_path / "n1", traffic())
    out = tmp_path / "out.log"
    export_to_file(tmp_path / "n1", "n1", MEMBERS, out)
    flags = [(r.index, r.uncommitted) for r in read_log(out) if isinstance(r, EntryRecord)]
    assert flags[-1] == (10, True)
    assert all(not flag for _, flag in flags[:-1])


def test_a_hello_from_a_node_older_than_the_effective_version_is_exported_as_refused(
    tmp_path: Path,
) -> None:
    blobs = [*traffic(), hello("n2", 1)]
    write_journal(tmp_path / "n1", blobs)
    out = tmp_path / "out.log"
    export_to_file(tmp_path / "n1", "n1", MEMBERS, out)
    last = [r for r in read_log(out) if isinstance(r, EntryRecord)][-1]
    assert (last.kind, last.node, last.version, last.accepted) == ("hello", "n2", 1, False)


def test_export_starts_from_the_dump_and_skips_the_entries_it_covers(tmp_path: Path) -> None:
    blobs = traffic()
    at = replay(blobs[:4])  # entries 2..5 are in the snapshot
    body = at.snapshot()
    body["raft"] = {"last": [b"", 5, 2], "prev": [b"", 4, 2], "cluster": []}
    node_dir = tmp_path / "n1"
    node_dir.mkdir()
    (node_dir / "raft.dump").write_bytes(cbor2.dumps(body))
    write_journal(node_dir, blobs)  # the journal still holds the covered entries too
    out = tmp_path / "out.log"
    summary = export_to_file(node_dir, "n1", MEMBERS, out)
    records = list(read_log(out))
    assert isinstance(records[1], SnapshotRecord) and records[1].index == 5
    assert isinstance(records[2], EntryRecord) and records[2].index == 6
    assert summary.digest == replay(blobs).digest()


def test_a_journal_that_does_not_reach_back_to_the_dump_is_refused(tmp_path: Path) -> None:
    write_journal(tmp_path / "n1", traffic()[3:], first=5)
    with pytest.raises(ExportError, match="journal starts at 5"):
        export_node(tmp_path / "n1", "n1", MEMBERS, LogWriter(io.BytesIO()))


def test_a_malicious_pickle_in_the_journal_is_never_executed(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (tmp_path / "pwned",))

    evil = b"\x00" + pickle.dumps((0, (Boom(),)), protocol=2)
    assert entry_blob(evil) == ("undecodable", None)
    write_journal(tmp_path / "n1", traffic()[:2], raw=(evil,))
    out = tmp_path / "out.log"
    export_to_file(tmp_path / "n1", "n1", MEMBERS, out)
    kinds = [r.raft_kind for r in read_log(out) if isinstance(r, EntryRecord) and r.kind == "raft"]
    assert kinds == ["no_op", "undecodable"]
    assert not (tmp_path / "pwned").exists()


def test_a_torn_journal_record_is_reported(tmp_path: Path) -> None:
    write_journal(tmp_path / "n1", traffic()[:3])
    path = tmp_path / "n1" / "raft.journal"
    data = bytearray(path.read_bytes())
    first_size = struct.unpack("<I", data[40:44])[0]
    data[44 + first_size : 48 + first_size] = b"\x00\x00\x00\x00"  # trailing length wrong
    path.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="torn"):
        list(read_journal(path))


def test_a_failed_export_leaves_no_partial_file(tmp_path: Path) -> None:
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "raft.journal").write_bytes(b"not a journal at all, clearly" * 3)
    out = tmp_path / "out.log"
    with pytest.raises(ExportError, match="not a journal"):
        export_to_file(tmp_path / "n1", "n1", MEMBERS, out)
    assert not out.exists()


def test_an_exported_log_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """An export holds every message body: 0600, as journals and snapshots are, even when a
    file of that name existed with wider rights."""
    fresh, existing = tmp_path / "fresh.qlog", tmp_path / "existing.qlog"
    existing.write_bytes(b"")
    existing.chmod(0o644)
    for path in (fresh, existing):
        with LogWriter.open(path):
            pass
        assert path.stat().st_mode & 0o777 == 0o600
