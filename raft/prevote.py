"""Pre-vote (Raft thesis 9.6): a node stands for election only if a majority would vote for it.

pysyncobj has none. A node whose election timer fires starts a new term at once and asks for
votes; every peer that sees the higher term adopts it, and a leader that sees it steps down.
So a follower cut off from the leader alone (one link down) deposes a healthy leader again and
again, and a node back from a partition bumps everybody's term the moment it reconnects: an
election each time, commands held meanwhile (measured before this module: a follower
isolated for 5 s came back at term 7 and forced an election; one link cut between a follower
and the leader for 5 s went through 7 elections).

With pre-vote the timer starts a round instead: the node asks its peers whether they would
vote for it in the next term, without changing any term. A peer says yes only if the
candidate's log is at least as up to date as its own, the proposed term is above its own, and
it has not heard from a leader within the minimum election timeout (leader stickiness: a
leader says no while it leads). Only with yes from a majority (itself included) does the node
start the real election. A leadership transfer (`timeout_now` from the leader) skips the round.

`PreVote` holds the state and the decisions; `raft.node.RaftNode` drives it from pysyncobj's
tick (it keeps pysyncobj's own election deadline parked far away and hands it back, expired,
when a round is won) and carries the `pre_vote` / `pre_vote_response` messages. Nodes of a
quorumq before pre-vote ignore these messages: in a cluster mixing them, the older nodes stand
as before and the newer ones vote for them as before.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

PRE_VOTE = "pre_vote"
PRE_VOTE_RESPONSE = "pre_vote_response"


@dataclass
class PreVote:
    """One node's pre-vote state (the node's loop thread only)."""

    min_timeout_s: float
    deadline: float = 0.0  # when the next round starts (pysyncobj's election deadline, taken over)
    parked: float | None = None  # the value this parked pysyncobj's deadline at
    round_term: int = 0  # the term the current round proposes (0: no round)
    votes: set[Hashable] = field(default_factory=set)
    last_leader_contact: float = float("-inf")

    def heard_from_leader(self, now: float) -> None:
        """An AppendEntries of the current leader arrived."""
        self.last_leader_contact = now

    def grants(
        self,
        now: float,
        *,
        leading: bool,
        current_term: int,
        last_log: tuple[int, int],
        proposed_term: int,
        candidate_last_log: tuple[int, int],
    ) -> bool:
        """Whether this node would vote for a candidate proposing `proposed_term` whose log
        ends at `candidate_last_log` ((term, index)); nothing here changes."""
        if leading or now - self.last_leader_contact < self.min_timeout_s:
            return False
        return proposed_term > current_term and candidate_last_log >= last_log

    def start_round(self, term: int, me: Hashable, now: float, retry_after_s: float) -> None:
        """A round proposing `term` (the node's term + 1); the next one after `retry_after_s`
        if this one is not won."""
        self.round_term = term
        self.votes = {me}
        self.deadline = now + retry_after_s

    def count(self, term: int, voter: Hashable, voters: int) -> bool:
        """A yes from `voter` for the round proposing `term`; True when it makes a majority of
        `voters` (the node included), once per round."""
        if term != self.round_term or self.round_term == 0:
            return False
        self.votes.add(voter)
        if len(self.votes) * 2 > voters:
            self.round_term = 0
            self.votes = set()
            return True
        return False

    def end_round(self) -> None:
        """Drop the round in progress (the node leads, or follows a leader again)."""
        self.round_term = 0
        self.votes = set()
