"""raft.contact: a peer counts only once heard without a long silence for STEADY_S."""

from __future__ import annotations

from raft.contact import (
    STEADY_S,
    Contact,
    follower_current,
    majority_steady,
)

BEAT_S = 0.05  # the leader's heartbeat period
SILENCE_S = 0.4  # the shortest election timeout (Contact.silence_s)


def heard_every_beat(contact: Contact, peer: str, start: float, end: float) -> None:
    now = start
    while now <= end:
        contact.heard(peer, now)
        now += BEAT_S


def test_a_peer_heard_at_every_heartbeat_counts_after_steady_s() -> None:
    """Heartbeats from t=0: not steady before STEADY_S, steady after, not steady once silent."""
    contact = Contact(SILENCE_S)
    heard_every_beat(contact, "n1", 0.0, STEADY_S / 2)
    assert not contact.steady("n1", STEADY_S / 2)
    heard_every_beat(contact, "n1", STEADY_S / 2 + BEAT_S, STEADY_S + 0.1)
    assert contact.steady("n1", STEADY_S + 0.1)
    assert not contact.steady("n2", STEADY_S + 0.1)  # another peer (a new leader) starts over
    assert not contact.steady("n1", STEADY_S + 0.1 + SILENCE_S + 0.01)


def test_a_burst_after_a_silence_restarts_the_clock() -> None:
    """A pause or a blackholed link: old frames arrive in a burst after a silence; the contact
    counts again only STEADY_S after the burst, however many frames it held."""
    contact = Contact(SILENCE_S)
    heard_every_beat(contact, "n1", 0.0, 3.0)
    assert contact.steady("n1", 3.0)
    for i in range(100):  # resumed at t=7: a hundred buffered frames at once
        contact.heard("n1", 7.0 + i * 1e-5)
    assert not contact.steady("n1", 7.01)
    heard_every_beat(contact, "n1", 7.05, 7.0 + STEADY_S + 0.05)
    assert contact.steady("n1", 7.0 + STEADY_S + 0.05)


def test_the_leader_needs_a_majority_with_itself() -> None:
    """Three members: one steady follower makes a majority; none does not; one member alone."""
    steady, silent = Contact(SILENCE_S), Contact(SILENCE_S)
    heard_every_beat(steady, "n2", 0.0, 2.0)
    contacts = {"n2": steady, "n3": silent}
    assert majority_steady(contacts, ["n2", "n3"], 2.0)
    assert not majority_steady({"n3": silent}, ["n2", "n3"], 2.0)
    assert not majority_steady(contacts, ["n2", "n3", "n4", "n5"], 2.0)
    assert majority_steady({}, [], 2.0)


def test_a_new_leader_counts_a_follower_that_acknowledged_its_first_entry_at_once() -> None:
    """Elected at t=10, the follower acks the leadership's first entry 30 ms later: it counts
    at once (no STEADY_S wait); one of four such followers is no majority of five."""
    contact = Contact(SILENCE_S)
    contact.heard("n2", 10.03)
    contact.acknowledged(10.03, elected_at=10.0)
    assert not contact.steady("n2", 10.05)
    assert contact.fresh("n2", 10.05, elected_at=10.0)
    assert majority_steady({"n2": contact}, ["n2", "n3"], 10.05, elected_at=10.0)
    assert not majority_steady({"n2": contact}, ["n2", "n3"], 10.05)  # no election given
    assert not majority_steady({"n2": contact}, ["n2", "n3", "n4", "n5"], 10.05, elected_at=10.0)


def test_an_acknowledgement_after_a_pause_of_the_new_leader_does_not_count() -> None:
    """The leader is paused right after its election; the buffered acknowledgement is handled
    on the resume, more than SILENCE_S later: meanwhile another leader may have
    taken over, so only the STEADY_S rule applies from there."""
    contact = Contact(SILENCE_S)
    contact.heard("n2", 15.0)
    contact.acknowledged(15.0, elected_at=10.0)
    assert not contact.fresh("n2", 15.01, elected_at=10.0)
    heard_every_beat(contact, "n2", 15.05, 15.0 + STEADY_S)
    assert contact.steady("n2", 15.0 + STEADY_S)


def test_a_silence_after_the_acknowledgement_ends_the_exemption() -> None:
    """Acknowledged promptly, then silent (a pause, a cut link): once heard again the follower
    counts only after STEADY_S, like any contact that restarted."""
    contact = Contact(SILENCE_S)
    contact.heard("n2", 10.03)
    contact.acknowledged(10.03, elected_at=10.0)
    heard_every_beat(contact, "n2", 10.08, 10.3)
    assert contact.fresh("n2", 10.3, elected_at=10.0)
    assert not contact.fresh("n2", 10.3 + SILENCE_S + 0.01, elected_at=10.0)
    contact.heard("n2", 13.0)  # a burst after the silence
    assert not contact.fresh("n2", 13.0, elected_at=10.0)
    assert not contact.steady("n2", 13.0)


def test_an_acknowledgement_of_an_earlier_leadership_does_not_count() -> None:
    """Acknowledged when this node led before (t=10); it leads again from t=20: that old
    acknowledgement says nothing of the new term, a new one does."""
    contact = Contact(SILENCE_S)
    contact.heard("n2", 10.03)
    contact.acknowledged(10.03, elected_at=10.0)
    heard_every_beat(contact, "n2", 10.08, 20.02)
    assert not contact.fresh("n2", 20.02, elected_at=20.0)
    contact.acknowledged(20.04, elected_at=20.0)
    assert contact.fresh("n2", 20.05, elected_at=20.0)


def test_a_follower_is_current_only_once_its_state_applied_the_leaders_commit_index() -> None:
    """Steady, connected, the leader announced commit index 120: while the node applies a
    catch-up batch, the entries before 120 are not current (a later entry of the batch may take
    their deliveries back), entry 120 and after are."""
    contact = Contact(SILENCE_S)
    heard_every_beat(contact, "n1", 0.0, 2.0)
    assert not follower_current(contact, "n1", True, 2.0, applied=100, leader_commit=120)
    assert not follower_current(contact, "n1", True, 2.0, applied=119, leader_commit=120)
    assert follower_current(contact, "n1", True, 2.0, applied=120, leader_commit=120)
    assert follower_current(contact, "n1", True, 2.0, applied=3, leader_commit=None)
    assert not follower_current(contact, "n1", False, 2.0, applied=120, leader_commit=120)
    assert not follower_current(contact, None, True, 2.0, applied=120, leader_commit=120)
    assert not follower_current(contact, "n2", True, 2.0, applied=120, leader_commit=120)
