"""What an idle cluster still costs (issue 25 item 3): nothing written when nothing changed, and
an idle leader's heartbeat at its idle period."""

from __future__ import annotations

from pathlib import Path

import pytest

from raft import durability
from raft.durability import DurableFileJournal


def test_an_unchanged_commit_index_rewrites_no_meta_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj sets the commit index on every AppendEntries a follower handles: the meta file
    (temporary file, fsync, rename) is written again only when the value changed."""
    journal = DurableFileJournal(str(tmp_path / "raft.journal"), "batch", "n1")
    writes: list[bytes] = []
    real_write = durability.storage.write_atomically

    def counting(path: Path, data: bytes, sync: bool) -> None:
        writes.append(data)
        real_write(path, data, sync)

    monkeypatch.setattr(durability.storage, "write_atomically", counting)
    try:
        journal.setRaftCommitIndex(7)
        journal.onOneSecondTimer()
        assert len(writes) == 1
        for _ in range(3):  # idle heartbeats, one second apart
            journal.setRaftCommitIndex(7)
            journal.onOneSecondTimer()
        assert len(writes) == 1
        journal.setRaftCommitIndex(8)
        journal.onOneSecondTimer()
        assert len(writes) == 2
        journal.setCurrentTerm(3, "n2")  # term and vote: written at once, always
        assert len(writes) == 3
    finally:
        journal._destroy()
    again = DurableFileJournal(str(tmp_path / "raft.journal"), "batch", "n1")
    try:
        assert (again.getRaftCommitIndex(), again.getCurrentTerm()) == (8, 3)
        assert again.getVotedForNodeId() == "n2"
    finally:
        again._destroy()
