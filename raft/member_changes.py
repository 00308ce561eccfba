"""Membership changes on `raft.node.RaftNode` (pysyncobj's dynamic membership, raft.membership).

The leader checks a change before it appends it (`change_cluster`: one at a time, a quorum left,
no duplicate); every node switches its peers when the entry reaches its log (pysyncobj), and
when it applies the entry (`apply_command`) switches the replicated member set, persists it
(`<data dir>/members`, fsynced) and hands the outcome over like any entry's. Our entry payload
is CBOR (raft.membership), never a pickle (`parse_change_request`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE, FAIL_REASON

from raft import membership
from raft.membership import MemberChange, MembershipError, Refusal
from raft.metadata import member_change_refusal
from raft.node_base import NodeBase

log = structlog.get_logger("raft")

MEMBERSHIP_PREFIX = bytes([_COMMAND_TYPE.MEMBERSHIP])  # pysyncobj's entry type byte
MembershipCallback = Callable[[Any, "Refusal | None"], None]  # (reply, None) | (None, refusal)

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


class MemberChanges(NodeBase):
    """RaftNode's membership steps (module doc)."""

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

    def parse_change_request(self, command: bytes) -> list[Any] | None:
        """Our payload is CBOR (raft.membership), never a pickle; pysyncobj reads
        [op, node id, node] and we carry the decoded change as a fourth item."""
        if not command or command[0] != _COMMAND_TYPE.MEMBERSHIP:
            return None
        try:
            change = membership.decode_change(bytes(command[1:]))
        except MembershipError as err:
            # not None: pysyncobj would append it as an ordinary entry; an unknown op is
            # refused by the leader (`change_cluster`) and a no-op anywhere else
            log.error("membership_entry_malformed", error=str(err))
            return ["invalid", _INVALID_NODE.id, _INVALID_NODE, None]
        self._address_to_id.setdefault(change.raft, change.node)
        node = self._tcp_node(change.node, change.raft)
        return ["add" if change.op == "add" else "rem", change.raft, node, change]

    def change_cluster(self, request: list[Any]) -> bool:
        """The leader, before it appends a change: our checks replace pysyncobj's (whose "one
        change in flight" test never fires: it never records the change's index)."""
        change = request[3] if len(request) > 3 else None
        if not isinstance(change, MemberChange):
            log.warning("membership_change_refused", reason="malformed change")
            return False
        refusal = self._refusal(change)
        if refusal is not None:
            self._refusals[(change.op, change.node)] = refusal
            log.warning("membership_change_refused", reason=refusal.message)
            return False
        accepted = bool(self.do_change_cluster(request))
        if accepted:
            # pysyncobj appends it right after this returns, at the next index
            self._change_appended_at = int(self.current_log_index()) + 1
            log.info("membership_change_appended", op=change.op, node=change.node)
        return accepted

    def _refusal(self, change: MemberChange) -> Refusal | None:
        """Why the leader must not append `change` now (inside a tick), or None."""
        applied = int(self.raftLastApplied)
        if applied < int(self.noop_index or 0):
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
        last = int(self.current_log_index())
        if last <= applied:
            return None
        for entry in self.get_entries(applied + 1, last - applied):
            if entry[0][:1] == MEMBERSHIP_PREFIX:
                return int(entry[1])
        return None

    def _quorum_left(self, change: MemberChange) -> Refusal | None:
        """Refuse a change after which the members that answer now would not be a majority
        (as etcd's strict reconfiguration check: replace a dead member by removing it first)."""
        connected = self.connected_nodes
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

    def apply_command(self, command: bytes) -> Any:
        """Apply a committed entry: a membership change switches the replicated member set
        too (not once this node stopped applying); any other entry is pysyncobj's."""
        if command[:1] != MEMBERSHIP_PREFIX or self.stopped_reason is not None:
            return self.syncobj_apply_command(command)
        request = self.parse_change_request(command)
        reply = None
        if request is not None:
            reply = self._apply_member_change(request[3])
        self.syncobj_apply_command(command)  # pysyncobj's peers (a no-op if done)
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
