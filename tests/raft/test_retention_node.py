"""Retention through a real in-process RaftNode (issue 32): read_entry, compaction, restart."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fifo
from cluster.launcher import free_ports, wait_until
from fifo.commands import DeclareQueue, Enqueue, Purge
from fifo.state import State
from raft import durability, snapshot_hooks, storage
from raft.entry import Entry, encode_entry
from raft.errors import EntryGoneError, StorageError
from raft.node import RaftNode, RaftSettings
from raft.replicated import Outcome


class Node:
    """One single-member RaftNode whose live entry indexes the test names (`live`)."""

    def __init__(self, data_dir: Path, port: int, live: set[int]) -> None:
        self.live = live
        self.blobs: dict[int, bytes] = {}  # raft index -> the blob submitted there
        self.outcomes: dict[int, Outcome] = {}
        self.changed = threading.Condition()
        settings = RaftSettings(
            node_id="n1",
            address=f"127.0.0.1:{port}",
            peers={},
            data_dir=data_dir,
            password="secret-for-tests",
            supported_version=2,
            incarnation=1,
            election_timeout_ms=(300, 500),
        )
        self.node = RaftNode(settings, self._on_outcome, live_indexes=self._live_indexes)
        self.next_batch = 1

    def _live_indexes(self, _state: State) -> list[int]:
        return sorted(self.live)

    def _on_outcome(self, outcome: Outcome) -> None:
        with self.changed:
            if outcome.origin is not None:
                self.outcomes[outcome.origin[2]] = outcome
            self.changed.notify_all()

    def run(self, *commands: Any) -> int:
        """Submit one batch, wait for it to apply; its raft index."""
        batch, self.next_batch = self.next_batch, self.next_batch + 1
        entry = Entry("cmds", int(time.time() * 1000), ("n1", 1, batch), cmds=tuple(
            fifo.encode(c) for c in commands))  # fmt: skip
        self.node.submit(entry)
        with self.changed:
            assert self.changed.wait_for(lambda: batch in self.outcomes, timeout=10)
        index = self.outcomes[batch].index
        self.blobs[index] = encode_entry(entry)
        return index

    def compact(self) -> None:
        """Force a snapshot and wait until the journal was compacted."""
        self.node.forceLogCompaction()
        wait_until(lambda: self.node.getStatus()["log_len"] < 10, 10, "compaction")

    def close(self) -> None:
        self.node.destroy_synchronous()


@pytest.fixture
def port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def node(tmp_path: Path, port: int) -> Iterator[Node]:
    one = Node(tmp_path, port, set())
    yield one
    one.close()


def test_read_entry_returns_the_blob_applied_at_an_index(node: Node) -> None:
    node.run(DeclareQueue("q"))
    indexes = [node.run(Enqueue("q", b"body-%d" % i)) for i in range(5)]
    for index in indexes:
        assert node.node.read_entry(index) == node.blobs[index]
    with pytest.raises(EntryGoneError):
        node.node.read_entry(indexes[-1] + 100)


def test_an_entry_whose_body_is_being_read_survives_a_compaction(node: Node) -> None:
    """A message delivered and settled in one step (a no-ack get) is no longer live, but the
    node still has to read its body back off the loop; an entry pinned by such a read in flight
    (`RaftNode.pinned_indexes`) is retained by a snapshot taken meanwhile."""
    node.run(DeclareQueue("q"))
    pinned = node.run(Enqueue("q", b"being read"))
    gone = node.run(Enqueue("q", b"not read"))
    node.node.pinned_indexes = lambda: [pinned]
    for i in range(20):
        node.run(Enqueue("q", b"later-%d" % i))
    node.compact()
    assert node.node.read_entry(pinned) == node.blobs[pinned]
    with pytest.raises(EntryGoneError):
        node.node.read_entry(gone)


def test_a_restart_after_compaction_keeps_the_live_entries_and_the_digest(
    tmp_path: Path, port: int
) -> None:
    """Dump + retained entries + journal tail give the same digest, and read_entry serves the
    entries the snapshot named live (and only those) after compaction and after a restart."""
    live: set[int] = set()
    first = Node(tmp_path, port, live)
    first.run(DeclareQueue("q"))
    indexes = [first.run(Enqueue("q", b"body-%d" % i)) for i in range(30)]
    live.update(indexes[::3])
    first.compact()
    for _ in range(5):
        first.run(Enqueue("q", b"tail"))
    log_start = first.node._journal()[0][1]
    assert first.node._journal().retained.indexes() == sorted(i for i in live if i < log_start)
    for index in indexes:
        if index in live or index >= log_start:
            assert first.node.read_entry(index) == first.blobs[index]
        else:
            with pytest.raises(EntryGoneError):
                first.node.read_entry(index)
    with first.node.lock:
        digest, applied = first.node.replicated_state.digest(), first.node.raftLastApplied
    first.close()

    second = Node(tmp_path, port, live)
    try:
        wait_until(lambda: second.node.raftLastApplied >= applied, 10, "replay")
        with second.node.lock:
            assert second.node.replicated_state.digest() == digest
        for index in sorted(live):
            assert second.node.read_entry(index) == first.blobs[index]
    finally:
        second.close()


def test_a_crash_between_the_dump_and_the_compaction_keeps_the_live_entries(
    tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the compaction the live entries below a snapshot are only in the journal. A
    crash after the dump was renamed into place but before the compaction: the start compacts
    the journal to the dump (`_align_journal_to_snapshot`) with the dump's live list, so they
    go to the retained store."""
    live: set[int] = set()
    first = Node(tmp_path, port, live)
    first.run(DeclareQueue("q"))
    indexes = [first.run(Enqueue("q", b"body-%d" % i)) for i in range(30)]
    live.update(indexes[::3])
    compactions: list[int] = []
    with monkeypatch.context() as patch:  # the crash: the compaction never runs
        patch.setattr(durability.DurableFileJournal, "deleteEntriesTo", compactions.append)
        first.node.forceLogCompaction()
        wait_until(lambda: compactions, 10, "the snapshot")
        first.close()
    assert first.node.getStatus()["log_len"] > 30
    second = Node(tmp_path, port, live)
    try:
        wait_until(lambda: second.node.getStatus()["log_len"] < 10, 10, "the start's compaction")
        assert second.node.storage_damage() is None
        for index in sorted(live):
            assert second.node.read_entry(index) == first.blobs[index]
    finally:
        second.close()


def test_a_drained_state_gives_the_retained_entries_back_at_once(node: Node) -> None:
    """Once the state holds no message, the retained entries go at the next check (a forced
    snapshot), not 5,000 entries or 300 s later; while one message is held nothing is forced."""
    node.run(DeclareQueue("q"))
    indexes = [node.run(Enqueue("q", b"body-%d" % i)) for i in range(20)]
    node.live.update(indexes)
    node.compact()
    journal = node.node._journal()
    assert len(journal.retained) > 0
    node.node._drained_checked_at = float("-inf")
    assert node.node.compact_if_drained() is False  # 20 messages held
    node.run(Purge("q"))
    node.live.clear()
    node.node._drained_checked_at = float("-inf")
    assert node.node.compact_if_drained() is True
    assert node.node.compact_if_drained() is False  # at most once a second
    wait_until(lambda: len(journal.retained) == 0, 10, "the forced snapshot")
    retained_dir = node.node.settings.data_dir / "raft.journal.retained"
    assert not list(retained_dir.glob("*.seg"))


def test_a_drained_state_with_a_big_journal_is_compacted_at_once(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big bodies fill the journal long before 5,000 entries: a drained state with a journal
    over DRAINED_JOURNAL_BYTES is compacted at once too, with nothing retained."""
    monkeypatch.setattr(snapshot_hooks, "DRAINED_JOURNAL_BYTES", 4096)
    node.run(DeclareQueue("q"))
    for i in range(10):
        node.run(Enqueue("q", b"x" * 1000 + b"%d" % i))
    node.node._drained_checked_at = float("-inf")
    assert node.node.compact_if_drained() is False  # 10 messages held
    node.run(Purge("q"))
    node.node._drained_checked_at = float("-inf")
    assert node.node.compact_if_drained() is True
    wait_until(lambda: node.node._journal().file_bytes < 4096, 10, "the forced snapshot")


def test_a_start_refuses_a_snapshot_naming_an_entry_that_is_gone(tmp_path: Path, port: int) -> None:
    live: set[int] = set()
    first = Node(tmp_path, port, live)
    first.run(DeclareQueue("q"))
    indexes = [first.run(Enqueue("q", b"body-%d" % i)) for i in range(10)]
    live.add(indexes[2])
    first.compact()
    first.close()
    for segment in (tmp_path / "raft.journal.retained").glob("*.seg"):
        segment.unlink()
    with pytest.raises(StorageError, match="names 1 live entries"):
        Node(tmp_path, port, live)


def test_a_snapshot_is_encoded_off_the_loop_while_entries_keep_applying(
    tmp_path: Path, port: int
) -> None:
    """The snapshot is encoded in a forked child: a provider that takes 1.5 s there (a huge
    state) does not hold up the node, which applies entries meanwhile; the compaction then
    completes and the state it wrote is the one as of the fork."""
    slow = Node(tmp_path, port, set())
    parent = os.getpid()
    seen_in: list[int] = []

    def slow_live(_state: State) -> list[int]:
        seen_in.append(os.getpid())  # appended in the child only if it runs there
        if os.getpid() != parent:
            time.sleep(1.5)
        return []

    slow.node.replicated_state.live_indexes_provider = slow_live
    try:
        slow.run(DeclareQueue("q"))
        for i in range(20):
            slow.run(Enqueue("q", b"body-%d" % i))
        slow.node.forceLogCompaction()
        wait_until(lambda: slow.node._snapshots.running, 10, "the snapshot child")
        applied_meanwhile = 0
        while slow.node._snapshots.running:  # the child is still encoding
            slow.run(Enqueue("q", b"meanwhile"))
            applied_meanwhile += 1
        assert applied_meanwhile >= 2
        wait_until(lambda: slow.node._journal()[0][1] > 20, 10, "compaction")
        assert seen_in == []  # never computed in this process
    finally:
        slow.close()


def test_a_failed_snapshot_keeps_the_journal_and_the_next_one_succeeds(
    tmp_path: Path, port: int
) -> None:
    one = Node(tmp_path, port, set())
    fail = [True]

    def flaky(_state: State) -> list[int]:
        if fail[0]:
            raise RuntimeError("planted")
        return []

    one.node.replicated_state.live_indexes_provider = flaky
    try:
        one.run(DeclareQueue("q"))
        for i in range(20):
            one.run(Enqueue("q", b"body-%d" % i))
        one.node.forceLogCompaction()
        wait_until(lambda: not one.node._snapshots.running, 10, "the failed child")
        assert one.node.getStatus()["log_len"] > 20
        fail[0] = False
        one.node.forceLogCompaction()
        wait_until(lambda: one.node.getStatus()["log_len"] < 10, 10, "compaction")
    finally:
        one.close()


def test_a_start_installs_the_live_entries_a_transfer_left_after_the_dump(
    tmp_path: Path, port: int
) -> None:
    """A crash after a snapshot transfer was renamed into place, before its live entries were
    moved out of the dump file: the next start moves them, then serves them."""
    live: set[int] = set()
    first = Node(tmp_path, port, live)
    first.run(DeclareQueue("q"))
    indexes = [first.run(Enqueue("q", b"body-%d" % i)) for i in range(10)]
    live.update(indexes[:3])
    first.compact()
    journal = first.node._journal()
    records = [journal.read_record(i) for i in sorted(live)]
    first.close()
    shutil.rmtree(tmp_path / "raft.journal.retained")
    trailer = bytearray(storage.TRANSFER_HEADER)
    for record in records:
        trailer += storage.encode_record(len(trailer), *record)
    dump = tmp_path / "raft.dump"
    dump.write_bytes(dump.read_bytes() + bytes(trailer))

    second = Node(tmp_path, port, live)
    try:
        for index in sorted(live):
            assert second.node.read_entry(index) == first.blobs[index]
        assert storage.dump_end(dump) == dump.stat().st_size
    finally:
        second.close()


def test_damage_found_in_a_retained_entry_stops_the_node_as_journal_damage_does(
    node: Node,
) -> None:
    """A retained record that went bad on disk is not served (StorageError) and, as for a
    damaged journal record, the node keeps it as its storage damage (the server exits 65 on it)
    and stops ticking, even when the read was made off the loop (the bodies worker)."""
    node.run(DeclareQueue("q"))
    indexes = [node.run(Enqueue("q", b"body-%d" % i)) for i in range(20)]
    node.live.update(indexes[:3])
    node.compact()
    segment = sorted((node.node.settings.data_dir / "raft.journal.retained").glob("*.seg"))[0]
    # (the segment is the journal file the compaction handed over: the journal's format)
    assert "-below-" in segment.name
    scan = storage.scan_segment(segment, segment.read_bytes(), header=storage.JOURNAL_HEADER)
    at = scan.offsets[[index for _command, index, _term in scan.entries].index(indexes[1])]
    with open(segment, "r+b") as f:  # in place, under the running node
        f.seek(at + 40)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    assert node.node.read_entry(indexes[0]) == node.blobs[indexes[0]]
    assert node.node.storage_damage() is None
    with pytest.raises(StorageError, match="fails its checksum"):
        node.node.read_entry(indexes[1])
    damage = node.node.storage_damage()
    assert damage is not None and damage.path == str(segment)
    wait_until(lambda: not node.node.tick_thread_alive(), 10, "the node to stop")


def test_a_full_disk_while_compacting_fails_the_snapshot_and_says_disk_full(
    tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC writing the compacted journal (the snapshot worker) fails that snapshot (the
    journal is kept) and the node says disk_full as for a journal write (its
    clients are refused with `disk_full`); once space returns the probe clears it and the next
    snapshot succeeds."""
    flag = tmp_path / "full"
    monkeypatch.setenv(durability.FAULT_ENOSPC_ENV, str(flag))
    one = Node(tmp_path / "data", port, set())
    try:
        one.run(DeclareQueue("q"))
        indexes = [one.run(Enqueue("q", b"body-%d" % i)) for i in range(20)]
        one.live.update(indexes[:5])
        flag.touch()
        one.node.forceLogCompaction()
        wait_until(one.node.disk_full, 10, "disk_full")
        wait_until(lambda: not one.node._snapshots.running, 10, "the failed snapshot")
        assert one.node.getStatus()["log_len"] > 20
        flag.unlink()
        wait_until(lambda: not one.node.disk_full(), 10, "the probe to find space")
        one.compact()
        assert [one.node.read_entry(i) for i in indexes[:5]] == [one.blobs[i] for i in indexes[:5]]
    finally:
        one.close()
