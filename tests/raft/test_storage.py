"""raft.storage and the journal: checksums, torn tails, damage refused, old formats, disk full."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import cast

import cbor2
import pysyncobj.journal as pysyncobj_journal
import pytest
import structlog

from raft import durability, safe_pickle, storage
from raft.errors import DiskFullError, StorageError

RECOVER = "quorumq node recover n1"


def _journal(path: Path, policy: str = "batch") -> durability.DurableFileJournal:
    return durability.DurableFileJournal(str(path), policy, "n1")


def _filled(tmp_path: Path, count: int = 5) -> tuple[Path, list[tuple[bytes, int, int]]]:
    path = tmp_path / "raft.journal"
    journal = _journal(path)
    journal.setCurrentTerm(2, "127.0.0.1:1")
    for i in range(count):
        journal.add(b"\x00entry-%d" % i + b"x" * i, i + 1, 2)
    journal.sync()
    entries = [journal[i] for i in range(len(journal))]
    journal._destroy()
    return path, entries


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _record_offsets(path: Path) -> list[int]:
    return storage.scan_journal(path, path.read_bytes()).offsets


def test_records_round_trip_and_are_checksummed(tmp_path: Path) -> None:
    path, entries = _filled(tmp_path)
    assert path.read_bytes().startswith(storage.JOURNAL_MAGIC)
    reopened = _journal(path)
    assert [reopened[i] for i in range(len(reopened))] == entries
    assert reopened.getCurrentTerm() == 2
    assert reopened.getVotedForNodeId() == "127.0.0.1:1"
    reopened._destroy()


@pytest.mark.parametrize("where", ["payload", "index", "crc"])
def test_a_flipped_byte_in_a_middle_record_refuses_to_start(tmp_path: Path, where: str) -> None:
    """Damage with good records after it is not a torn tail: refuse, naming file, offset and
    the recovery command."""
    path, _ = _filled(tmp_path)
    offset = _record_offsets(path)[2]
    size = len(path.read_bytes())
    at = {"payload": offset + 26, "index": offset + 5, "crc": _record_offsets(path)[3] - 2}[where]
    _flip(path, at)
    with pytest.raises(StorageError) as caught:
        _journal(path)
    message = str(caught.value)
    assert str(path) in message and f"offset {offset}" in message and RECOVER in message
    assert caught.value.offset == offset
    assert len(path.read_bytes()) == size  # nothing was cut: the operator decides


def test_a_record_moved_to_another_offset_fails_its_checksum(tmp_path: Path) -> None:
    """The checksum covers the position: a valid record copied over another is caught."""
    path, _ = _filled(tmp_path, 4)
    offsets = _record_offsets(path)
    data = path.read_bytes()
    # records 1 and 2 have the same length only if their payloads do: make a same-size swap
    first = data[offsets[0] : offsets[1]]
    forged = data[: offsets[1]] + first + data[offsets[1] + len(first) :]
    path.write_bytes(forged)
    with pytest.raises(StorageError, match="fails its checksum"):
        _journal(path)


@pytest.mark.parametrize("damage", ["cut", "zero", "flip_last", "zero_pad"])
def test_a_torn_tail_is_cut_and_logged(tmp_path: Path, damage: str) -> None:
    """A partial last record (crash mid-write) is cut off with a log line; the rest loads."""
    path, entries = _filled(tmp_path)
    last = _record_offsets(path)[-1]
    data = path.read_bytes()
    if damage == "cut":
        path.write_bytes(data[: last + 11])
    elif damage == "zero":
        path.write_bytes(data[:last] + b"\0" * (len(data) - last))
    elif damage == "flip_last":
        _flip(path, len(data) - 7)
    else:  # a preallocated or zeroed block after the last good record
        path.write_bytes(data + b"\0" * 4096)
    with structlog.testing.capture_logs() as logs:
        journal = _journal(path)
    kept = entries if damage == "zero_pad" else entries[:-1]
    assert [journal[i] for i in range(len(journal))] == kept
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "journal_torn_tail_truncated"
    ]
    journal.add(b"\x00after", kept[-1][1] + 1, 3)  # appends after the cut
    journal._destroy()
    again = _journal(path)
    assert [again[i][1] for i in range(len(again))] == [e[1] for e in kept] + [kept[-1][1] + 1]
    again._destroy()


def test_a_damaged_header_refuses(tmp_path: Path) -> None:
    path, _ = _filled(tmp_path)
    _flip(path, 9)
    with pytest.raises(StorageError, match="offset 0"):
        _journal(path)


def test_delete_and_compact_keep_the_file_consistent(tmp_path: Path) -> None:
    path, entries = _filled(tmp_path, 8)
    journal = _journal(path)
    journal.deleteEntriesFrom(6)
    journal.deleteEntriesTo(2)
    journal.add(b"\x00new", 7, 3)
    journal._destroy()
    again = _journal(path)
    assert [again[i] for i in range(len(again))] == [*entries[2:6], (b"\x00new", 7, 3)]
    again._destroy()


# --- format 1 (pysyncobj's own), as written before this change --------------------------------


def _write_v1(path: Path, entries: list[tuple[bytes, int, int]], meta: dict[str, object]) -> None:
    old = pysyncobj_journal.FileJournal(str(path))
    for entry in entries:
        old.add(*entry)
    old._destroy()
    path.with_name(path.name + ".meta").write_bytes(pysyncobj_journal.dumps(meta))


def test_an_old_journal_and_meta_load_and_are_rewritten_with_checksums(tmp_path: Path) -> None:
    safe_pickle.install()
    path = tmp_path / "raft.journal"
    entries = [(b"\x00old-%d" % i, i + 1, 4) for i in range(6)]
    _write_v1(path, entries, {"currentTerm": 4, "votedForNodeId": "a:1", "raftCommitIndex": 5})
    with structlog.testing.capture_logs() as logs:
        journal = _journal(path)
    assert [journal[i] for i in range(len(journal))] == entries
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (4, "a:1")
    assert journal.getRaftCommitIndex() == 5
    assert "journal_migrated" in [e["event"] for e in logs]
    journal._destroy()
    assert path.read_bytes().startswith(storage.JOURNAL_MAGIC)
    assert Path(f"{path}.meta").read_bytes().startswith(storage.META_MAGIC)


def test_an_old_journal_with_a_torn_tail_is_cut(tmp_path: Path) -> None:
    safe_pickle.install()
    path = tmp_path / "raft.journal"
    entries = [(b"\x00old-%d" % i, i + 1, 4) for i in range(4)]
    _write_v1(path, entries, {"currentTerm": 4})
    data = path.read_bytes()
    (end,) = struct.unpack_from("<I", data, 36)
    path.write_bytes(data[: end - 5])  # the last record cut short
    journal = _journal(path)
    assert [journal[i] for i in range(len(journal))] == entries[:-1]
    journal._destroy()


# --- meta ------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "cut", "garbage_v1", "empty"])
def test_a_damaged_meta_refuses_to_start(tmp_path: Path, damage: str) -> None:
    """A term and vote that cannot be read are never reset silently (a node could vote twice)."""
    safe_pickle.install()
    path, _ = _filled(tmp_path)
    meta = Path(f"{path}.meta")
    data = meta.read_bytes()
    meta.write_bytes(
        {
            "flip": data[:-1] + bytes([data[-1] ^ 1]),
            "cut": data[:-3],
            "garbage_v1": b"\x80\x02not a pickle",
            "empty": b"",
        }[damage]
    )
    with pytest.raises(StorageError) as caught:
        _journal(path)
    assert str(meta) in str(caught.value) and RECOVER in str(caught.value)


def test_a_missing_meta_with_entries_of_a_term_refuses(tmp_path: Path) -> None:
    path, _ = _filled(tmp_path)
    Path(f"{path}.meta").unlink()
    with pytest.raises(StorageError, match="missing"):
        _journal(path)


# --- dump ------------------------------------------------------------------------------------


def _dump(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    body = {"format": 1, "fifo": b"state" * 100, "raft": {"last": [b"\x01", 42, 3]}}
    path = tmp_path / "raft.dump"
    path.write_bytes(storage.encode_dump(cbor2.dumps(body), 42))
    return path, body


@pytest.mark.parametrize("damage", ["flip_body", "flip_index", "cut", "cut_header"])
def test_a_damaged_snapshot_is_refused(tmp_path: Path, damage: str) -> None:
    path, _ = _dump(tmp_path)
    data = path.read_bytes()
    if damage == "flip_body":
        _flip(path, len(data) - 20)
    elif damage == "flip_index":
        _flip(path, 9)
    elif damage == "cut":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:10])
    with pytest.raises(StorageError) as caught:
        storage.read_dump_body(path, "n1")
    assert str(path) in str(caught.value) and RECOVER in str(caught.value)


def test_an_old_snapshot_loads_and_a_cut_old_snapshot_is_refused(tmp_path: Path) -> None:
    path, body = _dump(tmp_path)
    path.write_bytes(cbor2.dumps(body))  # format 1: the bare CBOR map
    assert storage.read_dump_body(path) == body
    path.write_bytes(cbor2.dumps(body)[:-30])
    with pytest.raises(StorageError, match="does not decode"):
        storage.read_dump_body(path, "n1")


# --- disk full and permissions ---------------------------------------------------------------


def test_enospc_is_undone_reported_and_cleared_when_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "full"
    monkeypatch.setenv(durability.FAULT_ENOSPC_ENV, str(flag))
    path, entries = _filled(tmp_path, 3)
    journal = _journal(path)
    size = len(path.read_bytes())
    flag.touch()
    with structlog.testing.capture_logs() as logs, pytest.raises(DiskFullError):
        journal.add(b"\x00lost", 4, 2)
    assert journal.disk_full and len(journal) == 3 and len(path.read_bytes()) == size
    assert [e["event"] for e in logs] == ["disk_full"]
    journal._next_probe = 0.0
    assert journal.probe_space() is False  # still full
    flag.unlink()
    journal._next_probe = 0.0
    # (cast: mypy would keep the narrowing of the assert above; the probe changed it)
    assert journal.probe_space() is True and not cast(bool, journal.disk_full)
    assert len(path.read_bytes()) == size  # the probe left nothing behind
    journal.add(b"\x00kept", 4, 2)
    journal._destroy()
    again = _journal(path)
    assert [again[i] for i in range(len(again))] == [*entries, (b"\x00kept", 4, 2)]
    again._destroy()


def test_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # even under a permissive umask
    try:
        path, _ = _filled(tmp_path / "node")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(f"{path}.meta").st_mode) == 0o600


@pytest.mark.parametrize("seed", range(6))
def test_power_loss_drops_only_what_was_not_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The test-only power-loss layer: after a cut, every synced record is there, the unsynced
    tail is gone or partly there (its last record torn, cut at the next start)."""
    monkeypatch.setenv(durability.FAULT_POWER_LOSS_ENV, "1")
    path, synced_entries = _filled(tmp_path, 5)  # synced by _filled
    journal = _journal(path)
    for i in range(5, 12):
        journal.add(b"\x00unsynced-%d" % i + b"y" * 50, i + 1, 2)
    journal._destroy()  # the process dies: nothing more is synced
    lost = storage.power_loss(path, seed)
    assert lost["synced"] < lost["size"] and lost["synced"] <= lost["kept"] <= lost["size"]
    again = _journal(path)
    kept = [again[i] for i in range(len(again))]
    assert kept[: len(synced_entries)] == synced_entries
    assert [e[1] for e in kept] == list(range(1, len(kept) + 1))
    again._destroy()
