"""Whether this node's applied state is current: the rule that gates deliveries (issue 24).

A node that applies entries late (it was paused, or cut off, and catches up) would otherwise
send deliveries that later committed entries have already taken back (a node-down, a
disconnected or consumer timeout, a partition handed to another member). Its applied state is
current when:
- it is the leader and a majority (itself included) has been answering it steadily, or
- it follows a leader it is connected to, has heard from it steadily, and its state has
  applied every entry that leader said was committed. Applied, not only held: a follower
  catching up applies many committed entries in one tick, and a delivery of an early one may
  be taken back by a later one (a NodeDown of this node, a timeout) and acked elsewhere before
  this node applies it; only the state through the leader's commit index says what is still
  this node's consumers' to get.

"Steadily" is what makes buffered or delayed bytes harmless: a peer counts only after it was
heard at least every `silence_s` (the shortest election timeout) for STEADY_S. After a pause
(SIGSTOP) or a blackholed link, what arrives first is a burst of old frames after a silence:
the clock of the contact restarts there, and within STEADY_S the burst is over and, if the peer
had given up on this connection (it closes one that stays silent for its connection timeout,
and only then can the leader commit this node's NodeDown), the close has arrived behind it.

A new leader need not wait STEADY_S (the read-index check of Raft's section 6.4): a follower
that acknowledged the first entry of this leadership (the no-op a leader appends when elected)
had accepted this node as leader after the election, so that acknowledgement is no old frame.
Such a follower counts at once if the acknowledgement came within `silence_s` of the
election (no pause of this node in between) and it has been heard without a long silence since
(no pause after). A silence later restarts its contact as before: the exemption is only for the
stretch that began with the election.
"""

from __future__ import annotations

from dataclasses import dataclass

# how long a peer must have been heard without such a silence before the contact counts
STEADY_S = 1.0


@dataclass(slots=True)
class Contact:
    """Since when one peer has been heard from without a silence over `silence_s`, and when it
    first acknowledged an entry of this node's latest leadership.

    `silence_s` is the shortest election timeout (`RaftSettings.silence_s`): a follower that hears
    nothing from its leader for that long may start asking for votes, so a leader not heard by
    a majority for that long may have been replaced; and a peer silent for that long may have
    been paused or cut off, with old frames still to come."""

    silence_s: float
    peer: str | None = None
    since: float = 0.0
    last: float | None = None
    acked_at: float | None = None

    def heard(self, peer: str | None, now: float) -> None:
        """A frame from `peer` was handled at `now` (monotonic seconds)."""
        if peer != self.peer or self.last is None or now - self.last > self.silence_s:
            self.peer, self.since = peer, now
        self.last = now

    def acknowledged(self, now: float, elected_at: float) -> None:
        """The peer acknowledged, at `now`, an entry of the leadership this node won at
        `elected_at` (call after `heard` for the same frame); the first such time counts."""
        if self.acked_at is None or self.acked_at < elected_at:
            self.acked_at = now

    def steady(self, peer: str | None, now: float) -> bool:
        """Whether `peer` is heard now and has been, without a long silence, for STEADY_S."""
        return self._heard_now(peer, now) and now - self.since >= STEADY_S

    def fresh(self, peer: str | None, now: float, elected_at: float) -> bool:
        """Whether `peer` acknowledged the leadership won at `elected_at` within `silence_s`
        of it and has been heard without a long silence since."""
        acked = self.acked_at
        return (
            self._heard_now(peer, now)
            and acked is not None
            and elected_at <= acked <= elected_at + self.silence_s
            and self.since <= acked
        )

    def _heard_now(self, peer: str | None, now: float) -> bool:
        return (
            peer is not None
            and peer == self.peer
            and self.last is not None
            and now - self.last <= self.silence_s
        )


def majority_steady(
    contacts: dict[str, Contact], peers: list[str], now: float, elected_at: float | None = None
) -> bool:
    """Whether the node and the peers among `peers` that count (steady, or fresh since the
    election at `elected_at` when this node leads) make a majority of the members."""
    counted = sum(
        1
        for peer in peers
        if peer in contacts
        and (
            contacts[peer].steady(peer, now)
            or (elected_at is not None and contacts[peer].fresh(peer, now, elected_at))
        )
    )
    return 2 * (counted + 1) > len(peers) + 1


def follower_current(
    contact: Contact,
    leader: str | None,
    connected: bool,
    now: float,
    applied: int,
    leader_commit: int | None,
) -> bool:
    """Whether a follower's applied state is current: `leader` known, `connected` to it, heard
    steadily (`contact`), and the state applied through `leader_commit` (the commit index the
    leader last announced; None before it announced one) as of the entry being applied."""
    if leader is None or not connected or not contact.steady(leader, now):
        return False
    return leader_commit is None or applied >= leader_commit
