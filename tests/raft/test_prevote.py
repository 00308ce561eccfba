"""Pre-vote's decisions (raft.prevote): who says yes, when a round is won."""

from __future__ import annotations

from raft.prevote import PreVote

NOW = 100.0


def _asked(pre_vote: PreVote, **changes: object) -> bool:
    asked: dict[str, object] = {
        "leading": False,
        "current_term": 3,
        "last_log": (3, 40),
        "proposed_term": 4,
        "candidate_last_log": (3, 40),
    }
    asked.update(changes)
    return pre_vote.grants(NOW, **asked)  # type: ignore[arg-type]


def test_a_peer_says_yes_only_to_an_up_to_date_candidate_of_a_later_term() -> None:
    pre_vote = PreVote(min_timeout_s=0.4)
    assert _asked(pre_vote)
    assert _asked(pre_vote, candidate_last_log=(3, 41))  # longer log, same last term
    assert _asked(pre_vote, candidate_last_log=(4, 1))  # later last term beats length
    assert not _asked(pre_vote, candidate_last_log=(3, 39))  # shorter log
    assert not _asked(pre_vote, candidate_last_log=(2, 99))  # older last term
    assert not _asked(pre_vote, proposed_term=3)  # not above this peer's term
    assert not _asked(pre_vote, leading=True)  # a leader never helps depose itself


def test_a_peer_that_heard_from_its_leader_lately_says_no() -> None:
    pre_vote = PreVote(min_timeout_s=0.4)
    pre_vote.heard_from_leader(NOW - 0.1)
    assert not _asked(pre_vote)  # leader stickiness: the leader is alive for this peer
    pre_vote.heard_from_leader(NOW - 0.4)
    assert _asked(pre_vote)  # silent for a whole minimum election timeout


def test_a_round_is_won_once_by_a_majority_of_its_own_term() -> None:
    pre_vote = PreVote(min_timeout_s=0.4)
    pre_vote.start_round(5, "me", NOW, retry_after_s=0.6)
    assert pre_vote.deadline == NOW + 0.6
    assert not pre_vote.count(4, "n2", voters=5)  # an answer to an older round
    assert not pre_vote.count(5, "n2", voters=5)  # 2 of 5
    assert not pre_vote.count(5, "n2", voters=5)  # the same voter twice is one vote
    assert pre_vote.count(5, "n3", voters=5)  # 3 of 5
    assert not pre_vote.count(5, "n4", voters=5)  # won already: counted once
    pre_vote.start_round(6, "me", NOW, retry_after_s=0.6)
    assert pre_vote.count(6, "me", voters=1)  # alone: its own vote is the majority
    pre_vote.start_round(7, "me", NOW, retry_after_s=0.6)
    pre_vote.end_round()
    assert not pre_vote.count(7, "n2", voters=3)  # a round dropped (a leader heard from)
