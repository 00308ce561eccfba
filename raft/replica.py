"""The seam between replication and the node: everything `cluster/node` uses of `raft/`.

A `Replica` owns the pysyncobj node, the group committer and the apply lock; the node gets:
- `propose(command, on_reply)`: replicate one fifo command; its reply (a fifo Reply, an
  `InternalFailure` or a `SubmitError`) comes to `on_reply` on the loop thread once this node
  applied it (a callback, not a Future: one Future per publish is a measurable cost);
  `propose_upgrade` / `propose_hello` do the same for the two metadata entries;
- `on_applied(Applied)`: on the loop thread, in log order, after the replies of the same entry,
  the effects of every applied entry that concern this node (`on_reset(index)` instead when the
  state jumped to a snapshot: whatever was promised to clients no longer holds);
- `read(function)`: runs `function(ReplicaView)` against the current state and returns its
  result; the view is read-only and valid only during the call (callers never take a lock).

Ordering obligations (see raft/node.py for the journal's): a reply never reaches `on_reply`
before its entry is durable on this node; the effects of an entry are handed over after its
replies; `on_reset` comes in order with `on_applied`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fifo.commands import Command, ConnectionId
from fifo.effects import Effect
from fifo.state import State
from raft.batcher import GroupCommitter, Reply, Sink
from raft.entry import Entry, Origin
from raft.errors import StorageError, SubmitError
from raft.fastcodec import encode_command
from raft.membership import MemberChange, Refusal
from raft.node import DIGEST_MESSAGES_MAX, RaftNode, RaftSettings
from raft.replicated import Metadata, Outcome, ReplicatedState

T = TypeVar("T")

__all__ = ["Applied", "Replica", "ReplicaView", "Reply", "Sink"]


@dataclass(frozen=True, slots=True)
class Applied:
    """What one applied entry means for this node: its effects for this node's connections."""

    index: int
    effects: list[Effect]


class ReplicaView:
    """Read-only access to the replicated state, valid only inside `Replica.read`."""

    __slots__ = ("_replicated",)

    def __init__(self, replicated: ReplicatedState) -> None:
        self._replicated = replicated

    @property
    def state(self) -> State:
        """The fifo state (read it with fifo's query functions; never change it)."""
        return self._replicated.state

    @property
    def meta(self) -> Metadata:
        """The cluster metadata (members, versions, connections by node, down nodes)."""
        return self._replicated.meta

    def connections_of(self, node: str) -> list[tuple[int, int]]:
        """The (incarnation, number) of every connection of `node` the state lists."""
        return list(self._replicated.meta.connections.get(node, {}))

    def lists_connection(self, connection: ConnectionId) -> bool:
        """Whether the state lists `connection` (so a ConnectionDown for it means something)."""
        conns = self._replicated.meta.connections.get(connection.node)
        return conns is not None and (connection.incarnation, connection.number) in conns

    def upgrade_target(self) -> int | None:
        """The version every member supports, if above the effective one."""
        return self._replicated.upgrade_target()

    def upgrade_refusal(self, version: int) -> str | None:
        """Why an upgrade to `version` must be refused now, or None."""
        return self._replicated.upgrade_refusal(version)


class Replica:
    """One node's replica of the log: propose, applied outcomes, read-only views."""

    def __init__(
        self,
        settings: RaftSettings,
        loop: asyncio.AbstractEventLoop,
        on_applied: Callable[[Applied], None],
        on_reset: Callable[[int], None],
        observe: Callable[[Outcome, bool], None] | None = None,
    ) -> None:
        self.settings = settings
        self._loop = loop
        self._on_applied = on_applied
        self._on_reset = on_reset
        self._observe = observe
        self._node = RaftNode(settings, self._outcome_tick, self._snapshot_tick, loop)
        self._committer = GroupCommitter(self._node, loop)

    # --- proposing (loop thread) ---------------------------------------------------------------

    def propose(self, command: Command, on_reply: Sink, blob: bytes | None = None) -> None:
        """Replicate `command` (`blob`: its encoding, if the caller has it already)."""
        encoded = blob if blob is not None else bytes(encode_command(command))
        self._committer.submit(encoded, on_reply, command)

    def propose_upgrade(self, version: int, on_reply: Sink) -> None:
        """Replicate a switch of the effective machine version to `version`."""
        now = self._node.now_ms()

        def make(origin: Origin) -> Entry:
            return Entry("upgrade", now, origin, version=version)

        self._committer.submit_entry(make, on_reply)

    def propose_hello(self, on_reply: Sink) -> None:
        """Record this node incarnation and the highest machine version its code supports."""
        now, settings = self._node.now_ms(), self.settings

        def make(origin: Origin) -> Entry:
            return Entry(
                "hello",
                now,
                origin,
                node=settings.node_id,
                version=settings.supported_version,
                incarnation=settings.incarnation,
            )

        self._committer.submit_entry(make, on_reply)

    def change_membership(
        self, change: MemberChange, on_done: Callable[[Any, Refusal | None], None]
    ) -> None:
        """Append a membership change (this node should lead); `on_done(reply, None)` on the
        loop thread once this node applied it, or `on_done(None, why)` if it was refused or
        lost. No timeout here: the caller bounds its wait."""

        def done(reply: Any, refusal: Refusal | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
                self._loop.call_soon_threadsafe(on_done, reply, refusal)

        self._node.change_membership(change, done)

    def peers(self) -> list[str]:
        """The other members of the applied member set (cluster.toml's peers until a change)."""
        return [row["id"] for row in self._node.members() if row["id"] != self.settings.node_id]

    def members(self) -> list[dict[str, Any]]:
        """The applied member set (id, raft, client; addresses None before any change)."""
        return self._node.members()

    def transfer_leadership(self) -> None:
        """Ask the leader (this node) to hand leadership to the most caught-up peer."""
        self._node.request_leadership_transfer()

    def sweep(self) -> None:
        """Fail proposals that got no commit within their timeout (call periodically)."""
        self._committer.sweep()

    def fail_pending(self, reason: SubmitError) -> None:
        """Fail every pending proposal with `reason` (shutting down)."""
        self._committer.fail_all(reason)

    def destroy(self) -> None:
        """Flush the journal and stop replication (after `fail_pending`)."""
        self._node.sync_journal()
        self._node.destroy_synchronous()

    # --- reading ---------------------------------------------------------------------------

    def read(self, function: Callable[[ReplicaView], T]) -> T:
        """`function(view)` against the current state, with no entry applied meanwhile."""
        with self._node.lock:
            return function(ReplicaView(self._node.replicated_state))

    def status(self, with_digest: bool = True, bounded: bool = True) -> dict[str, Any]:
        """This node's status map (role, term, indexes, versions, digest, leader, ...); the
        digest is left out above `raft.node.DIGEST_MESSAGES_MAX` messages unless not `bounded`."""
        return self._node.status(with_digest, DIGEST_MESSAGES_MAX if bounded else None)

    def has_quorum(self) -> bool:
        """Whether this node is connected to a majority of the cluster (the status map's
        `has_quorum`, without building the map)."""
        return bool(self._node.hasQuorum)

    @property
    def stopped_reason(self) -> str | None:
        """Why this node stopped applying (older code than the log needs), or None."""
        return self._node.stopped_reason

    def role(self) -> str:
        """leader | follower | candidate | stopped."""
        return self._node.role()

    def applied_state_current(self) -> bool:
        """Whether this node's applied state is current: deliveries may go out (raft.contact)."""
        return self._node.applied_state_current()

    def leader_id(self) -> str | None:
        """The current leader as this node sees it."""
        return self._node.leader_id()

    def peer_connected(self, node_id: str) -> bool:
        """Whether this node has a live raft connection to `node_id`."""
        return self._node.peer_connected(node_id)

    def storage_damage(self) -> StorageError | None:
        """Damage found in the journal while running (replication stopped on it), or None."""
        return self._node.storage_damage()

    def bound(self) -> bool:
        """Whether the raft port is bound."""
        return self._node.bound()

    def now_ms(self) -> int:
        """The submitter clock stamped into entries."""
        return self._node.now_ms()

    def force_snapshot(self) -> None:
        """Ask for a snapshot (log compaction) now."""
        self._node.forceLogCompaction()

    def observe_io(
        self, fsync: Callable[[float], None] | None, apply: Callable[[float], None] | None
    ) -> None:
        """Observers of the seconds spent per journal fsync and per entry applied (metrics)."""
        self._node.observe_fsync = fsync
        self._node.observe_apply = apply

    # --- from pysyncobj's tick (on the loop) --------------------------------------------------

    def _outcome_tick(self, outcome: Outcome) -> None:
        """An applied entry (inside the tick, on the loop, after the entry is durable here):
        hand what concerns this node incarnation over at once, in log order."""
        origin = outcome.origin
        settings = self.settings
        mine = origin is not None and origin[:2] == (settings.node_id, settings.incarnation)
        if self._observe is not None:
            self._observe(outcome, mine)
        effects = [
            e
            for e in outcome.effects
            if getattr(getattr(e, "connection", None), "node", None) == settings.node_id
        ]
        if mine or effects:
            self._deliver(outcome, effects)

    def _deliver(self, outcome: Outcome, effects: list[Effect]) -> None:
        self._committer.resolve(outcome)  # replies first, then the effects of the same entry
        self._on_applied(Applied(outcome.index, effects))

    def _snapshot_tick(self, index: int) -> None:
        """Inside the tick: the state jumped to a snapshot; tell the node, in order."""
        self._on_reset(index)
