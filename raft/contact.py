"""Whether this node's applied state is current: the rule that gates deliveries (issue 24).

A node that applies entries late (it was paused, or cut off, and catches up) would otherwise
send deliveries that later committed entries have already taken back (a node-down, a
disconnected or consumer timeout, a partition handed to another member). Its applied state is
current when:
- it is the leader and a majority (itself included) has been answering it steadily, or
- it follows a leader it is connected to, has heard from it steadily, and holds every entry
  that leader said was committed (so this tick applies up to the leader's commit index).

"Steadily" is what makes buffered or delayed bytes harmless: a peer counts only after it was
heard at least every LEADER_SILENCE_S_MAX for STEADY_S. After a pause (SIGSTOP) or a blackholed
link, what arrives first is a burst of old frames after a silence: the clock of the contact
restarts there, and within STEADY_S the burst is over and, if the peer had given up on this
connection (it closes one that stays silent for its connection timeout, and only then can the
leader commit this node's NodeDown), the close has arrived behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

# a silence longer than this restarts the contact: the shortest election timeout (a follower
# that hears nothing for that long starts asking for votes)
LEADER_SILENCE_S_MAX = 0.4
# how long a peer must have been heard without such a silence before the contact counts
STEADY_S = 1.0


@dataclass(slots=True)
class Contact:
    """Since when one peer has been heard from without a silence over LEADER_SILENCE_S_MAX."""

    peer: str | None = None
    since: float = 0.0
    last: float | None = None

    def heard(self, peer: str | None, now: float) -> None:
        """A frame from `peer` was handled at `now` (monotonic seconds)."""
        if peer != self.peer or self.last is None or now - self.last > LEADER_SILENCE_S_MAX:
            self.peer, self.since = peer, now
        self.last = now

    def steady(self, peer: str | None, now: float) -> bool:
        """Whether `peer` is heard now and has been, without a long silence, for STEADY_S."""
        return (
            peer is not None
            and peer == self.peer
            and self.last is not None
            and now - self.last <= LEADER_SILENCE_S_MAX
            and now - self.since >= STEADY_S
        )


def majority_steady(contacts: dict[str, Contact], peers: list[str], now: float) -> bool:
    """Whether the node and the steady ones among `peers` make a majority of the members."""
    steady = sum(1 for peer in peers if peer in contacts and contacts[peer].steady(peer, now))
    return 2 * (steady + 1) > len(peers) + 1
