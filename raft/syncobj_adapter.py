"""The one module that touches pysyncobj's private (name-mangled) names.

pysyncobj 0.3.17 keeps its Raft state and the steps we change in `SyncObj.__x` names (so
`_SyncObj__x` from outside). `SyncObjAdapter` is the only place they are spelled:
- the state we read or set, as plain properties and methods (`raft_state`, `current_term`,
  `commit_index`, `election_deadline`, `get_entries`, ...);
- the steps we override, each forwarded to a plain hook whose default is pysyncobj's own step
  (`on_peer_message`, `apply_command`, `apply_log_entries`, `send_ack`, `send_append_entries`,
  `entries_to_send`, `parse_change_request`, `change_cluster`), with pysyncobj's step callable
  as `syncobj_*`;
- the other classes' privates (the pipe notifier, a connection's last read, the serializer's
  transmissions).
`PRIVATE_NAMES` lists every one (tests/raft/test_adapter_boundary.py checks that each still
exists in the installed pysyncobj, and that no other module of raft/ or cluster/ names one).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.serializer import Serializer
from pysyncobj.tcp_connection import TcpConnection

# owner class -> the private attributes and methods used here (instance attributes are set by
# the owner's constructor; the test builds one to check them)
PRIVATE_NAMES: dict[type, tuple[str, ...]] = {
    SyncObj: (
        "applyLogEntries", "changeCluster", "commandsWaitingCommit", "commandsWaitingReply",
        "conf", "connectedNodes",
        "connectedToAnyone",
        "doApplyCommand", "doChangeCluster", "generateRaftTimeout", "getCurrentLogIndex",
        "getCurrentLogTerm", "getEntries", "leaderCommitIndex", "newAppendEntriesTime",
        "noopIDx", "onLeaderChanged", "onMessageReceived", "onNodeDisconnected", "otherNodes",
        "parseChangeClusterRequest", "pipeNotifier", "raftCommitIndex", "raftCurrentTerm",
        "raftElectionDeadline", "raftLastApplied", "raftLeader", "raftLog", "raftMatchIndex",
        "raftNextIndex",
        "raftState",
        "selfNode", "sendAppendEntries", "sendNextNodeIdx", "serializer", "setCurrentTerm",
        "setState", "transferInProgress", "transport",
    ),
    PipeNotifier: ("pipeR", "pipeW"),
    TcpConnection: ("lastReadTime",),
    Serializer: ("pid", "transmissionBatchSize", "transmissions"),
}  # fmt: skip


class _NoPipe:
    """pysyncobj's pipe notifier, replaced: a queued command asks the loop for a tick."""

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify


def connection_last_read(conn: Any) -> float:
    """When pysyncobj's TCP connection `conn` last read anything (its monotonic clock)."""
    return float(conn._TcpConnection__lastReadTime)


class SyncObjAdapter(SyncObj):  # type: ignore[misc]
    """A SyncObj whose private state and overridden steps have plain names (module doc)."""

    # pysyncobj's, set in its __init__ (typed for the guard and pre-vote)
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftLeader: Any

    def __dir__(self) -> list[str]:
        """Without our properties: SyncObj.__init__ reads every name dir() lists (looking for
        @replicated methods) before it has set the private state they return."""
        cls = type(self)
        return [n for n in super().__dir__() if not isinstance(getattr(cls, n, None), property)]

    # --- state ---------------------------------------------------------------------------------

    @property
    def raft_state(self) -> Any:
        """pysyncobj's `_RAFT_STATE` of this node (follower, candidate, leader)."""
        return self._SyncObj__raftState

    @property
    def current_term(self) -> Any:
        """The current Raft term."""
        return self._SyncObj__raftCurrentTerm

    @property
    def commit_index(self) -> Any:
        """This node's commit index (in memory; `raft_log` keeps the persisted one)."""
        return self._SyncObj__raftCommitIndex

    @commit_index.setter
    def commit_index(self, value: int) -> None:
        self._SyncObj__raftCommitIndex = value

    @property
    def last_applied(self) -> Any:
        """The index of the last entry pysyncobj applied."""
        return self._SyncObj__raftLastApplied

    @property
    def leader_commit_index(self) -> Any:
        """The commit index the leader last sent (None before any)."""
        return self._SyncObj__leaderCommitIndex

    @property
    def election_deadline(self) -> Any:
        """When pysyncobj stands for election (its monotonic clock)."""
        return self._SyncObj__raftElectionDeadline

    @election_deadline.setter
    def election_deadline(self, value: float) -> None:
        self._SyncObj__raftElectionDeadline = value

    @property
    def raft_leader(self) -> Any:
        """The leader's pysyncobj node as this node sees it (None: no leader)."""
        return self._SyncObj__raftLeader

    @raft_leader.setter
    def raft_leader(self, value: Any) -> None:
        self._SyncObj__raftLeader = value

    @property
    def other_nodes(self) -> Any:
        """pysyncobj's set of the other members' nodes."""
        return self._SyncObj__otherNodes

    @property
    def connected_nodes(self) -> Any:
        """The other members' nodes this node is connected to."""
        return self._SyncObj__connectedNodes

    @property
    def self_node(self) -> Any:
        """This node's own pysyncobj node (None before the transport set it)."""
        return self._SyncObj__selfNode

    @property
    def raft_transport(self) -> Any:
        """pysyncobj's transport object (ours: raft.transport, or its TCPTransport)."""
        return self._SyncObj__transport

    @property
    def raft_log(self) -> Any:
        """pysyncobj's journal (ours: raft.durability.DurableFileJournal)."""
        return self._SyncObj__raftLog

    @property
    def syncobj_conf(self) -> Any:
        """pysyncobj's SyncObjConf of this node."""
        return self._SyncObj__conf

    @property
    def noop_index(self) -> Any:
        """The index of the no-op entry this node appended when last elected (or None)."""
        return self._SyncObj__noopIDx

    @property
    def transfer_in_progress(self) -> bool:
        """Whether the leader asked this node to take over (timeout_now)."""
        return bool(self._SyncObj__transferInProgress)

    @property
    def next_append_entries_time(self) -> Any:
        """When the leader's next heartbeat falls due."""
        return self._SyncObj__newAppendEntriesTime

    @next_append_entries_time.setter
    def next_append_entries_time(self, value: float) -> None:
        self._SyncObj__newAppendEntriesTime = value

    @property
    def match_index(self) -> Any:
        """The leader's match index per follower node (the last entry it is known to hold)."""
        return self._SyncObj__raftMatchIndex

    # --- pysyncobj's private steps, called -------------------------------------------------------

    def set_next_index(self, node: Any, index: int) -> None:
        """The next entry the leader sends `node` (pysyncobj moves it past each send)."""
        self._SyncObj__raftNextIndex[node] = index

    def get_entries(self, start: int, count: int | None = None) -> Any:
        """The log entries (command, index, term) from `start` (`count` of them, or all)."""
        return self._SyncObj__getEntries(start, count)

    def current_log_index(self) -> Any:
        """The index of the last entry of the log."""
        return self._SyncObj__getCurrentLogIndex()

    def current_log_term(self) -> Any:
        """The term of the last entry of the log."""
        return self._SyncObj__getCurrentLogTerm()

    def leader_changed(self) -> None:
        """pysyncobj's reaction to a leader change (fails the commands waiting on it)."""
        self._SyncObj__onLeaderChanged()

    def waiting_forwards(self) -> dict[int, Callable[[Any, int], None]]:
        """The callbacks of commands forwarded to the leader, by request id, awaiting its answer."""
        waiting: dict[int, Callable[[Any, int], None]] = self._SyncObj__commandsWaitingReply
        return waiting

    def waiting_commit_indexes(self) -> list[int]:
        """The log indexes whose commit a command of this node waits for, lowest first."""
        return sorted(self._SyncObj__commandsWaitingCommit)

    def fail_commits_covered(self, index: int) -> int:
        """Fail every command waiting for the commit of an entry at or below `index` (a snapshot
        up to `index` was just loaded) with UNKNOWN_OUTCOME; return how many.

        pysyncobj answers a command only when it applies the command's index one entry at a
        time: a leader cut off with entries in flight that, after stepping down, is caught up by
        a snapshot skips those indexes, and their callbacks waited for the committer's 10 s sweep
        (found by the simulator: seed 367). Whether the entry at such an index is the command's
        is unknown here, so the client retries, deduplicated."""
        waiting = self._SyncObj__commandsWaitingCommit
        callbacks = [cb for i in sorted(waiting) if i <= index for _term, cb in waiting.pop(i)]
        for callback in callbacks:
            callback(None, FAIL_REASON.UNKNOWN_OUTCOME)
        return len(callbacks)

    def guard_forwards(self) -> None:
        """Fail a forwarded command that nothing will answer, as a leader change fails it.

        pysyncobj sends a follower's command to the leader it knows, ignores the send's result
        and fails the waiting ones only on a leader change: a command forwarded while the link
        to the leader was down (a follower just resumed from a pause redials it) or waiting when
        the link dropped waited for the committer's 10 s sweep. Both fail at once now with
        LEADER_CHANGED: outcome unknown (a send that failed after writing may have arrived), so
        the client retries, deduplicated."""
        transport = self.raft_transport
        send = transport.send

        def send_or_fail(node: Any, message: Any) -> bool:
            sent = bool(send(node, message))
            if not sent and isinstance(message, dict) and message.get("type") == "apply_command":
                callback = self.waiting_forwards().pop(message.get("request_id", -1), None)
                if callback is not None:
                    callback(None, FAIL_REASON.LEADER_CHANGED)
            return sent

        def disconnected(node: Any) -> None:
            self._SyncObj__onNodeDisconnected(node)
            if node == self.raft_leader and self.waiting_forwards():
                self.leader_changed()  # fails every command waiting on the leader

        transport.send = send_or_fail
        transport.setOnNodeDisconnectedCallback(disconnected)

    def generate_raft_timeout(self) -> Any:
        """A random election timeout, as pysyncobj draws them."""
        return self._SyncObj__generateRaftTimeout()

    def set_current_term(self, term: int, voted_for: Any) -> None:
        """Move to `term` (persisted with the vote)."""
        self._SyncObj__setCurrentTerm(term, voted_for)

    def set_state(self, state: int) -> None:
        """Switch role (pysyncobj's `_RAFT_STATE`), with its callbacks."""
        self._SyncObj__setState(state)

    def connected_to_anyone(self) -> bool:
        """Whether this node is connected to at least one other member."""
        return bool(self._SyncObj__connectedToAnyone())

    def do_change_cluster(self, request: list[Any]) -> Any:
        """pysyncobj's switch of its peers for a parsed change request."""
        return self._SyncObj__doChangeCluster(request)

    def send_next_node_idx(self, node: Any, **kwargs: Any) -> None:
        """A follower's answer to an AppendEntries (through `send_ack`)."""
        self._SyncObj__sendNextNodeIdx(node, **kwargs)

    # --- overridden steps: pysyncobj calls these; the hooks default to its own step -------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        self.on_peer_message(node, message)

    def on_peer_message(self, node: Any, message: Any) -> None:
        """A message from a peer."""
        self.syncobj_on_message(node, message)

    def syncobj_on_message(self, node: Any, message: Any) -> None:
        """pysyncobj's handling of a peer message."""
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:
        return self.apply_command(command)

    def apply_command(self, command: bytes) -> Any:
        """Apply one committed log entry."""
        return self.syncobj_apply_command(command)

    def syncobj_apply_command(self, command: bytes) -> Any:
        """pysyncobj's apply of a log entry (its replicated method, or a membership change)."""
        return SyncObj._SyncObj__doApplyCommand(self, command)

    def _SyncObj__applyLogEntries(self) -> bool:
        return self.apply_log_entries()

    def apply_log_entries(self) -> bool:
        """Apply the committed entries not applied yet."""
        return bool(self.syncobj_apply_log_entries())

    def syncobj_apply_log_entries(self) -> Any:
        """pysyncobj's apply loop (returns whether it applied anything)."""
        return SyncObj._SyncObj__applyLogEntries(self)

    def _SyncObj__sendNextNodeIdx(self, *args: Any, **kwargs: Any) -> None:
        self.send_ack(args, kwargs)

    def send_ack(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Send a follower's answer to an AppendEntries."""
        self.syncobj_send_ack(args, kwargs)

    def syncobj_send_ack(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """pysyncobj's send of a follower's answer."""
        SyncObj._SyncObj__sendNextNodeIdx(self, *args, **kwargs)

    def _SyncObj__getEntries(
        self, start: int, count: int | None = None, size_max: int | None = None
    ) -> Any:
        if size_max is not None:  # only the send of AppendEntries asks by size
            return self.entries_to_send(start, size_max)
        return SyncObj._SyncObj__getEntries(self, start, count)

    def entries_to_send(self, start: int, batch_bytes: int) -> Any:
        """The entries from `start` one AppendEntries carries: pysyncobj's, every entry to the
        log's end read and then cut after the one that reaches `batch_bytes`."""
        return SyncObj._SyncObj__getEntries(self, start, None, batch_bytes)

    def _SyncObj__sendAppendEntries(self) -> None:
        self.send_append_entries()

    def send_append_entries(self) -> None:
        """The leader sends AppendEntries to its followers."""
        self.syncobj_send_append_entries()

    def nodes_needing_snapshot(self) -> list[Any]:
        """The followers a leader's next send round would send snapshot chunks (their next
        index is at or below the log's first entry); none if this node does not lead."""
        if not self._isLeader():
            return []
        first = int(self._SyncObj__raftLog[0][1])
        next_index: dict[Any, int] = self._SyncObj__raftNextIndex
        return [node for node, index in next_index.items() if index <= first]

    def syncobj_send_append_entries(self, skip: frozenset[Any] = frozenset()) -> None:
        """pysyncobj's send of AppendEntries (new entries, commit index, snapshot chunks), to
        every other member but those in `skip` (hidden from its loop for this one call)."""
        others: set[Any] = self.other_nodes
        if not skip & others:
            SyncObj._SyncObj__sendAppendEntries(self)
            return
        self._SyncObj__otherNodes = others - skip
        try:
            SyncObj._SyncObj__sendAppendEntries(self)
        finally:
            self._SyncObj__otherNodes = others

    def _SyncObj__parseChangeClusterRequest(self, command: bytes) -> list[Any] | None:
        return self.parse_change_request(command)

    def parse_change_request(self, command: bytes) -> list[Any] | None:
        """[op, address, node, ...] of a membership entry, or None for any other entry."""
        result: list[Any] | None = SyncObj._SyncObj__parseChangeClusterRequest(self, command)
        return result

    def _SyncObj__changeCluster(self, request: list[Any]) -> bool:
        return self.change_cluster(request)

    def change_cluster(self, request: list[Any]) -> bool:
        """The leader, before it appends a change: whether to accept it."""
        return bool(SyncObj._SyncObj__changeCluster(self, request))

    # --- other classes' privates ---------------------------------------------------------------

    def replace_pipe_notifier(
        self, notify: Callable[[], None], unsubscribe: Callable[[int], None]
    ) -> None:
        """Close pysyncobj's pipe notifier (its fds unsubscribed); `notify` takes its place."""
        pipe = getattr(self, "_SyncObj__pipeNotifier", None)
        if pipe is not None:
            for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
                fd = getattr(pipe, name, None)
                if isinstance(fd, int):
                    unsubscribe(fd)
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self._SyncObj__pipeNotifier = _NoPipe(notify)

    def commands_queued(self) -> bool:
        """Whether pysyncobj's queue of submitted commands holds any (read without its lock:
        a command put meanwhile is taken by the tick its submitter requests)."""
        return bool(self._SyncObj__commandsQueue._FastQueue__queue)

    @property
    def serializer(self) -> Any:
        """pysyncobj's Serializer (snapshot hooks, transfers)."""
        return self._SyncObj__serializer

    def serializer_busy(self) -> bool:
        """Whether pysyncobj's serializer is taking a snapshot (its child pid set)."""
        return bool(self._SyncObj__serializer._Serializer__pid != 0)

    def serializer_transmissions(self) -> dict[Any, Any]:
        """The serializer's transfers in progress: id -> {"file", "transmitted"}."""
        transmissions: dict[Any, Any] = self._SyncObj__serializer._Serializer__transmissions
        return transmissions

    def transmission_batch_size(self) -> int:
        """Bytes per snapshot chunk."""
        return int(self._SyncObj__serializer._Serializer__transmissionBatchSize)
