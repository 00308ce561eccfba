"""Snapshots of `raft.node.RaftNode`, through pysyncobj's serializer hooks.

Our CBOR snapshot (`fifo.snapshot` + metadata + pysyncobj's two last entries + the live entry
list) is encoded in a forked child (raft.snapshotter) and written into `raft.dump`; loading one
(at start, or sent by the leader) restores the replicated state, installs the live entries a
transfer carried after the dump (raft.transfer, raft.retention), aligns the journal with it and
tells `on_snapshot_loaded`. A transfer to a lagging follower streams the dump, then the live
entries it names (`_transmission_data`). A state that holds no message while entries are still
retained asks for a snapshot at once (`compact_if_drained`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import cbor2
import structlog
from pysyncobj.monotonic import monotonic as monotonic_time

from raft import storage
from raft.durability import DurableFileJournal
from raft.errors import RaftError, StorageError
from raft.node_base import NodeBase
from raft.settings import DialedTCPNode
from raft.snapshotter import SnapshotStarted
from raft.transfer import TRANSFER_RETRY_S, TransferFailed, TransferStream

log = structlog.get_logger("raft")

# snapshots are encoded in a forked child (raft.snapshotter); the simulator turns this off, and
# QUORUMQ_SNAPSHOT_INLINE=1 too, only to measure against (scripts/bench_snapshot_stall.py --node)
SNAPSHOT_INLINE_ENV = "QUORUMQ_SNAPSHOT_INLINE"
SNAPSHOT_IN_CHILD = os.environ.get(SNAPSHOT_INLINE_ENV) != "1"


# how often `compact_if_drained` looks (it is called more often)
DRAINED_CHECK_PERIOD_S = 1.0
# a drained state's journal at least this big is compacted at once too
DRAINED_JOURNAL_BYTES = 64 * 1024 * 1024


class SnapshotHooks(NodeBase):
    """RaftNode's snapshot steps (module doc)."""

    _drained_checked_at = float("-inf")

    def compact_if_drained(self) -> bool:
        """Ask pysyncobj for a snapshot when the state holds no message but the retained store
        still holds entries or the journal DRAINED_JOURNAL_BYTES: a drained backlog's disk comes
        back now rather than at the next snapshot (5,000 entries or 300 s later; rabbit_fifo
        moves its release cursor to the head when its queues empty). Loop thread, at most once
        per DRAINED_CHECK_PERIOD_S, O(queues). True if it asked."""
        now = float(monotonic_time())
        if now - self._drained_checked_at < DRAINED_CHECK_PERIOD_S:
            return False
        self._drained_checked_at = now
        journal = self._journal()
        if not isinstance(journal, DurableFileJournal):
            return False
        if not len(journal.retained) and journal.file_bytes < DRAINED_JOURNAL_BYTES:
            return False
        if self._snapshots.running:
            return False
        with self.lock:
            if self.replicated_state.messages_held():
                return False
        self.forceLogCompaction()
        return True

    def _serialize_snapshot(self, _file_name: str, raft_data: Any) -> None:
        """pysyncobj's serializer hook (in a tick on the loop): fork the snapshot job
        (raft.snapshotter) and raise SnapshotStarted; `_snapshots.poll` reports the outcome."""
        last, prev, cluster = raft_data
        if self.crash_traceback is not None:  # pysyncobj logs the failure and keeps the journal
            raise RuntimeError("no snapshot after an apply raised: the state may be half-applied")
        raft = {
            "last": [bytes(last[0]), last[1], last[2]],
            "prev": [bytes(prev[0]), prev[1], prev[2]],
            "cluster": sorted(node.id if hasattr(node, "id") else str(node) for node in cluster),
        }

        def encode() -> tuple[bytes, list[int]]:  # in the forked child: no lock, no I/O
            body = self.replicated_state.snapshot()
            live = sorted({*self.replicated_state.live_indexes(), *self.pinned_indexes()})
            body["live"] = storage.encode_indexes(live)
            body["raft"] = raft
            return storage.encode_dump(cbor2.dumps(body), int(last[1])), live

        self._snapshots.start(encode, below=int(prev[1]), in_child=SNAPSHOT_IN_CHILD)
        raise SnapshotStarted

    def _deserialize_snapshot(self, file_name: str) -> tuple[Any, Any, Any]:
        """pysyncobj's deserializer hook: load the dump at `file_name` (module doc)."""
        self._snapshots.cancel()  # a snapshot of the state this one replaces
        try:
            body = storage.read_dump_body(Path(file_name), self.settings.node_id)
        except StorageError as err:
            # verified at start, so this is a snapshot the leader just sent: stop applying
            # rather than run from a state that could not be loaded
            with self.lock:
                self.stopped_reason = str(err)
            log.error("snapshot_damaged", file=file_name, offset=err.offset, error=str(err))
            raise
        os.chmod(file_name, storage.FILE_MODE)
        self._install_transferred(Path(file_name))
        self._restore_state(body)
        raft = body["raft"]
        last, prev = raft["last"], raft["prev"]
        failed = self.fail_commits_covered(int(last[1]))
        log.info("snapshot_loaded", index=last[1], commands_failed=failed)
        if self._on_snapshot_loaded is not None:
            try:
                self._on_snapshot_loaded(int(last[1]))
            except Exception:  # a listener bug must not fail the load
                log.exception("snapshot_listener_failed", index=last[1])
        last_entry = (bytes(last[0]), last[1], last[2])
        prev_entry = (bytes(prev[0]), prev[1], prev[2])
        self._align_journal_to_snapshot(prev_entry, last_entry)
        trust_log, self._start_dump_pending = self._start_dump_pending, False
        self._load_live(body, trust_log)
        return last_entry, prev_entry, self._snapshot_peers(int(last[1]), raft["cluster"])

    def _restore_state(self, body: dict[str, Any]) -> None:
        """Replace the replicated state by a snapshot's; stop applying if it needs newer code."""
        with self.lock:
            self.replicated_state.restore(body)
            meta = self.replicated_state.meta
            if meta.effective_version > self.settings.supported_version:
                self.stopped_reason = (
                    f"machine version {meta.effective_version} is effective; this node supports "
                    f"only up to {self.settings.supported_version}: restart it with newer code"
                )
                log.error("apply_stopped", reason=self.stopped_reason)

    def _load_live(self, body: dict[str, Any], trust_log: bool) -> None:
        """Hand the live entry list of a loaded dump to the journal, which checks that each
        is retained (or in the log, if `trust_log`: not for a snapshot from the leader, which
        replaces the log) (StorageError: the node stops, as for a damaged dump)."""
        journal = self._journal()
        if not isinstance(journal, DurableFileJournal):
            return
        path = Path(self.settings.dump_file)
        live = storage.decode_indexes(path, body.get("live"), self.settings.node_id)
        try:
            journal.load_live(live, int(body["raft"]["prev"][1]), trust_log)
        except StorageError as err:
            with self.lock:
                self.stopped_reason = str(err)
            log.error("snapshot_live_entries_missing", error=str(err))
            raise

    def _install_transferred(self, path: Path) -> None:
        """Move the live entries a snapshot transfer carried after its dump (raft.transfer)
        into the retained store (synced), then cut them off the dump file."""
        journal = self._journal()
        end = storage.dump_end(path)
        if end == path.stat().st_size or not isinstance(journal, DurableFileJournal):
            return
        added = journal.add_retained(
            storage.iter_transfer_records(path, self.settings.node_id),
            "installing the live entries of a snapshot transfer",
        )
        os.truncate(path, end)
        if self.settings.fsync != "never":
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        log.info("snapshot_live_entries_installed", added=added)

    def _transmission_data(self, transmission_id: Any) -> Any:
        """pysyncobj's Serializer.getTransmissionData, streaming `raft.transfer.TransferStream`
        (the dump, then the live entries it names) instead of the dump file alone."""
        if self.serializer_busy():
            return None  # a snapshot is being taken
        transmissions = self.serializer_transmissions()
        transmission = transmissions.get(transmission_id)
        if transmission is None:
            try:
                stream = TransferStream(Path(self.settings.dump_file), self._snapshots.journal)
            except OSError as err:
                self._transfer_failed(transmission_id, err)
            transmission = transmissions[transmission_id] = {"file": stream, "transmitted": 0}
        is_first = transmission["transmitted"] == 0
        try:
            data = transmission["file"].read(self.transmission_batch_size())
        except (OSError, RaftError) as err:
            transmissions.pop(transmission_id, None)
            transmission["file"].close()
            self._transfer_failed(transmission_id, err)
        transmission["transmitted"] += len(data)
        if not data:
            transmissions.pop(transmission_id, None)
        return data, is_first, not data

    def _transfer_failed(self, node: Any, err: Exception) -> NoReturn:
        """Log a chunk that could not be read and hold `node`'s transfer for TRANSFER_RETRY_S.
        Raises TransferFailed: pysyncobj's send loop, given no chunk (None), spins for its
        heartbeat period, and given False (its own serializer's answer) raises a TypeError that
        ends the round before the followers after this one were sent anything."""
        log.error("snapshot_transfer_failed", follower=str(node), error=repr(err))
        self._transfer_holds[node] = float(monotonic_time()) + TRANSFER_RETRY_S
        raise TransferFailed(node) from err

    def _snapshot_peers(self, index: int, cluster: list[str]) -> list[DialedTCPNode]:
        """The peers as of a snapshot: its member set if a change recorded one (persisted
        unless the node already knows a later one), else pysyncobj's own list. Never this node
        (pysyncobj compares its own Node with the strings and would add itself)."""
        with self.lock:
            addresses = dict(self.replicated_state.meta.addresses)
        if self._member_set is not None and self._member_set.index > index:
            # the node applied a later change from its journal before (a restart): keep it
            # (pysyncobj replays the changes after the snapshot, each a no-op then)
            addresses = {m.id: (m.raft, m.client) for m in self._member_set.members}
        if addresses:
            if self._member_set is None or self._member_set.index <= index:
                self._persist_members(index, addresses)
            return [
                self._tcp_node(node_id, raft)
                for node_id, (raft, _client) in sorted(addresses.items())
                if node_id != self.settings.node_id
            ]
        return [
            self._tcp_node(self._address_to_id.get(address, address), address)
            for address in cluster
            if address != self.settings.address
        ]

    def _align_journal_to_snapshot(self, prev_entry: Any, last_entry: Any) -> None:
        """Drop the journal's entries before the snapshot's last two if it still holds them.

        A crash after the dump was renamed into place but before the journal was compacted
        leaves a journal that starts before the snapshot; pysyncobj, not finding the snapshot's
        last two entries at the journal's start, then clears the whole journal, losing the
        entries after the snapshot that this node had acknowledged. Compacting it here (what
        the crash interrupted) keeps them.
        """
        journal = self._journal()
        if len(journal) < 2:
            return
        at = int(prev_entry[1]) - int(journal[0][1])
        if at <= 0 or at + 1 >= len(journal):
            return
        if tuple(journal[at]) == tuple(prev_entry) and tuple(journal[at + 1]) == tuple(last_entry):
            log.warning("journal_compaction_completed", dropped=at, snapshot_index=last_entry[1])
            journal.deleteEntriesTo(at)
