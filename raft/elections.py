"""Who may lead: the leadership guard, pre-vote, the disk probe and the next Raft timer.

pysyncobj has no pre-vote hook: `_pre_vote_gate` owns its election deadline (kept parked far
away until a majority said it would vote for this node, raft.prevote), and `_guard_leadership`
pushes it away for a node that must not stand (stopped applying, not in the member set it
applied); `_probe_disk` does the same while the disk is full, and hands leadership over.
"""

from __future__ import annotations

from typing import Any

import structlog
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.syncobj import _RAFT_STATE

from raft.durability import DurableFileJournal
from raft.node_base import NodeBase
from raft.prevote import PRE_VOTE, PRE_VOTE_RESPONSE
from raft.settings import int_field

log = structlog.get_logger("raft")

# where pysyncobj's own election deadline is parked while pre-vote (raft.prevote) owns it
PRE_VOTE_PARK_S = 3600.0


class Elections(NodeBase):
    """RaftNode's election steps (module doc)."""

    def _next_timer_due(self) -> float | None:
        """Seconds until pysyncobj's next heartbeat (leader with peers) or election / pre-vote
        deadline (follower, candidate) falls due; None when neither applies."""
        if self.raft_state == _RAFT_STATE.LEADER:
            if not self.other_nodes:
                return None
            due = self.next_append_entries_time
        else:
            due = min(self._pre_vote.deadline, self.election_deadline)
        return float(due) - float(monotonic_time())

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
            self.election_deadline = monotonic_time() + 3600
            return
        self.election_deadline = monotonic_time() + 3600
        if self._isLeader():
            self.transferLeadership()

    def _pre_vote_gate(self) -> None:
        """End of every tick: own the election deadline. pysyncobj stands when its deadline
        has passed; it is kept parked far away, and whatever pysyncobj set it to meanwhile (a
        leader heard from, a vote given, an election started, the guard) becomes the time of
        the next pre-vote round. A round won sets it to 0: pysyncobj stands at the next tick."""
        pre_vote = self._pre_vote
        if self.raft_state == _RAFT_STATE.LEADER or self.self_node is None:
            pre_vote.end_round()
            pre_vote.parked = None
            return
        deadline = self.election_deadline
        if deadline != pre_vote.parked:
            pre_vote.deadline = deadline
            pre_vote.end_round()
        if self.transfer_in_progress:
            return  # the leader asked this node to take over (timeout_now): no round
        now = monotonic_time()
        started = now >= pre_vote.deadline and self.connected_to_anyone()
        if started and self._start_pre_vote_round(now):
            return
        pre_vote.parked = now + PRE_VOTE_PARK_S
        self.election_deadline = pre_vote.parked

    def _start_pre_vote_round(self, now: float) -> bool:
        """Ask the others for their pre-votes; True if this node stands at once (alone)."""
        self_node = self.self_node
        term = self.current_term + 1
        if self.raft_leader is not None:
            # as a candidate would (etcd's pre-candidate too): no leader to count on, so
            # forwarded commands fail over and stale reads are refused meanwhile
            self.raft_leader = None
            self.leader_changed()
        self._pre_vote.start_round(term, self_node, now, self.generate_raft_timeout())
        if self._pre_vote.count(term, self_node, len(self.other_nodes) + 1):
            self._stand_now()  # no other voter
            return True
        request = {
            "type": PRE_VOTE,
            "term": term,
            "last_log_index": self.current_log_index(),
            "last_log_term": self.current_log_term(),
        }
        for node in self.other_nodes:
            self.raft_transport.send(node, request)
        return False

    def _on_role_changed(self, old: int, new: int) -> None:
        if new == _RAFT_STATE.LEADER:
            self._elected_at = monotonic_time()
        elif old == _RAFT_STATE.LEADER:
            # pysyncobj leaves the election deadline as it was when it stops leading (its
            # leader fallback, a higher term): here the value the pre-vote gate parked an hour
            # ahead, which the gate would then take as the next round's time (campaign seeds
            # 6167, 6451: no leader for ever). A fresh timeout, as a follower that heard nothing
            self.election_deadline = monotonic_time() + self.generate_raft_timeout()
        silent = monotonic_time() - self._pre_vote.last_leader_contact
        self.roles.changed(old, new, self.current_term, silent)

    def _stand_now(self) -> None:
        """A pre-vote round was won: pysyncobj starts the election at its next tick."""
        log.info("pre_vote_won", term=self.current_term + 1)
        self.election_deadline = 0
        self._pre_vote.parked = None
        self._ticker.request()

    def _answer_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        """Would this node vote for the sender in the term it proposes? Nothing changes here."""
        try:
            proposed = int_field(message["term"])
            last_log = (int_field(message["last_log_term"]), int_field(message["last_log_index"]))
        except (KeyError, TypeError):
            log.warning("pre_vote_malformed", peer=self.node_id_of(node.id))
            return
        granted = self._pre_vote.grants(
            monotonic_time(),
            leading=self.raft_state == _RAFT_STATE.LEADER,
            current_term=self.current_term,
            last_log=(self.current_log_term(), self.current_log_index()),
            proposed_term=proposed,
            candidate_last_log=last_log,
        )
        self.raft_transport.send(
            node,
            {
                "type": PRE_VOTE_RESPONSE,
                "term": proposed,
                "current_term": self.current_term,
                "granted": granted,
            },
        )

    def _count_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        """A peer's answer to this node's round: stand on a majority of yes; a no from a later
        term moves this node to that term (as any message of a later term does in Raft)."""
        if self.raft_state == _RAFT_STATE.LEADER:
            return
        term, current = message.get("term"), message.get("current_term")
        if message.get("granted") is True and type(term) is int:
            others = self.other_nodes
            if node in others and self._pre_vote.count(term, node, len(others) + 1):
                self._stand_now()
        elif type(current) is int and current > self.current_term:
            self._pre_vote.end_round()
            self.set_current_term(current, None)
            self.set_state(_RAFT_STATE.FOLLOWER)

    def _probe_disk(self) -> None:
        """While the disk is full: probe for space once a second; a leader hands leadership to
        a peer that can still write, and this node stands for no election until space
        returns."""
        journal = self._journal()
        if not isinstance(journal, DurableFileJournal) or not journal.disk_full:
            return
        if journal.probe_space():
            return
        self.election_deadline = monotonic_time() + 3600
        if self._isLeader() and monotonic_time() >= getattr(self, "_disk_transfer_at", 0.0):
            self._disk_transfer_at = monotonic_time() + 1.0
            log.warning("leadership_transfer_disk_full")
            self.transferLeadership()
