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
import ssl
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2
import structlog
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE, FAIL_REASON, SyncObjExceptionWrongVer
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport, TransportNotReadyError

from raft import durability, membership, safe_pickle, storage
from raft.contact import Contact, follower_current, majority_steady
from raft.durability import DurableFileJournal
from raft.entry import Entry, decode_entry, encode_entry
from raft.errors import (
    DiskFullError,
    EntryError,
    EntryGoneError,
    RaftError,
    StorageError,
    VersionTooOldError,
)
from raft.membership import MemberChange, MemberSet, MembershipError, Refusal
from raft.metadata import member_change_refusal
from raft.prevote import PRE_VOTE, PRE_VOTE_RESPONSE, PreVote
from raft.replicated import LiveIndexes, Outcome, ReplicatedState
from raft.roles import RoleChanges
from raft.snapshotter import SnapshotJob, SnapshotStarted
from raft.ticker import LoopPoller, LoopThread, LoopTicker
from raft.transfer import TransferStream
from raft.transport import PeerConnection, QuorumTransport

log = structlog.get_logger("raft")

ROLES = {0: "follower", 1: "candidate", 2: "leader"}
APPEND_ENTRIES_BYTES_MAX = 64 * 1024 * 1024
# how long the leader may hold back an AppendEntries that would only carry a new commit index:
# the next entry's AppendEntries (usually sooner, under load) carries it for free
COMMIT_SEND_DELAY_S = 0.002
# a tick runs when the next heartbeat or election deadline falls due (`_next_timer_due`), and at
# least this often for the other timers (connection retries, handshake deadlines, the disk probe)
TICK_PERIOD_S = 0.1
# where pysyncobj's own election deadline is parked while pre-vote (raft.prevote) owns it
PRE_VOTE_PARK_S = 3600.0
# the status digest encodes the whole state on the loop (about 1.8 us per message held: 200k
# messages stalled a node 0.36 s, and a stall past the election timeout makes the followers
# elect another leader); above this many messages it is computed only when asked for
DIGEST_MESSAGES_MAX = 50_000
SNAPSHOT_CHUNK_BYTES = 1024 * 1024
# snapshots are encoded in a forked child (raft.snapshotter); the simulator turns this off, and
# QUORUMQ_SNAPSHOT_INLINE=1 too, only to measure against (scripts/bench_snapshot_stall.py --node)
SNAPSHOT_INLINE_ENV = "QUORUMQ_SNAPSHOT_INLINE"
SNAPSHOT_IN_CHILD = os.environ.get(SNAPSHOT_INLINE_ENV) != "1"
# test-only: "all" names every applied entry live in every snapshot (raft.retention in tests
# with real node processes, before machine v4 refers to bodies in the log)
TEST_LIVE_ENTRIES_ENV = "QUORUMQ_TEST_LIVE_ENTRIES"
# the peer transport: "quorumq" (raft/transport.py, the default) or "pysyncobj" (its pickle +
# zlib + Fernet transport, kept selectable only to measure against; every node must agree)
TRANSPORT_ENV = "QUORUMQ_RAFT_TRANSPORT"
TRANSPORTS = ("quorumq", "pysyncobj")


def transport_name() -> str:
    """The peer transport this process uses (TRANSPORT_ENV, default quorumq)."""
    name = os.environ.get(TRANSPORT_ENV, "") or "quorumq"
    if name not in TRANSPORTS:
        raise ValueError(f"{TRANSPORT_ENV} must be one of {TRANSPORTS}, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class RaftSettings:
    """Everything a RaftNode needs; addresses are pysyncobj `host:port` strings."""

    node_id: str
    address: str
    peers: dict[str, str]  # node id -> raft address, without this node
    data_dir: Path
    password: str
    supported_version: int
    incarnation: int
    fsync: str = "batch"
    bind_host: str = "127.0.0.1"
    election_timeout_ms: tuple[int, int] = (400, 800)
    heartbeat_ms: int = 50
    compaction_min_entries: int = 5000
    compaction_min_time_s: int = 300
    peer_dial: dict[str, str] = field(default_factory=dict)  # node id -> address to dial
    # the members the cluster was created with (the replicated member set before any change;
    # empty: this node and its peers, which is the same for a cluster that never changed)
    founders: tuple[str, ...] = ()
    # mutual TLS on the peer connections (built by cluster/tls.py; None: plain TCP)
    tls_server_context: ssl.SSLContext | None = None
    tls_client_context: ssl.SSLContext | None = None

    @property
    def journal_file(self) -> str:
        """pysyncobj's journalFile."""
        return str(self.data_dir / "raft.journal")

    @property
    def dump_file(self) -> str:
        """pysyncobj's fullDumpFile: our CBOR snapshot."""
        return str(self.data_dir / "raft.dump")


_MEMBERSHIP_PREFIX = bytes([_COMMAND_TYPE.MEMBERSHIP])  # pysyncobj's entry type byte
OutcomeListener = Callable[[Outcome], None]
MembershipCallback = Callable[[Any, "Refusal | None"], None]  # (reply, None) | (None, refusal)
SnapshotListener = Callable[[int], None]  # the index the state now stands at


class DialedTCPNode(TCPNode):  # type: ignore[misc]
    """A peer known by its raft address (its identity) but dialed at `dial` (e.g. a proxy)."""

    def __init__(self, address: str, dial: str) -> None:
        super().__init__(address)
        host, port = dial.rsplit(":", 1)
        self._dial = (host, int(port))
        self._proxied = dial != address

    @property
    def ip(self) -> Any:
        """The address to connect to (resolved like TCPNode when not proxied)."""
        return self._dial[0] if self._proxied else super().ip

    @property
    def port(self) -> int:
        """The port to connect to."""
        return self._dial[1]


class _BindOnTick:
    """Mixin for a pysyncobj transport: the constructor does not bind.

    Without its tick thread (autoTick off) pysyncobj binds in its constructor, retrying for
    ever while the port is taken; here the first tick binds and later ticks retry (every
    bindRetryTime), as the tick thread did, so the node can give up (`bound()`)."""

    _constructing = True
    _ready: bool

    @property
    def ready(self) -> bool:
        """Bound (or still being constructed: pysyncobj must not bind in its constructor)."""
        return bool(self._ready) or self._constructing


class _LoopQuorumTransport(_BindOnTick, QuorumTransport):
    pass


class _LoopPysyncobjTransport(_BindOnTick, TCPTransport):  # type: ignore[misc]
    pass


class _NoPipe:
    """pysyncobj's pipe notifier, replaced: a queued command asks the loop for a tick."""

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify


class RaftNode(SyncObj):  # type: ignore[misc]
    """A SyncObj with exactly one replicated method, `apply_entry(blob)`.

    Driven from an asyncio loop (`loop`: the node's; every pysyncobj callback, apply and
    `on_outcome` runs on it). Without `loop` the node gets a private loop in a daemon thread
    (tests and tools driving a node in-process); `destroy_synchronous()` stops it.
    """

    # pysyncobj's, set in its __init__ (typed for our guard and pre-vote)
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftLeader: Any

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
        self._refusals: dict[tuple[str, str], Refusal] = {}  # (op, node) -> why it was refused
        self._transfer_requested = False  # set by any thread, acted on by the next tick
        self._change_appended_at = 0  # index of the last change this node appended as leader
        self.stopped_reason: str | None = None
        self.crash_traceback: str | None = None  # set when an apply raised (a bug): see status
        # batch id -> the decoded commands of an entry this node submitted (skips a decode):
        # from the submitting code (hand_decoded) to the apply (one pop per entry)
        self._decoded_by_batch: dict[int, tuple[Any, ...]] = {}
        self._send_pending = False
        self._commit_send_at: float | None = None
        self._deferred_acks: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._on_outcome = on_outcome
        self._on_snapshot_loaded = on_snapshot_loaded
        # issue 24: how steadily the leader (as a follower) or each follower (as the leader) is
        # heard, for `applied_state_current` (raft/contact.py)
        self._leader_contact = Contact()
        self._follower_contacts: dict[str, Contact] = {}
        self._elected_at: float | None = None  # when this node last became leader (monotonic)
        self._applied_through = 0  # the last entry applied through apply_entry (raft.contact)
        # optional observers (the node's metrics): seconds per journal fsync, per entry applied
        self.observe_fsync: Callable[[float], None] | None = None
        self.observe_apply: Callable[[float], None] | None = None
        self._address_to_id = {addr: nid for nid, addr in settings.peers.items()}
        self._address_to_id.update({addr: nid for nid, addr in peers.items()})
        self._address_to_id[settings.address] = settings.node_id
        self._snapshots = SnapshotJob(None, Path(settings.dump_file), settings.fsync != "never")
        # entries whose bodies the node is reading back off the loop (raft.replica): a message
        # delivered and settled in one entry is not live, but its body must stay readable
        self.pinned_indexes: Callable[[], Iterable[int]] = tuple
        conf = _syncobj_conf(settings, self._serialize_snapshot, self._deserialize_snapshot)
        conf.serializeChecker = self._snapshots.poll
        self._pre_vote = PreVote(conf.raftMinTimeout)
        self.roles = RoleChanges(settings.node_id, conf.raftMinTimeout, conf.leaderFallbackTimeout)
        conf.onStateChanged = self._on_role_changed  # every change logged with its cause
        peer_nodes = [self._tcp_node(node_id, address) for node_id, address in peers.items()]
        # the loop drives pysyncobj: its sockets are the loop's readers/writers, its ticks run
        # after socket events, after proposals and on a timer (raft/ticker.py)
        self._loop_thread = LoopThread(f"raft-{settings.node_id}") if loop is None else None
        self.loop = loop if loop is not None else self._loop_thread.loop  # type: ignore[union-attr]
        self._ticker = LoopTicker(self.loop, self._tick, TICK_PERIOD_S, self._next_timer_due)
        self._loop_poller = LoopPoller(self.loop, self._ticker.tick_now)
        self._loop_poller.on_tick_end = self._end_of_tick
        self._loop_poller.on_failure = self._ticker.on_failure = self._stop_if_damaged
        self._destroyed = False
        transport_class = (
            _LoopQuorumTransport if transport_name() == "quorumq" else _LoopPysyncobjTransport
        )
        super().__init__(settings.address, peer_nodes, conf, transportClass=transport_class)
        journal = self._journal()
        self._snapshots.journal = journal if isinstance(journal, DurableFileJournal) else None
        self._SyncObj__serializer.getTransmissionData = self._transmission_data
        self._start_dump_pending = dump is not None  # the first dump loaded is this one
        if dump is not None:  # every live entry it names is retained or in the journal
            self._install_transferred(Path(settings.dump_file))
            self._load_live(dump, trust_log=True)
        self._replace_pipe_notifier()
        transport = self._SyncObj__transport
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

    def _replace_pipe_notifier(self) -> None:
        """A queued command asks the loop for a tick; pysyncobj's pipe is closed."""
        pipe = getattr(self, "_SyncObj__pipeNotifier", None)
        if pipe is not None:
            for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
                fd = getattr(pipe, name, None)
                if isinstance(fd, int):
                    self._loop_poller.unsubscribe(fd)
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self._SyncObj__pipeNotifier = _NoPipe(self._on_command_queued)

    def _on_command_queued(self) -> None:
        """A command was queued (pysyncobj's `_applyCommand`): on the loop, outside a tick,
        append it and send it now (the leader: AppendEntries, then its fsync; a follower:
        forwarded to the leader) instead of waiting for the next loop iteration's full tick."""
        self._ticker.run_or_request(self._append_queued)

    def _append_queued(self) -> None:
        if self._destroyed or not self._SyncObj__transport.ready:
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
        self._flush_acks()
        self.doTick(0.0)

    def _next_timer_due(self) -> float | None:
        """Seconds until pysyncobj's next heartbeat (leader with peers) or election / pre-vote
        deadline (follower, candidate) falls due; None when neither applies."""
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            if not self._SyncObj__otherNodes:
                return None
            due = self._SyncObj__newAppendEntriesTime
        else:
            due = min(self._pre_vote.deadline, self._SyncObj__raftElectionDeadline)
        return float(due) - float(monotonic_time())

    def _end_of_tick(self) -> None:
        """The end of every pysyncobj tick: the AppendEntries collected during the tick (one
        message per follower carrying the new entries and the commit index, then one fsync),
        and the next wake-up if the held-back commit index falls due before the timer."""
        wait = self._commit_send_due(TICK_PERIOD_S)
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

    def _SyncObj__applyLogEntries(self) -> bool:
        # stopped (older code than the log needs): keep the log, apply nothing; without this
        # pysyncobj would retry every pending entry, each raising, on every tick
        if self.stopped_reason is not None:
            return False
        # pysyncobj (unbatched) sends an AppendEntries after every apply, only to carry the new
        # commit index; it costs a message and an ack per follower per entry, so the leader
        # holds it back up to COMMIT_SEND_DELAY_S for a new entry's AppendEntries to carry it
        applied = SyncObj._SyncObj__applyLogEntries(self)
        if applied and self._commit_send_at is None and self._isLeader():
            self._commit_send_at = monotonic_time() + COMMIT_SEND_DELAY_S
        return False

    def _entry_term(self, index: int) -> int:
        entries = self._SyncObj__getEntries(index, 1)
        return int(entries[0][2]) if entries else 0

    # --- durability --------------------------------------------------------------------------

    def _journal(self) -> Any:
        return self._SyncObj__raftLog

    def sync_journal(self) -> None:
        """fsync the journal if it has unsynced records (no-op under `never`, and once the
        node is destroyed: its journal is closed)."""
        journal = self._journal()
        if isinstance(journal, DurableFileJournal) and not self._destroyed:
            started = time.perf_counter()
            if journal.sync() and self.observe_fsync is not None:
                self.observe_fsync(time.perf_counter() - started)

    def _SyncObj__sendNextNodeIdx(self, *args: Any, **kwargs: Any) -> None:
        # follower ack: collected, and sent at the next tick (or the end of this one) after one
        # fsync for all of them: entries must be on disk before the leader counts them
        self._deferred_acks.append((args, kwargs))

    def _flush_acks(self) -> None:
        if not self._deferred_acks:
            return
        self.sync_journal()
        acks, self._deferred_acks = self._deferred_acks, []
        for args, kwargs in acks:
            SyncObj._SyncObj__sendNextNodeIdx(self, *args, **kwargs)

    def _commit_send_due(self, timeout: float) -> float:
        """Schedule the held-back commit index: now if due (or if entries go out anyway), else
        poll no longer than until it is due."""
        if self._commit_send_at is None:
            return timeout
        left = self._commit_send_at - float(monotonic_time())
        if self._send_pending or left <= 0:
            self._commit_send_at = None
            self._send_pending = self._send_pending or bool(self._isLeader())
            return timeout
        return min(timeout, left)

    def _SyncObj__sendAppendEntries(self) -> None:
        # pysyncobj (unbatched) sends after every appended entry, after every apply and on each
        # heartbeat: collect them and send once, before the tick ends in `_end_of_tick`
        self._send_pending = True

    def _flush_sends(self) -> None:
        if not self._send_pending:
            return
        self._send_pending = False
        # leader: send first so the followers' fsyncs overlap ours; ours still completes before
        # the loop reads any ack (we return to it after this), so an entry is never counted as
        # committed, nor its commit index sent out, before the leader's copy is on disk
        SyncObj._SyncObj__sendAppendEntries(self)
        self.sync_journal()

    # --- snapshots (pysyncobj serializer hooks) ----------------------------------------------

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
        with self.lock:
            self.replicated_state.restore(body)
            meta = self.replicated_state.meta
            if meta.effective_version > self.settings.supported_version:
                self.stopped_reason = (
                    f"machine version {meta.effective_version} is effective; this node supports "
                    f"only up to {self.settings.supported_version}: restart it with newer code"
                )
                log.error("apply_stopped", reason=self.stopped_reason)
        raft = body["raft"]
        last, prev = raft["last"], raft["prev"]
        log.info("snapshot_loaded", index=last[1])
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
        serializer = self._SyncObj__serializer
        if serializer._Serializer__pid != 0:
            return None  # a snapshot is being taken
        transmissions = serializer._Serializer__transmissions
        transmission = transmissions.get(transmission_id)
        if transmission is None:
            try:
                stream = TransferStream(Path(self.settings.dump_file), self._snapshots.journal)
            except OSError as err:
                log.error("snapshot_transfer_failed", error=repr(err))
                return None
            transmission = transmissions[transmission_id] = {"file": stream, "transmitted": 0}
        is_first = transmission["transmitted"] == 0
        try:
            data = transmission["file"].read(serializer._Serializer__transmissionBatchSize)
        except (OSError, RaftError) as err:
            log.error("snapshot_transfer_failed", error=repr(err))
            transmissions.pop(transmission_id, None)
            transmission["file"].close()
            return False
        transmission["transmitted"] += len(data)
        if not data:
            transmissions.pop(transmission_id, None)
        return data, is_first, not data

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

    # --- leadership guard --------------------------------------------------------------------

    def _guard_leadership(self) -> None:
        """A node that stopped applying never stands for election and hands leadership over;
        nor does a node outside the member set it applied (one that joins and has not caught
        up to its own addition, or one that was removed): its term would only disrupt.

        pysyncobj has no pre-vote hook, so this pushes the election deadline away instead.
        """
        if self._transfer_requested:
            self._transfer_requested = False
            if self._isLeader():
                log.info("leadership_transfer_requested")
                self.transferLeadership()
        if self.stopped_reason is None:
            if self.settings.node_id in self.replicated_state.meta.members:
                return
            self._SyncObj__raftElectionDeadline = monotonic_time() + 3600
            return
        self._SyncObj__raftElectionDeadline = monotonic_time() + 3600
        if self._isLeader():
            self.transferLeadership()

    # --- pre-vote (raft.prevote) ---------------------------------------------------------------

    def _pre_vote_gate(self) -> None:
        """End of every tick: own the election deadline. pysyncobj stands when its deadline
        has passed; it is kept parked far away, and whatever pysyncobj set it to meanwhile (a
        leader heard from, a vote given, an election started, the guard) becomes the time of
        the next pre-vote round. A round won sets it to 0: pysyncobj stands at the next tick."""
        pre_vote = self._pre_vote
        if self._SyncObj__raftState == _RAFT_STATE.LEADER or self._SyncObj__selfNode is None:
            pre_vote.end_round()
            pre_vote.parked = None
            return
        deadline = self._SyncObj__raftElectionDeadline
        if deadline != pre_vote.parked:
            pre_vote.deadline = deadline
            pre_vote.end_round()
        if self._SyncObj__transferInProgress:
            return  # the leader asked this node to take over (timeout_now): no round
        now = monotonic_time()
        if now >= pre_vote.deadline and self._SyncObj__connectedToAnyone():
            self_node = self._SyncObj__selfNode
            term = self._SyncObj__raftCurrentTerm + 1
            if self._SyncObj__raftLeader is not None:
                # as a candidate would (etcd's pre-candidate too): no leader to count on, so
                # forwarded commands fail over and stale reads are refused meanwhile
                self._SyncObj__raftLeader = None
                self._SyncObj__onLeaderChanged()
            pre_vote.start_round(term, self_node, now, self._SyncObj__generateRaftTimeout())
            if pre_vote.count(term, self_node, len(self._SyncObj__otherNodes) + 1):
                self._stand_now()  # no other voter
                return
            request = {
                "type": PRE_VOTE,
                "term": term,
                "last_log_index": self._SyncObj__getCurrentLogIndex(),
                "last_log_term": self._SyncObj__getCurrentLogTerm(),
            }
            for node in self._SyncObj__otherNodes:
                self._SyncObj__transport.send(node, request)
        pre_vote.parked = now + PRE_VOTE_PARK_S
        self._SyncObj__raftElectionDeadline = pre_vote.parked

    def _heard_follower(self, peer: str | None, message: dict[str, Any]) -> None:
        """A follower answered our AppendEntries (raft.contact): heard; and, when it holds the
        first entry of this leadership (the no-op appended when elected), acknowledged."""
        if peer is None:
            return
        now = monotonic_time()
        contact = self._follower_contacts.setdefault(peer, Contact())
        contact.heard(peer, now)
        first = int(self._SyncObj__noopIDx or 0)
        if (
            self._elected_at is not None
            and self._SyncObj__raftState == _RAFT_STATE.LEADER
            and message.get("success") is True
            and first > 0
            and _int_or(message.get("next_node_idx"), 0) > first
        ):
            contact.acknowledged(now, self._elected_at)

    def _on_role_changed(self, old: int, new: int) -> None:
        if new == _RAFT_STATE.LEADER:
            self._elected_at = monotonic_time()
        silent = monotonic_time() - self._pre_vote.last_leader_contact
        self.roles.changed(old, new, self._SyncObj__raftCurrentTerm, silent)

    def _stand_now(self) -> None:
        """A pre-vote round was won: pysyncobj starts the election at its next tick."""
        log.info("pre_vote_won", term=self._SyncObj__raftCurrentTerm + 1)
        self._SyncObj__raftElectionDeadline = 0
        self._pre_vote.parked = None
        self._ticker.request()

    def _answer_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        """Would this node vote for the sender in the term it proposes? Nothing changes here."""
        try:
            proposed = _int(message["term"])
            last_log = (_int(message["last_log_term"]), _int(message["last_log_index"]))
        except (KeyError, TypeError):
            log.warning("pre_vote_malformed", peer=self.node_id_of(node.id))
            return
        granted = self._pre_vote.grants(
            monotonic_time(),
            leading=self._SyncObj__raftState == _RAFT_STATE.LEADER,
            current_term=self._SyncObj__raftCurrentTerm,
            last_log=(self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex()),
            proposed_term=proposed,
            candidate_last_log=last_log,
        )
        self._SyncObj__transport.send(
            node,
            {
                "type": PRE_VOTE_RESPONSE,
                "term": proposed,
                "current_term": self._SyncObj__raftCurrentTerm,
                "granted": granted,
            },
        )

    def _count_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        """A peer's answer to this node's round: stand on a majority of yes; a no from a later
        term moves this node to that term (as any message of a later term does in Raft)."""
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            return
        term, current = message.get("term"), message.get("current_term")
        if message.get("granted") is True and type(term) is int:
            others = self._SyncObj__otherNodes
            if node in others and self._pre_vote.count(term, node, len(others) + 1):
                self._stand_now()
        elif type(current) is int and current > self._SyncObj__raftCurrentTerm:
            self._pre_vote.end_round()
            self._SyncObj__setCurrentTerm(current, None)
            self._SyncObj__setState(_RAFT_STATE.FOLLOWER)

    def _checkCommandsToApply(self) -> None:
        # the leader appends submitted commands here: on ENOSPC the journal undid the write and
        # logged it; the command is not in the log and its submitter times out (the batcher
        # answers `disk_full` at once to everything submitted after)
        with contextlib.suppress(DiskFullError):
            SyncObj._checkCommandsToApply(self)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        # a follower appends the leader's entries here: on ENOSPC it does not ack them, and the
        # leader sends them again (after the conflicting tail is cut) until space returns
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == PRE_VOTE:
            self._answer_pre_vote(node, message)
            return
        if kind == PRE_VOTE_RESPONSE:
            self._count_pre_vote(node, message)
            return
        if kind == "append_entries" and _int_or(message.get("term"), -1) >= (
            self._SyncObj__raftCurrentTerm
        ):
            self._pre_vote.heard_from_leader(monotonic_time())
            self._leader_contact.heard(self.node_id_of(node), monotonic_time())
        elif kind == "next_node_idx":  # a follower's answer to our AppendEntries
            self._heard_follower(self.node_id_of(node), message)
        snapshot_chunk = (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" not in message
        )
        if snapshot_chunk:
            self._snapshots.cancel()  # its rename must never land over the leader's snapshot
            message = self._without_commit_advance(message)
        elif self._is_checked_append(message):
            message = self._trim_present_entries(node, message)
            if message is None:
                return
        with contextlib.suppress(DiskFullError):
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        if snapshot_chunk:
            self._commit_loaded_snapshot()

    def _is_checked_append(self, message: Any) -> bool:
        """An AppendEntries pysyncobj checks against our log (prevLogIdx), of a current term."""
        return (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and "transmission" not in message
            and int(message.get("term", -1)) >= int(self._SyncObj__raftCurrentTerm)
        )

    def _trim_present_entries(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """Raft's rule, which pysyncobj skips: a follower cuts its log only at the first entry
        that conflicts (same index, other term), never entries it holds that match. pysyncobj
        cut everything after prevLogIdx on every AppendEntries, so a late or repeated one
        (reconnects, a leader resending from an older next index) took entries this follower
        had already acknowledged, and applied, off its log: the leader had counted them, so a
        confirmed entry could be on fewer nodes than a majority. Entries we already hold are
        dropped from the message (prevLogIdx moves past them); when all of them are held and
        our log goes further, nothing is cut: the message is answered here with the index the
        leader verified, and the commit index moves no further than that."""
        entries = list(message.get("entries", []))
        prev = int(message["prevLogIdx"])
        ours = self._SyncObj__getEntries(prev)
        if not ours or ours[0][2] != message["prevLogTerm"]:
            return message  # pysyncobj answers the mismatch (and cuts nothing)
        held = 0
        for entry in entries:
            position = held + 1
            if position >= len(ours) or ours[position][2] != entry[2]:
                break
            held += 1
        verified = prev + held
        if held < len(entries) or len(ours) - 1 == held:
            prev_term = entries[held - 1][2] if held else message["prevLogTerm"]
            return {**message, "prevLogIdx": verified, "prevLogTerm": prev_term,
                    "entries": entries[held:]}  # fmt: skip
        # every entry held and our log goes further: cut nothing; commit at most `verified`
        header = {
            key: value for key, value in message.items() if key not in ("prevLogIdx", "entries")
        }
        header["commit_index"] = min(int(message["commit_index"]), verified)
        with contextlib.suppress(DiskFullError):
            SyncObj._SyncObj__onMessageReceived(self, node, header)
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=verified + 1, success=True)
        return None

    def _without_commit_advance(self, message: dict[str, Any]) -> dict[str, Any]:
        """A snapshot chunk checks nothing of this node's log (no prevLogIdx), yet pysyncobj
        sets the commit index to min(the leader's, our last index) on every chunk: a follower
        holding entries no leader committed (appended while it led, cut off by a partition)
        applied them and answered their publishes Ok, and the snapshot then replaced them: a
        confirmed message lost (seed-5 chaos run). Such a message may not advance it."""
        own = int(self._SyncObj__raftCommitIndex)
        leader_commit = int(message.get("commit_index", 0))
        if leader_commit <= own:
            return message
        log_end = int(self._SyncObj__getCurrentLogIndex())
        if log_end > own:  # entries of ours pysyncobj would have taken as committed
            log.info(
                "snapshot_chunk_commit_held", commit=own, log_end=log_end, leader=leader_commit
            )
        return {**message, "commit_index": own}

    def _commit_loaded_snapshot(self) -> None:
        """After a snapshot load the log is the leader's committed prefix up to the snapshot:
        commit up to it (what pysyncobj did on the last chunk)."""
        applied = int(self._SyncObj__raftLastApplied)
        if applied > int(self._SyncObj__raftCommitIndex):
            self._SyncObj__raftCommitIndex = applied
            self._SyncObj__raftLog.setRaftCommitIndex(applied)

    def disk_full(self) -> bool:
        """Whether the journal's last write failed for lack of space (no probe succeeded yet)."""
        journal = self._journal()
        return isinstance(journal, DurableFileJournal) and journal.disk_full

    def _probe_disk(self) -> None:
        """While the disk is full: probe for space once a second; a leader hands leadership to
        a peer that can still write, and this node stands for no election until space
        returns."""
        journal = self._journal()
        if not isinstance(journal, DurableFileJournal) or not journal.disk_full:
            return
        if journal.probe_space():
            return
        self._SyncObj__raftElectionDeadline = monotonic_time() + 3600
        if self._isLeader() and monotonic_time() >= getattr(self, "_disk_transfer_at", 0.0):
            self._disk_transfer_at = monotonic_time() + 1.0
            log.warning("leadership_transfer_disk_full")
            self.transferLeadership()

    # --- membership ------------------------------------------------------------------------------

    def _tcp_node(self, node_id: str, address: str) -> DialedTCPNode:
        """The pysyncobj node of a member (dialed through `peer_dial` if it names one)."""
        return DialedTCPNode(address, self.settings.peer_dial.get(node_id, address))

    def change_membership(self, change: MemberChange, callback: MembershipCallback) -> None:
        """Append a membership change through the leader (thread-safe): `callback(reply, None)`
        from inside a tick once this node applied it (the reply of the member set switch), or
        `callback(None, why)` if the leader refused it or it was lost."""
        key = (change.op, change.node)
        self._refusals.pop(key, None)
        payload = membership.encode_change(change)
        try:
            membership.decode_change(payload)  # what every node will read: refuse it now
        except MembershipError as err:
            callback(None, Refusal(str(err)))
            return

        def done(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                callback(result, None)
                return
            refusal = self._refusals.pop(key, None)
            if refusal is None:
                message = _FAIL_REASONS.get(error, f"failed (pysyncobj reason {error})")
                refusal = Refusal(message, unavailable=error != FAIL_REASON.REQUEST_DENIED)
            callback(None, refusal)

        self._applyCommand(payload, done, _COMMAND_TYPE.MEMBERSHIP)

    def _SyncObj__parseChangeClusterRequest(self, command: bytes) -> list[Any] | None:
        # our payload is CBOR (raft.membership), never a pickle; pysyncobj reads
        # [op, node id, node] and we carry the decoded change as a fourth item
        if not command or command[0] != _COMMAND_TYPE.MEMBERSHIP:
            return None
        try:
            change = membership.decode_change(bytes(command[1:]))
        except MembershipError as err:
            # not None: pysyncobj would append it as an ordinary entry; an unknown op is
            # refused by the leader (`_SyncObj__changeCluster`) and a no-op anywhere else
            log.error("membership_entry_malformed", error=str(err))
            return ["invalid", _INVALID_NODE.id, _INVALID_NODE, None]
        self._address_to_id.setdefault(change.raft, change.node)
        node = self._tcp_node(change.node, change.raft)
        return ["add" if change.op == "add" else "rem", change.raft, node, change]

    def _SyncObj__changeCluster(self, request: list[Any]) -> bool:
        # the leader, before it appends a change: our checks replace pysyncobj's (whose "one
        # change in flight" test never fires: it never records the change's index)
        change = request[3] if len(request) > 3 else None
        if not isinstance(change, MemberChange):
            log.warning("membership_change_refused", reason="malformed change")
            return False
        refusal = self._refusal(change)
        if refusal is not None:
            self._refusals[(change.op, change.node)] = refusal
            log.warning("membership_change_refused", reason=refusal.message)
            return False
        accepted = bool(self._SyncObj__doChangeCluster(request))
        if accepted:
            # pysyncobj appends it right after this returns, at the next index
            self._change_appended_at = int(self._SyncObj__getCurrentLogIndex()) + 1
            log.info("membership_change_appended", op=change.op, node=change.node)
        return accepted

    def _refusal(self, change: MemberChange) -> Refusal | None:
        """Why the leader must not append `change` now (inside a tick), or None."""
        applied = int(self.raftLastApplied)
        if applied < int(self._SyncObj__noopIDx or 0):
            return Refusal(
                "the leader was elected moments ago (its first entry is not applied yet): retry",
                unavailable=True,
            )
        pending = self._pending_change_index(applied)
        if pending is not None:
            return Refusal(
                f"another membership change is in flight (log index {pending}): wait until it "
                "is applied, then retry",
                unavailable=True,
            )
        with self.lock:
            refused = member_change_refusal(self.replicated_state.meta, change)
        if refused is not None:
            return Refusal(refused)
        if change.op == "remove" and change.node == self.settings.node_id:
            return Refusal(f"{change.node} is the leader: hand leadership over first, then retry")
        known = {node.address for node in self.otherNodes} | {self.settings.address}
        if change.op == "add" and change.raft in known:
            return Refusal(f"raft address {change.raft} is already a member's")
        if change.op == "add" and len(known) >= membership.MEMBERS_MAX:
            return Refusal(f"the cluster has {len(known)} members, the most it may have")
        return self._quorum_left(change)

    def _pending_change_index(self, applied: int) -> int | None:
        """The index of a membership entry in the log after `applied`, if there is one."""
        last = int(self._SyncObj__getCurrentLogIndex())
        if last <= applied:
            return None
        for entry in self._SyncObj__getEntries(applied + 1, last - applied):
            if entry[0][:1] == _MEMBERSHIP_PREFIX:
                return int(entry[1])
        return None

    def _quorum_left(self, change: MemberChange) -> Refusal | None:
        """Refuse a change after which the members that answer now would not be a majority
        (as etcd's strict reconfiguration check: replace a dead member by removing it first)."""
        connected = self._SyncObj__connectedNodes
        answering = {self.settings.address} | {
            node.address for node in self.otherNodes if node in connected
        }
        size = len(self.otherNodes) + 1
        if change.op == "add":
            size_after, answering_after = size + 1, len(answering)
        else:
            size_after, answering_after = size - 1, len(answering - {change.raft})
        needed = size_after // 2 + 1
        if answering_after >= needed:
            return None
        hint = " (remove a dead member before adding its replacement)" if change.op == "add" else ""
        return Refusal(
            f"no quorum after the change: {answering_after} of the {size_after} members would "
            f"answer, {needed} are needed{hint}",
            unavailable=True,
        )

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:
        if command[:1] != _MEMBERSHIP_PREFIX or self.stopped_reason is not None:
            return SyncObj._SyncObj__doApplyCommand(self, command)
        request = self._SyncObj__parseChangeClusterRequest(command)
        reply = None
        if request is not None:
            reply = self._apply_member_change(request[3])
        SyncObj._SyncObj__doApplyCommand(self, command)  # pysyncobj's peers (a no-op if done)
        return reply

    def _apply_member_change(self, change: MemberChange) -> Any:
        """Apply a committed change to the replicated member set, persist it, hand it over."""
        index = self.raftLastApplied + 1
        with self.lock:
            outcome = self.replicated_state.apply_member_change(
                index, self._entry_term(index), change
            )
            members = self.replicated_state.meta.addresses
        reply = outcome.replies[0] if outcome.replies else None
        log.info(
            "membership_changed", index=index, op=change.op, node=change.node, reply=repr(reply)
        )
        self._persist_members(index, members)
        self.sync_journal()
        try:
            self._on_outcome(outcome)
        except Exception:  # a listener bug must not wedge the log
            log.exception("outcome_listener_failed", index=index)
        return reply

    def _persist_members(self, index: int, addresses: dict[str, tuple[str, str]]) -> None:
        """Write the member set to `<data dir>/members` if it changed (and learn addresses)."""
        if not addresses:
            return
        members = tuple(sorted(membership.Member(n, r, c) for n, (r, c) in addresses.items()))
        for member in members:
            self._address_to_id[member.raft] = member.id
            if member.id != self.settings.node_id:
                self._peer_nodes[member.id] = self._tcp_node(member.id, member.raft)
        if self._member_set is not None and self._member_set.members == members:
            return
        self._member_set = MemberSet(index, members)
        membership.write_member_set(self.settings.data_dir, self._member_set)

    def request_leadership_transfer(self) -> None:
        """Hand leadership over on the next tick, if this node leads (thread-safe)."""
        self._transfer_requested = True

    def members(self) -> list[dict[str, Any]]:
        """The applied member set: id, raft and client address (addresses only once a change
        recorded them; before, cluster.toml has them)."""
        with self.lock:
            meta = self.replicated_state.meta
            return [
                {
                    "id": node,
                    "raft": meta.addresses.get(node, ("", ""))[0] or None,
                    "client": meta.addresses.get(node, ("", ""))[1] or None,
                }
                for node in meta.members
            ]

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
        transport = self._SyncObj__transport
        connected = self._SyncObj__connectedNodes
        timeout = self._SyncObj__conf.connectionTimeout
        now = monotonic_time()
        for node, conn in list(getattr(transport, "_connections", {}).items()):
            if isinstance(conn, PeerConnection):
                continue  # its transport enforces its own deadlines on every tick
            if node in connected or conn.state == CONNECTION_STATE.DISCONNECTED:
                continue
            if now - conn._TcpConnection__lastReadTime > timeout:
                log.warning("peer_handshake_expired", peer=self.node_id_of(node))
                conn.disconnect()

    # --- submitting and status ---------------------------------------------------------------

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

    def node_id_of(self, address: Any) -> str | None:
        """The node id of a pysyncobj node or address."""
        if address is None:
            return None
        return self._address_to_id.get(getattr(address, "id", str(address)))

    def leader_id(self) -> str | None:
        """The node id of the current leader as this node sees it."""
        return self.node_id_of(self._getLeader())

    def applied_state_current(self) -> bool:
        """Whether what this node applied is current, so its deliveries may go out (issue 24,
        the rule in raft/contact.py): leading with a majority heard steadily, or following a
        connected leader heard steadily, its state applied through what that leader said was
        committed."""
        if self.stopped_reason is not None or self._destroyed:
            return False
        now = monotonic_time()
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            others = self._SyncObj__otherNodes
            peers = [peer for node in others if (peer := self.node_id_of(node)) is not None]
            return majority_steady(self._follower_contacts, peers, now, self._elected_at)
        leader = self.leader_id()
        connected = leader is not None and self.peer_connected(leader)
        leader_commit = self._SyncObj__leaderCommitIndex
        commit = None if leader_commit is None else int(leader_commit)
        applied = max(self._applied_through, int(self.raftLastApplied))
        return follower_current(self._leader_contact, leader, connected, now, applied, commit)

    def role(self) -> str:
        """leader | follower | candidate | stopped (stopped applying)."""
        if self.stopped_reason is not None:
            return "stopped"
        # the state alone, not pysyncobj's whole status map (the node's timers ask every 100 ms)
        return ROLES.get(int(self._SyncObj__raftState), "follower")

    def bound(self) -> bool:
        """Whether the raft port is bound (pysyncobj retries a failed bind forever)."""
        return bool(self._SyncObj__transport.ready)

    def peer_connected(self, node_id: str) -> bool:
        """Whether this node has a live raft connection to `node_id`."""
        node = self._peer_nodes.get(node_id)
        return node is not None and bool(self.isNodeConnected(node))

    def status(
        self, with_digest: bool = True, digest_messages_max: int | None = DIGEST_MESSAGES_MAX
    ) -> dict[str, Any]:
        """This node's status map (see cluster.protocol's "status" query).

        The digest costs a full encoding of the state under the apply lock (the loop waits):
        skip it when polling. With more than `digest_messages_max` messages held (None: no
        bound) it is left out too, `digest_skipped` saying why.
        """
        raw = self._raw_status()
        with self.lock:
            meta = self.replicated_state.meta
            skipped = None
            held = self._messages_held() if with_digest and digest_messages_max is not None else 0
            if digest_messages_max is not None and held > digest_messages_max:
                with_digest = False
                skipped = (
                    f"{held} messages held (more than {digest_messages_max}): computing the "
                    f"digest would stall this node about {held * 2 // 1000} ms; ask for it "
                    "explicitly (status query argument digest, `cluster status --digest`)"
                )
            status: dict[str, Any] = {
                "role": self.role(),
                "term": int(raw["raft_term"]),
                "commit_index": int(raw["commit_idx"]),
                # the index of the last entry our method applied: the digest is exactly at it
                "last_applied": meta.last_index,
                "raft_last_applied": int(raw["last_applied"]),
                "effective_machine_version": meta.effective_version,
                "supported_machine_version": self.settings.supported_version,
                "digest": self.replicated_state.digest() if with_digest else None,
                "leader": self.leader_id(),
                "log_len": int(raw["log_len"]),
                "has_quorum": bool(raw["has_quorum"]),
                "members": list(meta.members),
                # a change this node appended (as leader) is not applied yet
                "membership_change_pending": self._change_appended_at > int(raw["last_applied"]),
                "role_changes": self.roles.counts(),  # "from->to" -> count (raft.roles)
            }
        if skipped is not None:
            status["digest_skipped"] = skipped
        if self.stopped_reason is not None:
            status["reason"] = self.stopped_reason
        if self.crash_traceback is not None:
            status["traceback"] = self.crash_traceback
        return status

    def _messages_held(self) -> int:
        return sum(q.messages_total for q in self.replicated_state.state.queues.values())

    def _raw_status(self) -> dict[str, Any]:
        # getStatus iterates pysyncobj dicts a tick may resize (when read from another thread:
        # metrics, tests): retry on that race
        for _ in range(5):
            try:
                return dict(self.getStatus())
            except RuntimeError:
                time.sleep(0.001)
        return dict(self.getStatus())

    def now_ms(self) -> int:
        """The submitter clock stamped into entries (wall clock, made monotonic in apply)."""
        return int(time.time() * 1000)


def _syncobj_conf(
    settings: RaftSettings, serializer: Callable[..., Any], deserializer: Callable[..., Any]
) -> Any:
    """pysyncobj's configuration: journal + CBOR dump always together, password, timeouts."""
    low, high = settings.election_timeout_ms
    return SyncObjConf(
        # our transport authenticates with the secret itself; pysyncobj's uses it for Fernet
        password=settings.password if transport_name() == "pysyncobj" else None,
        bindAddress=f"{settings.bind_host}:{settings.address.rsplit(':', 1)[1]}",
        journalFile=settings.journal_file,
        fullDumpFile=settings.dump_file,
        serializer=serializer,
        deserializer=deserializer,
        appendEntriesUseBatch=False,  # we group-commit ourselves; send at once
        appendEntriesPeriod=settings.heartbeat_ms / 1000,
        # larger than any entry (frames are at most 16 MiB): pysyncobj's chunked transfer
        # of a single oversized entry miscounts its last chunk, so it must never be used
        appendEntriesBatchSizeBytes=APPEND_ENTRIES_BYTES_MAX,
        raftMinTimeout=low / 1000,
        raftMaxTimeout=high / 1000,
        leaderFallbackTimeout=2 * high / 1000,
        connectionTimeout=max(0.5, 2 * high / 1000),
        connectionRetryTime=0.3,
        autoTick=False,  # the node's loop ticks it (raft/ticker.py)
        autoTickPeriod=TICK_PERIOD_S,
        # a snapshot goes to a lagging follower in chunks of this size, one per AppendEntries
        # (with issue 32 it carries the live entries' bodies: 64 KiB per tick was too slow)
        logCompactionBatchSize=SNAPSHOT_CHUNK_BYTES,
        logCompactionMinEntries=settings.compaction_min_entries,
        logCompactionMinTime=settings.compaction_min_time_s,
        commandsWaitLeader=True,
        dynamicMembershipChange=True,  # through raft.membership's entries only
    )


def _int(value: Any) -> int:
    """`value` if it is an int (not a bool), else TypeError."""
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _int_or(value: Any, default: int) -> int:
    return value if type(value) is int else default


_INVALID_NODE = TCPNode("invalid:0")  # the node of a malformed change (never dialed)

_FAIL_REASONS = {
    FAIL_REASON.QUEUE_FULL: "the leader's command queue is full: retry",
    FAIL_REASON.MISSING_LEADER: "no leader: the cluster has no quorum",
    FAIL_REASON.DISCARDED: "the change was cut from the log by a new leader: check the members",
    FAIL_REASON.NOT_LEADER: "this node is not the leader",
    FAIL_REASON.LEADER_CHANGED: "the leader changed: check the members, then retry",
    FAIL_REASON.REQUEST_DENIED: "the leader refused the change: check the members, then retry",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown outcome (the leader changed): check the members",
}
