"""What `raft.node.RaftNode` reports: its role, its status map, and whether what it applied is
current (issue 24, the rule in raft/contact.py: its deliveries go out only then)."""

from __future__ import annotations

import time
from typing import Any

from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.syncobj import _RAFT_STATE

from raft.contact import follower_current, majority_steady
from raft.node_base import NodeBase

ROLES = {0: "follower", 1: "candidate", 2: "leader"}
# the status digest encodes the whole state on the loop (about 1.8 us per message held: 200k
# messages stalled a node 0.36 s, and a stall past the election timeout makes the followers
# elect another leader); above this many messages it is computed only when asked for
DIGEST_MESSAGES_MAX = 50_000


class NodeStatus(NodeBase):
    """RaftNode's read-only views (module doc)."""

    def applied_state_current(self) -> bool:
        """Whether what this node applied is current, so its deliveries may go out (issue 24,
        the rule in raft/contact.py): leading with a majority heard steadily, or following a
        connected leader heard steadily, its state applied through what that leader said was
        committed."""
        if self.stopped_reason is not None or self._destroyed:
            return False
        now = monotonic_time()
        if self.raft_state == _RAFT_STATE.LEADER:
            others = self.other_nodes
            peers = [peer for node in others if (peer := self.node_id_of(node)) is not None]
            return majority_steady(self._follower_contacts, peers, now, self._elected_at)
        leader = self.leader_id()
        connected = leader is not None and self.peer_connected(leader)
        leader_commit = self.leader_commit_index
        commit = None if leader_commit is None else int(leader_commit)
        return follower_current(
            self._leader_contact, leader, connected, now, self.applied_index(), commit
        )

    def applied_index(self) -> int:
        """The last log index applied to the machine (or to the membership)."""
        return max(self._applied_through, int(self.raftLastApplied))

    def role(self) -> str:
        """leader | follower | candidate | stopped (stopped applying)."""
        if self.stopped_reason is not None:
            return "stopped"
        # the state alone, not pysyncobj's whole status map (the node's timers ask every 200 ms)
        return ROLES.get(int(self.raft_state), "follower")

    def bound(self) -> bool:
        """Whether the raft port is bound (pysyncobj retries a failed bind forever)."""
        return bool(self.raft_transport.ready)

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
