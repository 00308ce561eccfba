"""The state every part of `raft.node.RaftNode` shares, and the helpers they all use.

RaftNode is assembled from parts, each a class over `NodeBase` in its own module:
`raft.appends` (AppendEntries on both sides: acks after the fsync, sends once per tick, the
log-matching and commit-index guards), `raft.elections` (the leadership guard, pre-vote, the
disk probe, the next timer), `raft.member_changes` (membership changes), `raft.snapshot_hooks`
(pysyncobj's serializer hooks: our CBOR snapshots, live entries, transfers) and `raft.node_status`
(status, role, whether the applied state is current). `NodeBase` declares the attributes
RaftNode's constructor sets, and holds the helpers more than one part needs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from raft import membership
from raft.contact import Contact
from raft.durability import DurableFileJournal
from raft.membership import MemberSet, Refusal
from raft.prevote import PreVote
from raft.replicated import Outcome, ReplicatedState
from raft.roles import RoleChanges
from raft.settings import DialedTCPNode, RaftSettings
from raft.snapshotter import SnapshotJob
from raft.syncobj_adapter import SyncObjAdapter
from raft.ticker import LoopTicker

log = structlog.get_logger("raft")

OutcomeListener = Callable[[Outcome], None]
SnapshotListener = Callable[[int], None]  # the index the state now stands at


class NodeBase(SyncObjAdapter):
    """The attributes RaftNode's constructor sets (declared for its parts) and shared helpers."""

    settings: RaftSettings
    lock: threading.RLock
    replicated_state: ReplicatedState
    loop: asyncio.AbstractEventLoop
    stopped_reason: str | None
    crash_traceback: str | None
    _destroyed: bool
    _ticker: LoopTicker
    _on_outcome: OutcomeListener
    _on_snapshot_loaded: SnapshotListener | None
    _address_to_id: dict[str, str]
    _peer_nodes: dict[str, Any]
    _member_set: MemberSet | None
    _refusals: dict[tuple[str, str], Refusal]
    _change_appended_at: int
    _transfer_requested: bool
    _snapshots: SnapshotJob
    _start_dump_pending: bool
    _pre_vote: PreVote
    roles: RoleChanges
    _leader_contact: Contact
    _follower_contacts: dict[str, Contact]
    _elected_at: float | None
    _applied_through: int
    _send_pending: bool
    _commit_send_at: float | None
    _transfer_holds: dict[Any, float]  # follower -> until when its snapshot transfer waits
    _deferred_acks: list[tuple[tuple[Any, ...], dict[str, Any]]]
    _event_quiet: bool | None
    observe_fsync: Callable[[float], None] | None
    observe_apply: Callable[[float], None] | None
    pinned_indexes: Callable[[], Iterable[int]]

    def _journal(self) -> Any:
        return self.raft_log

    def sync_journal(self) -> None:
        """fsync the journal if it has unsynced records (no-op under `never`, and once the
        node is destroyed: its journal is closed)."""
        journal = self._journal()
        if isinstance(journal, DurableFileJournal) and not self._destroyed:
            started = time.perf_counter()
            if journal.sync() and self.observe_fsync is not None:
                self.observe_fsync(time.perf_counter() - started)

    def _entry_term(self, index: int) -> int:
        entries = self.get_entries(index, 1)
        return int(entries[0][2]) if entries else 0

    def _tcp_node(self, node_id: str, address: str) -> DialedTCPNode:
        """The pysyncobj node of a member (dialed through `peer_dial` if it names one)."""
        return DialedTCPNode(address, self.settings.peer_dial.get(node_id, address))

    def node_id_of(self, address: Any) -> str | None:
        """The node id of a pysyncobj node or address."""
        if address is None:
            return None
        return self._address_to_id.get(getattr(address, "id", str(address)))

    def leader_id(self) -> str | None:
        """The node id of the current leader as this node sees it."""
        return self.node_id_of(self._getLeader())

    def peer_connected(self, node_id: str) -> bool:
        """Whether this node has a live raft connection to `node_id`."""
        node = self._peer_nodes.get(node_id)
        return node is not None and bool(self.isNodeConnected(node))

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
