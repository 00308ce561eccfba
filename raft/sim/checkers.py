"""Safety checkers, run at every step of a simulation and at its end.

Raft (over the real pysyncobj state of every running node):
- election safety: at most one leader per term;
- committed entries never change: the entry a node holds at an index at or below its commit
  index is the same (term, bytes) on every node, for ever (state-machine safety at the log);
- leader completeness: a leader of a term later than every term seen when an entry was first
  seen committed holds that entry;
- log matching: two logs holding an entry of the same index and term hold the same bytes;
- equal applied outcomes: every node that applies log index I gets the same replies and effects;
- at the end, after the schedule healed: every node at the same applied index, equal digests.
Queue (the chaos runner's total-queue checker, `cluster.chaos.checker`, over our history):
no confirmed message lost, none unexpected, none delivered again after its ack returned ok.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from raft.replicated import Outcome
from raft.sim.cluster import SimCluster, SimNode
from raft.sim.workload import Event

VIOLATIONS_MAX = 20  # keep the first few: one is enough to fail a seed
LEADER_RECHECK_COMMITS = 16  # leader completeness re-read after this many new commits


def _hash(blob: Any) -> str:
    return hashlib.sha256(bytes(blob)).hexdigest()[:16]


@dataclass
class RaftChecker:
    """Watches every running node's Raft state; `violations` says what broke, first first."""

    leaders: dict[int, str] = field(default_factory=dict)  # term -> leader node id
    committed: dict[int, tuple[int, str, int]] = field(
        default_factory=dict
    )  # idx -> term, hash, seen-at max term
    applied: dict[int, str] = field(default_factory=dict)  # idx -> hash of the outcome
    violations: list[str] = field(default_factory=list)
    _checked_commit: dict[str, int] = field(default_factory=dict)
    _checked_leader: set[tuple[str, int, int]] = field(default_factory=set)
    _orphans: set[tuple[str, int]] = field(default_factory=set)  # (node, index) reported

    def fail(self, message: str) -> None:
        """Record a violation (the first VIOLATIONS_MAX)."""
        if len(self.violations) < VIOLATIONS_MAX:
            self.violations.append(message)

    def on_outcome(self, node: SimNode, outcome: Outcome, reset: bool) -> None:
        """An entry applied on `node`: its outcome must equal every other node's."""
        if reset:
            return
        digest = hashlib.sha256(repr((outcome.replies, outcome.effects)).encode()).hexdigest()
        first = self.applied.setdefault(outcome.index, digest)
        if first != digest:
            self.fail(
                f"state-machine safety: {node.node_id} applied index {outcome.index} "
                f"with another outcome than the first node that applied it"
            )

    def step(self, cluster: SimCluster) -> None:
        """Check the invariants over every running node now."""
        nodes = cluster.up_nodes()
        max_term = max(
            (int(n.replica._node.raftCurrentTerm) for n in nodes if n.replica), default=0
        )
        for node in nodes:
            raft = node.replica._node if node.replica else None
            if raft is None:
                continue
            term = int(raft.raftCurrentTerm)
            if raft._isLeader():
                holder = self.leaders.setdefault(term, node.node_id)
                if holder != node.node_id:
                    self.fail(f"election safety: {holder} and {node.node_id} both led term {term}")
                # once when a leader is first seen in a term, then again every
                # LEADER_RECHECK_COMMITS newly committed entries (a whole-log read each time)
                key = (node.node_id, term, len(self.committed) // LEADER_RECHECK_COMMITS)
                if key not in self._checked_leader:
                    self._checked_leader.add(key)
                    self._check_leader_log(node, raft, term)
            self._check_commits(node, raft, max_term)
            self._check_waiting(node, raft)

    def _check_waiting(self, node: SimNode, raft: Any) -> None:
        """A command waiting for the commit of an index this node has applied (or loaded a
        snapshot over) is never answered: pysyncobj answers only as it applies that index."""
        waiting = raft.waiting_commit_indexes()
        applied = int(raft.last_applied)
        if waiting and waiting[0] <= applied and (node.node_id, waiting[0]) not in self._orphans:
            self._orphans.add((node.node_id, waiting[0]))
            self.fail(
                f"orphaned proposal: {node.node_id} waits for the commit of index {waiting[0]}, "
                f"at or below its applied index {applied}"
            )

    def _entries(self, raft: Any, after: int = 0) -> tuple[int, list[tuple[bytes, int, int]]]:
        """The first index of `raft`'s log and its entries above index `after`."""
        journal = raft._journal()
        if len(journal) == 0:
            return 1, []
        first = int(journal[0][1])
        start = max(0, after + 1 - first)
        return first, list(journal[start : len(journal)])

    def _check_commits(self, node: SimNode, raft: Any, max_term: int) -> None:
        commit = int(raft.raftCommitIndex)
        done = self._checked_commit.get(node.node_id, 0)
        if commit <= done:
            return
        _first, entries = self._entries(raft, done)
        for entry in entries:
            index = int(entry[1])
            if index <= done or index > commit:
                continue
            seen = (int(entry[2]), _hash(entry[0]))
            known = self.committed.setdefault(index, (*seen, max_term))
            if known[:2] != seen:
                self.fail(
                    f"committed entry changed: index {index} is term {known[0]} on an "
                    f"earlier node, term {seen[0]} on {node.node_id}"
                )
        self._checked_commit[node.node_id] = commit

    def _check_leader_log(self, node: SimNode, raft: Any, term: int) -> None:
        first, entries = self._entries(raft)
        by_index = {int(e[1]): (int(e[2]), e[0]) for e in entries}
        last = int(entries[-1][1]) if entries else first - 1
        for index, (entry_term, digest, seen_at) in self.committed.items():
            if seen_at >= term or index < first:
                continue
            held = by_index.get(index)
            if index > last or held is None or (held[0], _hash(held[1])) != (entry_term, digest):
                self.fail(
                    f"leader completeness: {node.node_id} leads term {term} without "
                    f"committed index {index} (term {entry_term})"
                )
                return

    def final(self, cluster: SimCluster) -> None:
        """Log matching over whole logs, then equal applied state everywhere."""
        logs = {}
        for node in cluster.up_nodes():
            assert node.replica is not None
            _first, entries = self._entries(node.replica._node)
            logs[node.node_id] = {int(e[1]): (int(e[2]), _hash(e[0])) for e in entries}
        ids = sorted(logs)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                for index in sorted(set(logs[a]) & set(logs[b])):
                    ta, ha = logs[a][index]
                    tb, hb = logs[b][index]
                    if ta == tb and ha != hb:
                        self.fail(f"log matching: {a} and {b} differ at index {index}")
                        break
        states = {}
        for node in cluster.up_nodes():
            assert node.replica is not None
            status = node.replica.status(with_digest=True, bounded=False)
            states[node.node_id] = (status["last_applied"], status["digest"])
        if len(set(states.values())) > 1:
            self.fail(f"replicas differ after healing: {states}")


@dataclass(frozen=True, slots=True)
class QueueVerdict:
    """The total-queue verdict (lists hold message values, sorted)."""

    confirmed: int
    consumed: int
    lost: list[str]
    unexpected: list[str]
    redelivered_after_ack: list[str]
    failed_but_consumed: list[str]
    duplicated: list[str]

    @property
    def valid(self) -> bool:
        """Nothing lost, nothing unexpected, nothing back after an ok ack, no failed publish
        consumed (a failure here is a definite Error reply from the machine)."""
        return not (
            self.lost or self.unexpected or self.redelivered_after_ack or self.failed_but_consumed
        )


def check_queue(history: list[Event]) -> QueueVerdict:
    """Jepsen's total-queue over the simulation's history (as `cluster.chaos.checker`)."""
    publishes: dict[str, set[str]] = {"invoke": set(), "ok": set(), "fail": set(), "info": set()}
    acked_ok: set[str] = set()
    consumed: Counter[str] = Counter()
    delivered: Counter[str] = Counter()
    back_after_ack: set[str] = set()
    for _at, _client, kind, f, value, redelivered in history:
        if f == "enqueue":
            publishes[kind].add(value)
        elif f == "dequeue" and kind == "ok" and value:
            delivered[value] += 1
            if redelivered and value in acked_ok:
                back_after_ack.add(value)
        elif f == "ack" and kind in ("ok", "info"):
            consumed[value] += 1
            if kind == "ok":
                acked_ok.add(value)
        elif f == "drain" and kind == "ok":
            delivered[value] += 1
            consumed[value] += 1
            if redelivered and value in acked_ok:
                back_after_ack.add(value)
    attempted, confirmed, failed = publishes["invoke"], publishes["ok"], publishes["fail"]
    return QueueVerdict(
        confirmed=len(confirmed),
        consumed=len(consumed),
        lost=sorted(confirmed - set(consumed)),
        unexpected=sorted(set(delivered) - attempted),
        redelivered_after_ack=sorted(back_after_ack),
        failed_but_consumed=sorted(failed & set(consumed)),
        duplicated=sorted(v for v, n in delivered.items() if n > 1 and v in acked_ok),
    )
