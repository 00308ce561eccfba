"""raft.node with a real single-member pysyncobj cluster in this process: restart and wedging."""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cbor2
import pysyncobj.journal as pysyncobj_journal
import pytest
import structlog.testing
from pysyncobj.config import FAIL_REASON
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE

import fifo
from cluster.launcher import free_ports, wait_until
from fifo.commands import DeclareQueue, Enqueue
from raft import appends, snapshot_hooks, storage
from raft.durability import DurableFileJournal
from raft.entry import Entry, encode_entry
from raft.errors import StorageError
from raft.node import RaftNode, RaftSettings
from raft.replicated import Outcome
from raft.transfer import TRANSFER_BUFFERED_MAX, TRANSFER_RETRY_S


class Harness:
    """One RaftNode plus the outcomes it produced, keyed by batch id."""

    def __init__(self, data_dir: Path, port: int, fsync: str = "batch") -> None:
        self.outcomes: dict[int, Outcome] = {}
        self.dirty_at_reply: list[bool] = []
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
            fsync=fsync,
        )
        self.node = RaftNode(settings, self._on_outcome)
        self.next_batch = 1

    def _on_outcome(self, outcome: Outcome) -> None:
        self.dirty_at_reply.append(bool(self.node._journal().dirty))
        with self.changed:
            if outcome.origin is not None:
                self.outcomes[outcome.origin[2]] = outcome
            self.changed.notify_all()

    def run(self, *commands: Any) -> list[Any]:
        """Submit one batch and wait for its replies."""
        batch = self.next_batch
        self.next_batch += 1
        blobs = tuple(fifo.encode(c) for c in commands)
        self.node.submit(Entry("cmds", int(time.time() * 1000), ("n1", 1, batch), cmds=blobs))
        with self.changed:
            assert self.changed.wait_for(lambda: batch in self.outcomes, timeout=10)
        return self.outcomes[batch].replies

    def digest(self) -> str:
        with self.node.lock:
            return self.node.replicated_state.digest()

    def close(self) -> None:
        self.node.destroy_synchronous()


@pytest.fixture
def port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def harness(tmp_path: Path, port: int) -> Iterator[Harness]:
    h = Harness(tmp_path, port)
    yield h
    h.close()


def test_restart_from_journal_and_dump_gives_an_equal_digest(tmp_path: Path, port: int) -> None:
    """State rebuilt from the CBOR dump plus the journal tail equals the state before."""
    first = Harness(tmp_path, port)
    first.run(DeclareQueue("q"))
    for i in range(30):
        first.run(*[Enqueue("q", b"m%d-%d" % (i, j)) for j in range(5)])
    first.node.forceLogCompaction()
    wait_until(lambda: (tmp_path / "raft.dump").exists(), 10, "the dump")
    wait_until(lambda: first.node.getStatus()["log_len"] < 10, 10, "compaction")
    for i in range(10):  # a journal tail after the snapshot
        first.run(Enqueue("q", b"tail%d" % i))
    before, applied = first.digest(), first.node.replicated_state.meta.last_index
    first.close()

    second = Harness(tmp_path, port)
    try:
        wait_until(lambda: second.node.replicated_state.meta.last_index == applied, 10, "replay")
        assert second.digest() == before
        assert fifo.overview(second.node.replicated_state.state, "q").total == 160  # type: ignore[union-attr]
    finally:
        second.close()


def test_an_exception_in_apply_stops_applying_at_that_entry(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raising apply (a bug) stops applying on the node at that entry: nothing after it is
    applied, the status says stopped with the entry index and the traceback, and no snapshot
    of the half-applied state is written."""
    harness.run(DeclareQueue("q"))
    applied = harness.node.replicated_state.meta.last_index
    real_apply = fifo.apply

    def broken(meta: Any, command: Any, state: Any) -> Any:
        if isinstance(command, Enqueue) and command.body == b"boom":
            raise RuntimeError("injected bug")
        return real_apply(meta, command, state)

    monkeypatch.setattr(fifo, "apply", broken)
    blobs = (fifo.encode(Enqueue("q", b"boom")),)
    harness.node.submit(Entry("cmds", int(time.time() * 1000), ("n1", 1, 99), cmds=blobs))
    wait_until(lambda: harness.node.stopped_reason is not None, 10, "the stop")
    status = harness.node.status(with_digest=False)
    assert status["role"] == "stopped"
    assert f"applying entry {applied + 1} raised RuntimeError('injected bug')" in status["reason"]
    assert "Traceback" in status["traceback"] and "injected bug" in status["traceback"]
    assert harness.node.replicated_state.meta.last_index == applied + 1  # the metadata moved
    blobs = (fifo.encode(Enqueue("q", b"after")),)
    harness.node.submit(Entry("cmds", int(time.time() * 1000), ("n1", 1, 100), cmds=blobs))
    wait_until(lambda: harness.node.getStatus()["commit_idx"] >= applied + 2, 10, "the commit")
    assert 100 not in harness.outcomes and 99 not in harness.outcomes
    assert fifo.overview(harness.node.replicated_state.state, "q").total == 0  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="half-applied"):
        harness.node._serialize_snapshot(str(harness.node.settings.data_dir / "x"), (None,) * 3)


@pytest.mark.parametrize("fsync", ["batch", "always"])
def test_the_journal_is_on_disk_before_a_reply_is_released(
    tmp_path: Path, port: int, fsync: str
) -> None:
    """With a safe policy every outcome is handed out with no unsynced journal record."""
    harness = Harness(tmp_path, port, fsync)
    try:
        harness.run(DeclareQueue("q"))
        for i in range(20):
            harness.run(Enqueue("q", b"%d" % i))
        journal = harness.node._journal()
        assert isinstance(journal, DurableFileJournal) and journal.policy == fsync
        assert journal.syncs >= 21
        assert harness.dirty_at_reply and not any(harness.dirty_at_reply)
    finally:
        harness.close()


def test_a_peer_handshake_that_hears_nothing_is_dropped_and_dialed_again(tmp_path: Path) -> None:
    """A peer that accepts the connection but never answers (paused, cut off) must not hold it
    half-open for ever: pysyncobj checks timeouts only on I/O, so without our watchdog it never
    dials again and that peer never catches up (issue 17)."""
    ports = sorted(free_ports(2), key=lambda p: f"127.0.0.1:{p}")
    peer_port, our_port = ports  # pysyncobj dials from the greater address to the lesser
    listener = socket.create_server(("127.0.0.1", peer_port))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])  # and never say a word

    acceptor = threading.Thread(target=accept, name="silent-peer", daemon=True)
    acceptor.start()
    settings = RaftSettings(
        node_id="n1",
        address=f"127.0.0.1:{our_port}",
        peers={"n2": f"127.0.0.1:{peer_port}"},
        data_dir=tmp_path,
        password="secret-for-tests",
        supported_version=2,
        incarnation=1,
        election_timeout_ms=(300, 500),
    )
    node = RaftNode(settings, lambda _outcome: None)
    try:
        wait_until(lambda: len(accepted) >= 2, 10, "a second dial after the silent handshake")
    finally:
        node.destroy_synchronous()
        with contextlib.suppress(OSError):  # wakes the acceptor: a close alone does not (Linux)
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        acceptor.join(5)
        for conn in accepted:
            conn.close()


def _fill_with_snapshot_and_tail(harness: Harness, path: Path) -> tuple[str, int]:
    harness.run(DeclareQueue("q"))
    for i in range(20):
        harness.run(*[Enqueue("q", b"m%d-%d" % (i, j)) for j in range(5)])
    harness.node.forceLogCompaction()
    wait_until(lambda: (path / "raft.dump").exists(), 10, "the dump")
    wait_until(lambda: harness.node.getStatus()["log_len"] < 10, 10, "compaction")
    for i in range(10):
        harness.run(Enqueue("q", b"tail%d" % i))
    return harness.digest(), harness.node.replicated_state.meta.last_index


def test_files_written_before_checksums_load_after_an_upgrade(tmp_path: Path, port: int) -> None:
    """A rolling restart onto this code: pysyncobj's own journal and pickled meta and a bare
    CBOR dump (the formats before issue 12) load to the same state, and are rewritten with
    checksums (the journal and meta at start, the dump at the next snapshot)."""
    first = Harness(tmp_path, port)
    before, applied = _fill_with_snapshot_and_tail(first, tmp_path)
    first.close()
    journal = tmp_path / "raft.journal"
    entries = storage.scan_journal(journal, journal.read_bytes()).entries
    meta = storage.read_meta(Path(f"{journal}.meta"))
    dump = storage.read_dump_body(tmp_path / "raft.dump")
    journal.unlink()
    old = pysyncobj_journal.FileJournal(str(journal))
    for entry in entries:
        old.add(*entry)
    old._destroy()
    Path(f"{journal}.meta").write_bytes(pysyncobj_journal.dumps(meta))
    (tmp_path / "raft.dump").write_bytes(cbor2.dumps(dump))

    second = Harness(tmp_path, port)
    try:
        wait_until(lambda: second.node.replicated_state.meta.last_index == applied, 10, "replay")
        assert second.digest() == before
        assert journal.read_bytes().startswith(storage.JOURNAL_MAGIC)
        assert Path(f"{journal}.meta").read_bytes().startswith(storage.META_MAGIC)
        second.run(Enqueue("q", b"after"))
        second.node.forceLogCompaction()
        wait_until(
            lambda: (tmp_path / "raft.dump").read_bytes().startswith(storage.DUMP_MAGIC),
            10,
            "a checksummed dump",
        )
    finally:
        second.close()


def test_a_cut_snapshot_stops_the_start_before_anything_is_bound(tmp_path: Path, port: int) -> None:
    """Before issue 12 a node with a truncated dump ran with an empty state at index 0, voting
    and acknowledging; now it refuses to start and never binds its raft port."""
    first = Harness(tmp_path, port)
    _fill_with_snapshot_and_tail(first, tmp_path)
    first.close()
    dump = tmp_path / "raft.dump"
    dump.write_bytes(dump.read_bytes()[:-100])
    with pytest.raises(StorageError, match="quorumq node recover n1") as caught:
        Harness(tmp_path, port)
    assert caught.value.path == str(dump)
    with socket.socket() as probe:  # the port is free: nothing was ever bound
        probe.bind(("127.0.0.1", port))


def test_a_crash_between_the_snapshot_and_the_journal_compaction_keeps_the_tail(
    tmp_path: Path, port: int
) -> None:
    """The dump is renamed into place, then the journal is compacted: a crash in between leaves
    a journal that starts before the snapshot. pysyncobj then cleared the whole journal,
    losing the acknowledged entries after the snapshot; now the compaction is completed."""
    first = Harness(tmp_path, port)
    first.run(DeclareQueue("q"))
    for i in range(20):
        first.run(Enqueue("q", b"early%d" % i))
    journal_file = tmp_path / "raft.journal"
    early = storage.scan_journal(journal_file, journal_file.read_bytes()).entries
    first.node.forceLogCompaction()
    wait_until(lambda: (tmp_path / "raft.dump").exists(), 10, "the dump")
    wait_until(lambda: first.node.getStatus()["log_len"] < 5, 10, "compaction")
    for i in range(10):  # acknowledged entries after the snapshot
        first.run(Enqueue("q", b"tail%d" % i))
    before, applied = first.digest(), first.node.replicated_state.meta.last_index
    first.close()
    compacted = storage.scan_journal(journal_file, journal_file.read_bytes()).entries
    first_kept = compacted[0][1]
    uncompacted = [e for e in early if e[1] < first_kept] + compacted
    assert [e[1] for e in uncompacted] == list(range(1, uncompacted[-1][1] + 1))
    journal = DurableFileJournal(str(journal_file), "batch")
    journal.clear()
    for entry in uncompacted:
        journal.add(*entry)
    journal.sync()
    journal._destroy()

    second = Harness(tmp_path, port)
    try:
        wait_until(lambda: second.node.replicated_state.meta.last_index == applied, 10, "replay")
        assert second.digest() == before
    finally:
        second.close()


def test_a_snapshot_chunk_does_not_commit_the_followers_own_unverified_log(tmp_path: Path) -> None:
    """A follower with entries the leader never committed (a leader cut off by a partition kept
    appending its clients' publishes) gets the new leader's snapshot in chunks. Every chunk
    message carries the leader's commit index but no prevLogIdx: pysyncobj set the follower's
    commit index to min(that, its own last index) on each one, so the follower applied its own
    stale entries and answered their publishes `Ok`; the snapshot then replaced them (the
    seed-5 chaos run lost a confirmed message so). Only a checked AppendEntries may advance it."""
    node, last, term = _follower_with_tail(tmp_path, 3)  # appended by n1 as a leader cut off
    try:
        with node.lock:
            commit_before = node._SyncObj__raftCommitIndex
            first_chunk = {
                "type": "append_entries",
                "term": term + 1,
                "commit_index": last + 100,  # the new leader's, far past our stale tail
                "serialized": (b"part of the new leader's snapshot", True, False),
            }
            node._SyncObj__onMessageReceived(node._peer_nodes["n2"], first_chunk)
            assert node._SyncObj__raftCommitIndex == commit_before
    finally:
        node.destroy_synchronous()


def _follower_with_tail(tmp_path: Path, tail: int) -> tuple[RaftNode, int, int]:
    """A node whose peers never start, with `tail` entries of the current term after its log's
    end; returns (node, the index before the tail, the term)."""
    ports = free_ports(3)
    settings = RaftSettings(
        node_id="n1",
        address=f"127.0.0.1:{ports[0]}",
        peers={"n2": f"127.0.0.1:{ports[1]}", "n3": f"127.0.0.1:{ports[2]}"},
        data_dir=tmp_path,
        password="secret-for-tests",
        supported_version=2,
        incarnation=1,
        election_timeout_ms=(300, 500),
    )
    node = RaftNode(settings, lambda _outcome: None)
    with node.lock:
        term = node._SyncObj__raftCurrentTerm
        last = node._SyncObj__getCurrentLogIndex()
        entry = Entry("cmds", int(time.time() * 1000), ("n2", 1, 1), cmds=())
        for idx in range(last + 1, last + 1 + tail):
            node._SyncObj__raftLog.add(
                bytes([_COMMAND_TYPE.REGULAR]) + encode_entry(entry), idx, term
            )
    return node, last, term


def test_a_late_append_entries_does_not_cut_entries_the_follower_holds(tmp_path: Path) -> None:
    """Raft cuts a follower's log only at a conflicting entry. pysyncobj cut everything after
    prevLogIdx on every AppendEntries: a late or repeated one carrying only the first of the
    entries this follower had already acknowledged took the others off its log, so an entry the
    leader had counted as on a majority was not (a chaos run lost a confirmed message)."""
    node, last, term = _follower_with_tail(tmp_path, 3)
    try:
        with node.lock:
            held = node._SyncObj__getEntries(last + 1)[0]
            late = {
                "type": "append_entries",
                "term": term,
                "commit_index": last + 3,
                "prevLogIdx": last,
                "prevLogTerm": node._SyncObj__getEntries(last)[0][2],
                "entries": [held],
            }
            node._SyncObj__onMessageReceived(node._peer_nodes["n2"], late)
            assert node._SyncObj__getCurrentLogIndex() == last + 3  # nothing cut
            assert node._SyncObj__raftCommitIndex <= last + 1  # only what the message verified
    finally:
        node.destroy_synchronous()


def test_a_conflicting_entry_still_cuts_the_log_from_there(tmp_path: Path) -> None:
    """The other half of the rule: an entry of another term at the same index replaces ours and
    everything after it."""
    node, last, term = _follower_with_tail(tmp_path, 3)
    try:
        with node.lock:
            cmd, idx, _term = node._SyncObj__getEntries(last + 2)[0]
            first = node._SyncObj__getEntries(last + 1)[0]
            newer = {
                "type": "append_entries",
                "term": term + 1,
                "commit_index": 0,
                "prevLogIdx": last,
                "prevLogTerm": node._SyncObj__getEntries(last)[0][2],
                "entries": [first, (cmd, idx, term + 1)],
            }
            node._SyncObj__onMessageReceived(node._peer_nodes["n2"], newer)
            assert node._SyncObj__getCurrentLogIndex() == last + 2
            assert node._SyncObj__getEntries(last + 2)[0][2] == term + 1
            assert node._SyncObj__getEntries(last + 1)[0][2] == term
    finally:
        node.destroy_synchronous()


def _follower_of_an_unreachable_leader(tmp_path: Path) -> RaftNode:
    """A follower that believes n2 leads, with no link to it (n2 never starts) and no election
    due for a minute: what a follower resumed from a pause looks like while it redials."""
    node, _last, _term = _follower_with_tail(tmp_path, 0)
    with node.lock:
        node.raft_leader = node._peer_nodes["n2"]
        node.election_deadline = time.monotonic() + 60.0
    return node


def test_a_command_forwarded_to_an_unreachable_leader_fails_at_once(tmp_path: Path) -> None:
    """pysyncobj forwards a follower's command to the leader it knows and ignores the send's
    result: with the link down, the callback waited until a leader change or the committer's
    10 s sweep (issue 24: a command forwarded by a just-resumed follower). It fails now, as a
    leader change does (outcome unknown: the client retries, deduplicated)."""
    node = _follower_of_an_unreachable_leader(tmp_path)
    failed: list[int] = []
    done = threading.Event()

    def callback(_result: Any, reason: int) -> None:
        failed.append(reason)
        done.set()

    try:
        node.submit(Entry("cmds", int(time.time() * 1000), ("n1", 1, 1), cmds=()), callback)
        assert done.wait(2.0), "the forwarded command waited on a leader it cannot reach"
        assert failed == [FAIL_REASON.LEADER_CHANGED]
    finally:
        node.destroy_synchronous()


def test_commands_waiting_on_the_leader_fail_when_the_link_to_it_drops(tmp_path: Path) -> None:
    """A forward sent, then the link to the leader dropped before its answer: nothing answers
    it any more (pysyncobj fails the waiting ones only on a leader change)."""
    node = _follower_of_an_unreachable_leader(tmp_path)
    failed: list[int] = []
    leader = node._peer_nodes["n2"]
    with node.lock:
        node.waiting_forwards()[7] = lambda _result, reason: failed.append(reason)
        node.raft_transport._onNodeDisconnected(leader)
    try:
        assert failed == [FAIL_REASON.LEADER_CHANGED]
    finally:
        node.destroy_synchronous()


class _Chunks:
    """A snapshot transfer's stream: `count` chunks, then the end."""

    def __init__(self, count: int) -> None:
        self.left, self.reads = count, 0

    def read(self, size: int) -> bytes:
        self.reads += 1
        self.left -= 1
        return b"x" * min(size, 64) if self.left >= 0 else b""

    def close(self) -> None:
        pass


def _record(sent: list[tuple[Any, Any]], to: Any, message: Any) -> bool:
    sent.append((to, message))
    return True


def _node_for_transfers(tmp_path: Path) -> tuple[RaftNode, Any, list[tuple[Any, Any]]]:
    """A node with two entries (a transfer's end needs them), its peer n2 and an empty list
    for the messages `_owe_transfer` records."""
    node, _last, _term = _follower_with_tail(tmp_path, 1)
    return node, node._peer_nodes["n2"], []


def _owe_transfer(node: RaftNode, peer: Any, stream: _Chunks, sent: list[Any]) -> None:
    """Make `node` a leader owing `peer` a snapshot transfer that reads `stream` (loop thread)."""
    node._SyncObj__raftState = _RAFT_STATE.LEADER
    node._SyncObj__connectedNodes.add(peer)
    next_index = getattr(node, "_SyncObj__raftNextIndex", None)
    node._SyncObj__raftNextIndex = {**(next_index or {}), peer: 0}
    node.serializer_transmissions()[peer] = {"file": stream, "transmitted": 1}
    node.raft_transport.send = lambda to, message: _record(sent, to, message)


def _on_loop(node: RaftNode, scenario: Callable[[], None]) -> None:
    """Run `scenario` on the node's loop thread, in one go: no tick runs in between."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        try:
            scenario()
            done.set_result(None)
        except BaseException as err:  # the test's assertion, re-raised in the test's thread
            done.set_exception(err)

    node.loop.call_soon_threadsafe(run)
    done.result(timeout=30)


def _send_round(node: RaftNode) -> None:
    node._send_pending = True
    node._flush_sends()


def test_a_follower_whose_snapshot_transfer_is_backed_up_is_skipped_by_a_send_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj sends snapshot chunks for a whole heartbeat period per send round, however
    slowly the follower's socket takes them (its write buffer grew by tens of MiB, the loop
    stalled); answering "no chunk now" made its send loop spin for that period instead, sending
    empty messages, and the transfer never ended. A follower whose connection holds more than
    TRANSFER_BUFFERED_MAX bytes is now left out of the round; the transfer goes on once it
    drains."""
    stream = _Chunks(3)
    buffered = {"bytes": TRANSFER_BUFFERED_MAX + 1}
    monkeypatch.setattr(appends, "send_buffered", lambda _t, _n: buffered["bytes"])
    node, n2, sent = _node_for_transfers(tmp_path)

    def scenario() -> None:
        _owe_transfer(node, n2, stream, sent)
        _send_round(node)
        assert [m for to, m in sent if to == n2] == [] and stream.reads == 0
        buffered["bytes"] = 0
        _send_round(node)
        chunks = [m["serialized"] for to, m in sent if to == n2]
        assert stream.reads == 4 and chunks[-1][2] is True, chunks  # 3 chunks, then the end
        assert node.other_nodes == {n2, node._peer_nodes["n3"]}  # hidden for the round only

    try:
        _on_loop(node, scenario)
    finally:
        node.destroy_synchronous()


def test_a_follower_whose_connection_is_backed_up_is_sent_no_entries_until_it_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj sends every entry past a follower's next index in each round, whatever its
    socket takes: with 1 KiB publishes at window 1000 the leader's write buffer to a slower
    follower grew to 500-760 MiB (`scripts/bench_backlog.py`), each append a copy on the loop,
    stalls of up to 1.8 s and a leader change every few seconds. A follower whose connection
    holds more than APPEND_BUFFERED_MAX is now left out of the round (the other one gets its
    entries), its next index where it was; once it drains it gets them from there. A message
    refused inside a round puts the next index back at its first entry."""
    buffered = {"n2": appends.APPEND_BUFFERED_MAX + 1, "n3": 0}
    node, last, _term = _follower_with_tail(tmp_path, 3)
    n2, n3 = node._peer_nodes["n2"], node._peer_nodes["n3"]
    sent: list[tuple[Any, Any]] = []

    def entries_to(peer: Any) -> list[int]:
        return [e[1] for to, m in sent if to == peer for e in m.get("entries", [])]

    def scenario() -> None:
        monkeypatch.setattr(appends, "send_buffered", lambda _t, n: buffered[node_id(n)])
        node._SyncObj__raftState = _RAFT_STATE.LEADER
        node._SyncObj__connectedNodes.update({n2, n3})
        node._SyncObj__raftNextIndex = {n2: last + 1, n3: last + 1}
        node.raft_transport.send = lambda to, message: _record(sent, to, message)
        node.guard_send_buffers()  # over the recorder
        _send_round(node)
        assert entries_to(n2) == [] and node._SyncObj__raftNextIndex[n2] == last + 1
        assert entries_to(n3) == [last + 1, last + 2, last + 3]
        buffered["n2"] = 0
        _send_round(node)
        assert entries_to(n2) == [last + 1, last + 2, last + 3]
        buffered["n2"] = appends.APPEND_BUFFERED_MAX + 1
        message = {
            "type": "append_entries",
            "entries": [(b"", last + 2, 1)],
            "prevLogIdx": last + 1,
        }
        with pytest.raises(appends.FollowerBackedUp):
            node.raft_transport.send(n2, message)
        assert node._SyncObj__raftNextIndex[n2] == last + 2

    def node_id(peer: Any) -> str:
        return next(nid for nid, p in node._peer_nodes.items() if p == peer)

    try:
        _on_loop(node, scenario)
    finally:
        node.destroy_synchronous()


def test_a_follower_behind_is_sent_its_gap_in_messages_of_about_a_mebibyte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj packs a follower's whole gap into one AppendEntries, up to its 64 MiB batch
    size: with 16 KiB bodies a follower behind by a pause got 64 MiB messages, 130-190 MiB of
    buffers on both nodes and loop stalls of up to 400 ms. A message now carries entries until
    they reach APPEND_MESSAGE_BYTES; an entry larger than that still goes whole (not pickled in
    pieces, as pysyncobj does with an entry over its batch size); the backed-up guard then stops
    the round near its bound."""
    monkeypatch.setattr(appends, "send_buffered", lambda _t, _n: 0)
    node, last, _term = _follower_with_tail(tmp_path, 0)
    n2, n3 = node._peer_nodes["n2"], node._peer_nodes["n3"]
    entry_bytes = 200 * 1024
    sizes = [entry_bytes] * 20 + [3 * appends.APPEND_MESSAGE_BYTES] + [entry_bytes] * 2
    sent: list[tuple[Any, Any]] = []

    def scenario() -> None:
        with node.lock:
            term = node._SyncObj__raftCurrentTerm
            for offset, size in enumerate(sizes, start=1):
                blob = bytes([_COMMAND_TYPE.REGULAR]) + b"x" * size
                node._SyncObj__raftLog.add(blob, last + offset, term)
        node._SyncObj__raftState = _RAFT_STATE.LEADER
        node._SyncObj__connectedNodes.update({n2, n3})
        node._SyncObj__raftNextIndex = {n2: last + 1, n3: len(sizes) + last + 1}
        node.raft_transport.send = lambda to, message: _record(sent, to, message)
        _send_round(node)

    try:
        _on_loop(node, scenario)
    finally:
        node.destroy_synchronous()
    messages = [m["entries"] for to, m in sent if to == n2 and m.get("entries")]
    assert [e[1] for entries in messages for e in entries] == [
        last + i for i in range(1, len(sizes) + 1)
    ]
    cap = appends.APPEND_MESSAGE_BYTES
    for entries in messages:
        size = sum(len(e[0]) for e in entries)
        assert size - len(entries[-1][0]) < cap, [len(e[0]) for e in entries]
    assert not any("transmission" in m for _to, m in sent)
    assert len(messages) >= 5


def test_no_follower_is_sent_snapshot_chunks_while_a_snapshot_is_being_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a snapshot being taken there is no dump to read: pysyncobj's send loop, given no
    chunk, sent empty messages for the rest of its heartbeat period (thousands per round on a
    real node; for ever on the simulator's clock, where seed 366 ran out of memory)."""
    stream = _Chunks(3)
    node, n2, sent = _node_for_transfers(tmp_path)
    busy = {"now": True}
    monkeypatch.setattr(node, "serializer_busy", lambda: busy["now"])

    def scenario() -> None:
        _owe_transfer(node, n2, stream, sent)
        _send_round(node)
        assert [m for to, m in sent if to == n2] == [] and stream.reads == 0
        busy["now"] = False
        _send_round(node)
        assert stream.reads == 4

    try:
        _on_loop(node, scenario)
    finally:
        node.destroy_synchronous()


class _Unreadable(_Chunks):
    """A transfer stream whose reads fail (a damaged dump, a live entry gone)."""

    def read(self, size: int) -> bytes:
        self.reads += 1
        raise OSError(5, "Input/output error")


def test_a_snapshot_chunk_that_cannot_be_read_holds_that_transfer_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj's own answer to a chunk it could not read (False) makes its send loop raise a
    TypeError, ending the round before the followers after that one were sent anything, and
    again every round. Now the round goes on without that follower, whose transfer starts
    again TRANSFER_RETRY_S later."""
    unreadable, fine = _Unreadable(3), _Chunks(3)
    node, n2, sent = _node_for_transfers(tmp_path)
    n3 = node._peer_nodes["n3"]
    clock = {"now": 1000.0}
    monkeypatch.setattr(appends, "monotonic_time", lambda: clock["now"])
    monkeypatch.setattr(snapshot_hooks, "monotonic_time", lambda: clock["now"])

    def scenario() -> None:
        with structlog.testing.capture_logs() as logs:
            _owe_transfer(node, n2, unreadable, sent)
            _owe_transfer(node, n3, fine, sent)
            _send_round(node)  # n2's read fails: n3 is sent its whole transfer all the same
        assert fine.reads == 4 and unreadable.reads == 1
        assert [m for to, m in sent if to == n2] == []
        assert [e["event"] for e in logs] == ["snapshot_transfer_failed"], logs
        node.serializer_transmissions()[n2] = {"file": unreadable, "transmitted": 1}
        clock["now"] += TRANSFER_RETRY_S / 2
        _send_round(node)
        assert unreadable.reads == 1  # held
        clock["now"] += TRANSFER_RETRY_S
        _send_round(node)
        assert unreadable.reads == 2  # tried again

    try:
        _on_loop(node, scenario)
    finally:
        node.destroy_synchronous()
