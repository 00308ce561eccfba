"""raft.contact: a peer counts only once heard without a long silence for STEADY_S."""

from __future__ import annotations

from raft.contact import LEADER_SILENCE_S_MAX, STEADY_S, Contact, majority_steady

BEAT_S = 0.05  # the leader's heartbeat period


def heard_every_beat(contact: Contact, peer: str, start: float, end: float) -> None:
    now = start
    while now <= end:
        contact.heard(peer, now)
        now += BEAT_S


def test_a_peer_heard_at_every_heartbeat_counts_after_steady_s() -> None:
    """Heartbeats from t=0: not steady before STEADY_S, steady after, not steady once silent."""
    contact = Contact()
    heard_every_beat(contact, "n1", 0.0, STEADY_S / 2)
    assert not contact.steady("n1", STEADY_S / 2)
    heard_every_beat(contact, "n1", STEADY_S / 2 + BEAT_S, STEADY_S + 0.1)
    assert contact.steady("n1", STEADY_S + 0.1)
    assert not contact.steady("n2", STEADY_S + 0.1)  # another peer (a new leader) starts over
    assert not contact.steady("n1", STEADY_S + 0.1 + LEADER_SILENCE_S_MAX + 0.01)


def test_a_burst_after_a_silence_restarts_the_clock() -> None:
    """A pause or a blackholed link: old frames arrive in a burst after a silence; the contact
    counts again only STEADY_S after the burst, however many frames it held."""
    contact = Contact()
    heard_every_beat(contact, "n1", 0.0, 3.0)
    assert contact.steady("n1", 3.0)
    for i in range(100):  # resumed at t=7: a hundred buffered frames at once
        contact.heard("n1", 7.0 + i * 1e-5)
    assert not contact.steady("n1", 7.01)
    heard_every_beat(contact, "n1", 7.05, 7.0 + STEADY_S + 0.05)
    assert contact.steady("n1", 7.0 + STEADY_S + 0.05)


def test_the_leader_needs_a_majority_with_itself() -> None:
    """Three members: one steady follower makes a majority; none does not; one member alone."""
    steady, silent = Contact(), Contact()
    heard_every_beat(steady, "n2", 0.0, 2.0)
    contacts = {"n2": steady, "n3": silent}
    assert majority_steady(contacts, ["n2", "n3"], 2.0)
    assert not majority_steady({"n3": silent}, ["n2", "n3"], 2.0)
    assert not majority_steady(contacts, ["n2", "n3", "n4", "n5"], 2.0)
    assert majority_steady({}, [], 2.0)
