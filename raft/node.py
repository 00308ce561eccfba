"""The pysyncobj node: one replicated method, durable journal, CBOR snapshots, version gate.

Ordering obligations (as etcd's `Ready` documents them):
- everything runs on one asyncio loop (the node's; `raft.ticker`): pysyncobj's sockets are the
  loop's readers/writers, and a tick runs after socket events, after a proposal and on a timer;
- a follower fsyncs an entry's journal record (policy permitting) before it acks it (one fsync
  for all the AppendEntries received since its last tick: they are answered together);
- the leader sends one AppendEntries per follower per tick (new entries and commit index), then
  fsyncs (overlapping the followers' fsyncs) before it returns to the loop, so no ack is read
  before its own copy is on disk: it counts itself towards a commit only once that is so; a
  message that would carry only a new commit index waits up to COMMIT_SEND_DELAY_S for the next
  entry to carry it;
- every node fsyncs before it hands the outcome of an entry (its replies) to `on_outcome` (a
  no-op on the one-at-a-time path: the entry was synced before it was sent or acked);
- `on_outcome` is called in log order inside pysyncobj's tick on the loop, once per applied
  entry, on every node (replies are for the submitter, effects for the node owning the
  connection): the listener runs there and then, it must not block;
- `on_snapshot_loaded` is called the same way, in the same order, whenever the state is
  replaced by a snapshot (at start, or sent by the leader to a lagging follower): the entries the
  snapshot covers are never applied here, so their effects (deliveries to this node's clients)
  never come, and entries already applied may be applied again: the listener must drop whatever
  it promised its clients;
- nothing raised inside apply reaches pysyncobj, except the deliberate stops: older code than the
  log needs (the version stop), or a bug (an exception out of the machine's apply). Both stop
  applying on this node at that entry, keeping the log; a bug stops every replica at the same
  entry, so the state never forks. `_apply_locked` is the one place such a bug is contained: it
  logs the entry index and traceback and shows them in `status` (`cluster status`); no snapshot
  is taken after it (the state may be half-way through the entry);
- elections go through pre-vote (raft.prevote): pysyncobj's election deadline stays parked
  until a majority said it would vote for this node;
- a journal record found damaged on read-back stops the node (no more ticks, peer connections
  closed; the server exits 65);
- membership (pysyncobj's dynamic membership, `raft.membership`): the leader checks a change
  before it appends it (one at a time, a quorum left, no duplicate); every node switches its
  peers when the entry reaches its log (pysyncobj), and when it applies the entry switches the
  replicated member set, persists it (`<data dir>/members`, fsynced) and hands the outcome over
  like any entry's; a node that is not in the member set it applied never stands for election.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from pysyncobj import SyncObj, replicated
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.syncobj import SyncObjExceptionWrongVer
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TransportNotReadyError

from raft import durability, membership, safe_pickle, storage
from raft.appends import COMMIT_SEND_DELAY_S, Appends
from raft.contact import Contact
from raft.durability import DurableFileJournal
from raft.elections import PRE_VOTE_PARK_S, Elections
from raft.entry import Entry, decode_entry, encode_entry
from raft.errors import DiskFullError, EntryError, EntryGoneError, StorageError, VersionTooOldError
from raft.member_changes import MemberChanges, MembershipCallback
from raft.node_base import NodeBase, OutcomeListener, SnapshotListener
from raft.node_status import DIGEST_MESSAGES_MAX, ROLES, NodeStatus
from raft.prevote import PRE_VOTE, PRE_VOTE_RESPONSE, PreVote
from raft.replicated import LiveIndexes, Outcome, ReplicatedState
from raft.roles import RoleChanges
from raft.settings import (
    APPEND_ENTRIES_BYTES_MAX,
    SNAPSHOT_CHUNK_BYTES,
    TRANSPORT_ENV,
    TRANSPORTS,
    DialedTCPNode,
    LoopPysyncobjTransport,
    LoopQuorumTransport,
    RaftSettings,
    int_or,
    syncobj_conf,
    transport_name,
)
from raft.snapshot_hooks import SNAPSHOT_INLINE_ENV, SnapshotHooks
from raft.snapshotter import SnapshotJob
from raft.syncobj_adapter import connection_last_read
from raft.ticker import LoopPoller, LoopThread, LoopTicker
from raft.transport import PeerConnection

# the names cluster/, scripts and tests import from here (some defined in the parts' modules)
__all__ = ["APPEND_ENTRIES_BYTES_MAX", "COMMIT_SEND_DELAY_S", "DIGEST_MESSAGES_MAX",
           "PRE_VOTE_PARK_S", "ROLES", "SNAPSHOT_CHUNK_BYTES", "SNAPSHOT_INLINE_ENV",
           "TEST_LIVE_ENTRIES_ENV", "TRANSPORTS", "TRANSPORT_ENV",
           "DialedTCPNode", "MembershipCallback", "OutcomeListener", "RaftNode", "RaftSettings",
           "SnapshotListener", "transport_name"]  # fmt: skip

log = structlog.get_logger("raft")

# test-only: "all" names every applied entry live in every snapshot (raft.retention in tests
# with real node processes, before machine v4 refers to bodies in the log)
TEST_LIVE_ENTRIES_ENV = "QUORUMQ_TEST_LIVE_ENTRIES"
# the transports the node builds (the simulator replaces the first: raft.sim.patches)
_LoopQuorumTransport = LoopQuorumTransport
_LoopPysyncobjTransport = LoopPysyncobjTransport


class RaftNode(Appends, Elections, MemberChanges, SnapshotHooks, NodeStatus, NodeBase):
    """A SyncObj with exactly one replicated method, `apply_entry(blob)`.

    Driven from an asyncio loop (`loop`: the node's; every pysyncobj callback, apply and
    `on_outcome` runs on it). Without `loop` the node gets a private loop in a daemon thread
    (tests and tools driving a node in-process); `destroy_synchronous()` stops it. Its parts:
    raft.node_base (module doc); pysyncobj's private names only through raft.syncobj_adapter.
    """

    @property
    def _poller(self) -> LoopPoller:
        # pysyncobj creates its own poller in its constructor: ours (the loop) replaces it
        return self._loop_poller

    @_poller.setter
    def _poller(self, _value: Any) -> None:
        pass

    def __init__(
        self,
        settings: RaftSettings,
        on_outcome: OutcomeListener,
        on_snapshot_loaded: SnapshotListener | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        live_indexes: LiveIndexes | None = None,
    ) -> None:
        safe_pickle.install()
        durability.install()
        durability.register(settings.journal_file, settings.fsync, settings.node_id)
        storage.private_dir(settings.data_dir)
        # a snapshot that does not verify stops the start here, before anything is bound: a
        # node never serves, votes or leads from a state it could not load (the journal is
        # verified the same way when SyncObj opens it)
        dump = None
        if os.path.exists(settings.dump_file):
            dump = storage.read_dump_body(Path(settings.dump_file), settings.node_id)
        # our attributes exist before SyncObj's constructor runs (its first tick loads the dump)
        peers = self._init_state(settings, on_outcome, on_snapshot_loaded, live_indexes)
        conf = syncobj_conf(
            settings, self._serialize_snapshot, self._deserialize_snapshot, transport_name()
        )
        conf.serializeChecker = self._snapshots.poll
        self._pre_vote = PreVote(conf.raftMinTimeout)
        self.roles = RoleChanges(settings.node_id, conf.raftMinTimeout, conf.leaderFallbackTimeout)
        conf.onStateChanged = self._on_role_changed  # every change logged with its cause
        peer_nodes = [self._tcp_node(node_id, address) for node_id, address in peers.items()]
        self._init_loop(settings, loop)
        transport_class = (
            _LoopQuorumTransport if transport_name() == "quorumq" else _LoopPysyncobjTransport
        )
        super().__init__(settings.address, peer_nodes, conf, transportClass=transport_class)
        self._after_syncobj_init(dump)

    def _init_state(
        self,
        settings: RaftSettings,
        on_outcome: OutcomeListener,
        on_snapshot_loaded: SnapshotListener | None,
        live_indexes: LiveIndexes | None,
    ) -> dict[str, str]:
        """Our attributes, set before SyncObj's constructor; returns the peers to start with."""
        self.settings = settings
        self.lock = threading.RLock()
        self.replicated_state = ReplicatedState(
            list(settings.founders) or [settings.node_id, *settings.peers],
            live_indexes or self._test_live_indexes(),
        )
        # the member set this node last applied wins over cluster.toml, which may lag
        self._member_set = membership.read_member_set(settings.data_dir, settings.node_id)
        peers = dict(settings.peers)
        if self._member_set is not None:
            peers = {m.id: m.raft for m in self._member_set.members if m.id != settings.node_id}
        self._refusals = {}  # (op, node) -> why it was refused
        self._transfer_requested = False  # set by any thread, acted on by the next tick
        self._change_appended_at = 0  # index of the last change this node appended as leader
        self.stopped_reason = None
        self.crash_traceback = None  # set when an apply raised (a bug): see status
        # batch id -> the decoded commands of an entry this node submitted (skips a decode):
        # from the submitting code (hand_decoded) to the apply (one pop per entry)
        self._decoded_by_batch: dict[int, tuple[Any, ...]] = {}
        self._send_pending = False
        self._commit_send_at = None
        self._transfer_holds = {}
        self._deferred_acks = []
        # the peer messages since the last tick or peer event: None (none), True (all of them
        # replies that left an idle leader idle: no tick needed), False (anything else)
        self._event_quiet = None
        self._on_outcome = on_outcome
        self._on_snapshot_loaded = on_snapshot_loaded
        # issue 24: how steadily the leader (as a follower) or each follower (as the leader) is
        # heard, for `applied_state_current` (raft/contact.py)
        self._leader_contact = Contact(settings.silence_s)
        self._follower_contacts = {}
        self._elected_at = None  # when this node last became leader (monotonic)
        self._applied_through = 0  # the last entry applied through apply_entry (raft.contact)
        # optional observers (the node's metrics): seconds per journal fsync, per entry applied
        self.observe_fsync = None
        self.observe_apply = None
        self._address_to_id = {addr: nid for nid, addr in settings.peers.items()}
        self._address_to_id.update({addr: nid for nid, addr in peers.items()})
        self._address_to_id[settings.address] = settings.node_id
        self._snapshots = SnapshotJob(None, Path(settings.dump_file), settings.fsync != "never")
        # entries whose bodies the node is reading back off the loop (raft.replica): a message
        # delivered and settled in one entry is not live, but its body must stay readable
        self.pinned_indexes = tuple
        return peers

    def _init_loop(self, settings: RaftSettings, loop: asyncio.AbstractEventLoop | None) -> None:
        """The loop drives pysyncobj: its sockets are the loop's readers/writers, its ticks run
        after socket events, after proposals and on a timer (raft/ticker.py)."""
        self._loop_thread = LoopThread(f"raft-{settings.node_id}") if loop is None else None
        self.loop = loop if loop is not None else self._loop_thread.loop  # type: ignore[union-attr]
        self._ticker = LoopTicker(
            self.loop, self._tick, settings.tick_period_s, self._next_timer_due
        )
        self._loop_poller = LoopPoller(self.loop, self._ticker.tick_now)
        self._loop_poller.on_tick_end = self._end_of_tick
        self._loop_poller.on_failure = self._ticker.on_failure = self._stop_if_damaged
        self._ticker.light_event = self._event_handled_lightly
        self._destroyed = False

    def _after_syncobj_init(self, dump: dict[str, Any] | None) -> None:
        """Wire what SyncObj's constructor built (journal, serializer, pipe, transport), load
        the start dump's live entries, register the tick callbacks and start ticking."""
        journal = self._journal()
        self._snapshots.journal = journal if isinstance(journal, DurableFileJournal) else None
        self.serializer.getTransmissionData = self._transmission_data
        self._start_dump_pending = dump is not None  # the first dump loaded is this one
        if dump is not None:  # every live entry it names is retained or in the journal
            self._install_transferred(Path(self.settings.dump_file))
            self._load_live(dump, trust_log=True)
        self.replace_pipe_notifier(self._on_command_queued, self._loop_poller.unsubscribe)
        self.guard_forwards()
        self.guard_send_buffers()
        transport = self.raft_transport
        transport._constructing = False
        with contextlib.suppress(TransportNotReadyError):
            transport.tryGetReady()  # bind now if we can; ticks retry
        # pysyncobj compares Node objects, not address strings
        self._peer_nodes = {self._address_to_id[node.id]: node for node in self.otherNodes}
        self.addOnTickCallback(self._guard_leadership)
        self.addOnTickCallback(self._pre_vote_gate)  # after the guard: it may park the deadline
        self.addOnTickCallback(self._probe_disk)
        self.addOnTickCallback(self._stop_if_damaged_off_loop)
        self.addOnTickCallback(self._expire_stuck_handshakes)
        self._ticker.start()
        if self._loop_thread is not None:
            self._loop_thread.start()

    def _test_live_indexes(self) -> LiveIndexes | None:
        """Test-only (TEST_LIVE_ENTRIES_ENV = "all"): every entry applied is live, so every
        snapshot retains the whole log below it (drives retention before machine v4)."""
        if os.environ.get(TEST_LIVE_ENTRIES_ENV) != "all":
            return None

        def every_entry(_state: Any) -> list[int]:
            return list(range(1, self.replicated_state.meta.last_index + 1))

        return every_entry

    def _on_command_queued(self) -> None:
        """A command was queued (pysyncobj's `_applyCommand`): on the loop, outside a tick,
        append it and send it now (the leader: AppendEntries, then its fsync; a follower:
        forwarded to the leader) instead of waiting for the next loop iteration's full tick."""
        self._ticker.run_or_request(self._append_queued)

    def _append_queued(self) -> None:
        if self._destroyed or not self.raft_transport.ready:
            self._ticker.request()
            return
        self._checkCommandsToApply()
        self._end_of_tick()

    # --- driving pysyncobj from the loop -----------------------------------------------------

    def _tick(self) -> None:
        """One pysyncobj tick (loop thread): first the acks of the AppendEntries received since
        the last tick (one fsync covers them all), then pysyncobj's tick (commit, apply, append
        queued commands, timers), which ends in `_end_of_tick`."""
        if self._destroyed:
            return
        self._event_quiet = None
        self._flush_acks()
        self.doTick(0.0)

    def _end_of_tick(self) -> None:
        """The end of every pysyncobj tick: the AppendEntries collected during the tick (one
        message per follower carrying the new entries and the commit index, then one fsync),
        and the next wake-up if the held-back commit index falls due before the timer."""
        wait = self._commit_send_due(self.settings.tick_period_s)
        self._flush_sends()
        self._flush_acks()
        self._ticker.wake_within(wait)

    def destroy(self) -> None:
        """Stop ticking, close the peer connections and the journal (on the loop thread, or
        any thread for a node with its own loop thread: `destroy_synchronous`)."""
        if self._loop_thread is not None:
            self.destroy_synchronous()
            return
        self._destroy_now()

    def destroy_synchronous(self) -> None:
        """`destroy()`, and for a node with its own loop thread, stop and join that thread."""
        if self._loop_thread is None:
            self._destroy_now()
            return
        thread, self._loop_thread = self._loop_thread, None
        thread.call_and_stop(self._destroy_now)

    def _destroy_now(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._ticker.stop()
        self._snapshots.cancel()
        try:
            SyncObj.destroy(self)  # autoTick off: pysyncobj's _doDestroy, here and now
        finally:
            self._loop_poller.unsubscribe_all()

    def storage_damage(self) -> StorageError | None:
        """The damage found reading the journal or a retained entry (raft.retention) back while
        running, if any: the node stops (no more ticks, peer connections closed) and its
        process should exit 65."""
        journal = self._journal()
        if not isinstance(journal, DurableFileJournal):
            return None
        return journal.damage or journal.retained.damage

    def _stop_if_damaged(self) -> None:
        """After a tick or a socket event raised: on journal damage, stop here and now (an
        error on every tick after, and a leader the others cannot replace, would follow)."""
        damage = self.storage_damage()
        if damage is None or self._destroyed:
            return
        log.error("raft_stopped", reason="storage damaged", file=damage.path, offset=damage.offset)
        self._destroy_now()

    def _stop_if_damaged_off_loop(self) -> None:
        """Every tick: damage found by a read off the loop (the bodies worker, a snapshot
        worker) raised there, not here; stop on it at the next tick."""
        if self.storage_damage() is not None:
            self.loop.call_soon(self._stop_if_damaged)

    def timer_at(self) -> float | None:
        """The loop time of this node's next timer wake-up (raft.ticker), None if not armed."""
        return self._ticker.timer_at()

    def tick_thread_alive(self) -> bool:
        """Whether this node still ticks (pysyncobj's name; there is no tick thread)."""
        return not self._destroyed

    # --- the replicated method ---------------------------------------------------------------

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, blob: bytes) -> None:
        """Apply one log entry (runs on every node, in log order, inside a tick on the loop)."""
        index = self.raftLastApplied + 1
        with self.lock:
            if self.stopped_reason is not None:
                raise SyncObjExceptionWrongVer(self.replicated_state.meta.effective_version)
            started = time.perf_counter()
            outcome = self._apply_locked(index, blob)
            self._applied_through = index  # pysyncobj counts it applied only after we return
            if self.observe_apply is not None:
                self.observe_apply(time.perf_counter() - started)
        self.sync_journal()  # the reply must not leave before the entry is durable here
        try:
            self._on_outcome(outcome)
        except Exception:  # a listener bug must not wedge the log
            log.exception("outcome_listener_failed", index=index)

    def _apply_locked(self, index: int, blob: bytes) -> Outcome:
        try:
            entry = decode_entry(blob)
        except EntryError as err:
            log.error("entry_undecodable", index=index, error=str(err))
            return Outcome(index, None, [], [])
        decoded = None
        origin = entry.origin
        if origin is not None and origin[:2] == (self.settings.node_id, self.settings.incarnation):
            decoded = self._decoded_by_batch.pop(origin[2], None)
        try:
            outcome = self.replicated_state.apply_entry(
                index, self._entry_term(index), entry, self.settings.supported_version, decoded
            )
        except VersionTooOldError as err:
            self.stopped_reason = str(err)
            log.error("apply_stopped", index=index, reason=self.stopped_reason)
            raise SyncObjExceptionWrongVer(err.needed) from err
        except Exception as err:  # the one containment point of a bug in apply (module doc)
            self.crash_traceback = traceback.format_exc()
            self.stopped_reason = f"applying entry {index} raised {err!r}: a bug, stopped here"
            log.error("apply_crashed", index=index, error=repr(err), traceback=self.crash_traceback)
            raise SyncObjExceptionWrongVer(self.replicated_state.meta.effective_version) from err
        return outcome

    def apply_log_entries(self) -> bool:
        """pysyncobj's apply loop, but stopped (older code than the log needs): keep the log,
        apply nothing (else pysyncobj would retry every pending entry, each raising, on every
        tick); after an apply the leader holds back the commit-index-only AppendEntries."""
        if self.stopped_reason is not None:
            return False
        applied = self.syncobj_apply_log_entries()
        self._hold_commit_send(applied)
        return False

    def _checkCommandsToApply(self) -> None:
        # the leader appends submitted commands here: on ENOSPC the journal undid the write and
        # logged it; the command is not in the log and its submitter times out (the batcher
        # answers `disk_full` at once to everything submitted after)
        if not self.commands_queued():
            return  # (pysyncobj would raise and catch queue.Empty on every tick to learn it)
        with contextlib.suppress(DiskFullError):
            SyncObj._checkCommandsToApply(self)

    def on_peer_message(self, node: Any, message: Any) -> None:
        """A peer's message: pre-vote's are ours; contact is noted (raft.contact); the rest
        goes through the AppendEntries guards to pysyncobj (raft.appends)."""
        kind = message.get("type") if isinstance(message, dict) else None
        quiet = self._event_quiet is not False
        self._event_quiet = False  # until this message is known to leave nothing to do
        if kind == PRE_VOTE:
            self._answer_pre_vote(node, message)
            return
        if kind == PRE_VOTE_RESPONSE:
            self._count_pre_vote(node, message)
            return
        if kind == "append_entries" and int_or(message.get("term"), -1) >= self.current_term:
            self._pre_vote.heard_from_leader(monotonic_time())
            self._leader_contact.heard(self.node_id_of(node), monotonic_time())
        elif kind == "next_node_idx":  # a follower's answer to our AppendEntries
            self._heard_follower(self.node_id_of(node), message)
        self._receive_append(node, message)
        if quiet and kind == "next_node_idx" and self._idle_reply(message):
            self._event_quiet = True

    def disk_full(self) -> bool:
        """Whether the journal's last write failed for lack of space (no probe succeeded yet)."""
        journal = self._journal()
        return isinstance(journal, DurableFileJournal) and journal.disk_full

    # --- peer connections -------------------------------------------------------------------

    def _expire_stuck_handshakes(self) -> None:
        """Drop a peer connection whose handshake has heard nothing for the connection timeout.

        pysyncobj checks a connection's timeout only when it reads or writes on it, and sends
        nothing to a peer until its handshake is done: a connection opened while the peer was
        paused (or cut off) stays half-open for ever, and since it is not DISCONNECTED no new one
        is dialed. The peer never gets another AppendEntries: it never catches up (found with
        issue 17: a follower paused past a log compaction never applied again). Dropping it
        makes pysyncobj dial again.
        """
        transport = self.raft_transport
        connected = self.connected_nodes
        timeout = self.syncobj_conf.connectionTimeout
        now = monotonic_time()
        for node, conn in list(getattr(transport, "_connections", {}).items()):
            if isinstance(conn, PeerConnection):
                continue  # its transport enforces its own deadlines on every tick
            if node in connected or conn.state == CONNECTION_STATE.DISCONNECTED:
                continue
            if now - connection_last_read(conn) > timeout:
                log.warning("peer_handshake_expired", peer=self.node_id_of(node))
                conn.disconnect()

    # --- submitting ----------------------------------------------------------------------------

    def hand_decoded(self, batch_id: int, commands: tuple[Any, ...]) -> None:
        """The decoded commands of the entry this node submits as `batch_id` (loop thread): its
        apply here takes them instead of decoding the blobs again (dict ops are atomic)."""
        self._decoded_by_batch[batch_id] = commands

    def forget_decoded(self, batch_id: int) -> None:
        """Drop the handed-over commands of a batch that failed (will never be applied here)."""
        self._decoded_by_batch.pop(batch_id, None)

    def read_entry(self, raft_index: int) -> bytes:
        """The entry blob (the CBOR map of `raft.entry`, as applied) at `raft_index`, from the
        journal or the entries retained after compaction (raft.retention); checksums verified.
        EntryGoneError if it is not held; StorageError if it is damaged (never served).
        Callable from any thread (a worker reading cold bodies off the loop)."""
        journal = self._journal()
        if not isinstance(journal, DurableFileJournal):
            raise EntryGoneError(raft_index, "this node keeps no journal")
        return journal.read_entry(raft_index)

    def submit(self, entry: Entry, callback: Callable[[Any, int], None] | None = None) -> None:
        """Queue an entry for replication (thread-safe); `callback(result, fail_reason)`."""
        self.apply_entry(encode_entry(entry), callback=callback)
