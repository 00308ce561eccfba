"""Reads on any member through the node server's read gate, checked for bounded staleness.

A data query (queue info, a dashboard) goes to whichever node the client is connected to; the
node answers it from its own applied state unless `NodeServer.unavailable_reason(for_read=True)`
refuses it. The hazard argued in issue 26: a follower that rejoins after a partition answers
before it has caught up. The check: a read answered at time t must reflect every publish
confirmed before t - STALENESS_S_MAX (its node's applied index at least that entry's index);
a connected follower lags by a heartbeat or two, far less.
"""

from __future__ import annotations

import bisect
import random
from itertools import accumulate

from raft.sim.cluster import SimCluster

READ_CHANCE = 0.5  # per 50 ms step: one read on a random running member
STALENESS_S_MAX = 1.0
VIOLATIONS_MAX = 3


class ReadChecker:
    """Issues the reads and remembers what each answer reflected."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.reads: list[tuple[float, str, int]] = []  # (time, node, applied index) answered
        self.refused = 0

    def step(self, cluster: SimCluster, now: float) -> None:
        """Maybe read on one running member, as a client connected to it would."""
        if self.rng.random() >= READ_CHANCE:
            return
        nodes = cluster.up_nodes()
        if not nodes:
            return
        node = self.rng.choice(nodes)
        assert node.sessions is not None and node.loop is not None
        if node.loop.run_now(node.sessions.read_refusal) is not None:
            self.refused += 1
            return
        self.reads.append((now, node.node_id, node.applied_index))

    def violations(self, confirms: list[tuple[float, int]]) -> list[str]:
        """Reads that missed a publish confirmed more than STALENESS_S_MAX before them."""
        confirms = sorted(confirms)
        times = [at for at, _index in confirms]
        highest = list(accumulate((index for _at, index in confirms), max))
        found = []
        for at, node_id, index in self.reads:
            count = bisect.bisect_right(times, at - STALENESS_S_MAX)
            if count and index < highest[count - 1]:
                found.append(
                    f"stale read: {node_id} answered at {at:.2f} s from index {index}, behind "
                    f"index {highest[count - 1]} confirmed before {at - STALENESS_S_MAX:.2f} s"
                )
                if len(found) >= VIOLATIONS_MAX:
                    break
        return found
