"""raft.retention and the journal's read-back of entries by Raft index (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pysyncobj.pickle as pysyncobj_pickle
import pytest

from raft import durability
from raft.entry import Entry, encode_entry
from raft.errors import EntryGoneError

NO_OP = b"\x01"


def _command(blob: bytes) -> bytes:
    """A journal command as pysyncobj writes our one replicated method's call."""
    return b"\x00" + bytes(pysyncobj_pickle.dumps((0, (blob,))))


def _blob(index: int, body_bytes: int = 100) -> bytes:
    return encode_entry(Entry("cmds", index, ("n1", 1, index), (b"%d" % index * body_bytes,)))


def _journal(path: Path) -> durability.DurableFileJournal:
    return durability.DurableFileJournal(str(path), "batch", "n1")


def _filled(path: Path, last: int) -> durability.DurableFileJournal:
    """A journal holding a no-op at index 1 and entry blobs at 2..last."""
    journal = _journal(path)
    journal.setCurrentTerm(1, None)
    journal.add(NO_OP, 1, 1)
    for index in range(2, last + 1):
        journal.add(_command(_blob(index)), index, 1)
    journal.sync()
    return journal


def test_read_entry_returns_the_applied_blob_of_an_entry_in_the_journal(tmp_path: Path) -> None:
    journal = _filled(tmp_path / "raft.journal", 10)
    assert journal.read_entry(2) == _blob(2)
    assert journal.read_entry(10) == _blob(10)
    journal._destroy()


def test_read_entry_of_an_index_not_held_or_not_a_blob_says_so(tmp_path: Path) -> None:
    journal = _filled(tmp_path / "raft.journal", 10)
    with pytest.raises(EntryGoneError, match="index 11"):
        journal.read_entry(11)
    with pytest.raises(EntryGoneError, match=r"index 1: .*no entry blob"):
        journal.read_entry(1)
    journal.deleteEntriesTo(5)  # entries 1..5 compacted away, none named live
    with pytest.raises(EntryGoneError, match="index 3"):
        journal.read_entry(3)
    assert journal.read_entry(6) == _blob(6)
    journal._destroy()
