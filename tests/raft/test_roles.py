"""raft.roles: the cause given for each role change, and the counts."""

from __future__ import annotations

from structlog.testing import capture_logs

from raft.roles import RoleChanges

FOLLOWER, CANDIDATE, LEADER = 0, 1, 2


def test_each_change_gets_its_cause_and_a_count() -> None:
    roles = RoleChanges("n1", min_election_timeout_s=0.4, fallback_s=1.6)
    with capture_logs() as logs:
        assert roles.changed(FOLLOWER, CANDIDATE, 0, float("inf")) == (
            "election timeout: no leader heard from since this node started"
        )
        assert roles.changed(CANDIDATE, LEADER, 1, float("inf")) == "won the election of term 1"
        assert roles.changed(LEADER, FOLLOWER, 1, 5.0) == (
            "no majority answered within the leader fallback timeout (1600 ms)"
        )
        assert roles.changed(FOLLOWER, CANDIDATE, 1, 0.9) == (
            "election timeout: no leader heard from for 900 ms"
        )
        assert roles.changed(CANDIDATE, FOLLOWER, 2, 0.1) == (
            "another node won the election of term 2"
        )
        assert roles.changed(FOLLOWER, CANDIDATE, 2, 0.05).startswith("leadership transfer")
        assert roles.changed(CANDIDATE, LEADER, 3, 0.05) == "won the election of term 3"
        assert roles.changed(LEADER, FOLLOWER, 7, 0.0).startswith("saw term 7, above its own 3")
    assert roles.counts() == {
        "follower->candidate": 3,
        "candidate->leader": 2,
        "leader->follower": 2,
        "candidate->follower": 1,
    }
    assert [entry["log_level"] for entry in logs if entry["old"] == "leader"] == ["warning"] * 2
    assert all(entry["event"] == "role_changed" and entry["node"] == "n1" for entry in logs)
    assert [entry["term"] for entry in logs] == [1, 1, 1, 2, 2, 3, 3, 7]
