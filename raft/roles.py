"""Role changes of one node, each logged with its cause and counted (issue 34).

pysyncobj calls `onStateChanged(old, new)` and says nothing of why. The cause is read from what
the node knows at that moment: the term it had at its previous change, how long ago it last
heard from a leader, the leader fallback timeout. Every change is one `role_changed` line
(warning when a leader is lost, info otherwise) and one count, `(from, to)`, that the node's
status map carries and /metrics exposes (`quorumq_raft_role_changes_total`).

Causes, by change:
- follower -> candidate: its election timer fired (no leader heard from for N ms), or a
  leadership transfer asked it to stand (heard from the leader within the minimum timeout);
- candidate -> leader: it won the election of its term;
- leader -> follower: it saw a higher term (another node stood), or no majority answered within
  the leader fallback timeout;
- candidate -> follower: it saw a higher term, or another node won the election of its term.
"""

from __future__ import annotations

import threading
from collections import Counter

import structlog

log = structlog.get_logger("raft")

ROLE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}


class RoleChanges:
    """The role-change log and counts of one node (changes on the raft loop, counts read from
    any thread)."""

    def __init__(self, node_id: str, min_election_timeout_s: float, fallback_s: float) -> None:
        self.node_id = node_id
        self.min_election_timeout_s = min_election_timeout_s
        self.fallback_s = fallback_s
        self._term_at_last_change = 0
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def changed(self, old: int, new: int, term: int, leader_silent_s: float) -> str:
        """pysyncobj's state went from `old` to `new` at `term` (the current term; a follower
        turning candidate has not incremented it yet); `leader_silent_s`: since the last
        AppendEntries of a leader (inf: never). Logs and counts it; returns the cause."""
        before, after = ROLE_NAMES.get(old, str(old)), ROLE_NAMES.get(new, str(new))
        if after == "candidate":
            term += 1  # the term it stands in
        cause = self._cause(before, after, term, leader_silent_s)
        self._term_at_last_change = term
        with self._lock:
            self._counts[f"{before}->{after}"] += 1
        level = log.warning if before == "leader" else log.info
        level("role_changed", node=self.node_id, old=before, new=after, term=term, cause=cause)
        return cause

    def counts(self) -> dict[str, int]:
        """Changes so far by `from->to` (a copy)."""
        with self._lock:
            return dict(self._counts)

    def _cause(self, before: str, after: str, term: int, leader_silent_s: float) -> str:
        higher = term > self._term_at_last_change
        if after == "candidate":
            if leader_silent_s < self.min_election_timeout_s:
                return "leadership transfer: the leader asked this node to stand"
            if leader_silent_s == float("inf"):
                return "election timeout: no leader heard from since this node started"
            return f"election timeout: no leader heard from for {leader_silent_s * 1000:.0f} ms"
        if after == "leader":
            return f"won the election of term {term}"
        if higher:
            return f"saw term {term}, above its own {self._term_at_last_change}: another node stood"
        if before == "leader":
            return (
                f"no majority answered within the leader fallback timeout "
                f"({self.fallback_s * 1000:.0f} ms)"
            )
        return f"another node won the election of term {term}"
