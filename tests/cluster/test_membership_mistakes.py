"""Membership mistakes an operator makes, on real node processes: adding members whose nodes
never start, removing a member a healthy cluster needs, and a removed node left running."""

from __future__ import annotations

import pytest

from cluster.launcher import LocalCluster, free_ports, node_pid, wait_until
from tests.cluster.test_membership_e2e import quorumq

pytestmark = pytest.mark.cluster


def _add(cluster: LocalCluster, node_id: str, *extra: str) -> tuple[int, str]:
    raft, client = (f"127.0.0.1:{port}" for port in free_ports(2))
    args = ("member", "add", node_id, "--raft-address", raft, "--client-address", client)
    return quorumq(cluster.data_dir, *args, *extra)


def test_a_second_add_while_an_added_node_never_started_is_refused(
    cluster3: LocalCluster,
) -> None:
    """n4 added but never started: adding n5 too would leave 3 voters of 5 (one lost node
    from an outage), so it is refused naming n4 and the way out; removing the silent n4 is
    allowed, and --force adds anyway."""
    code, out = _add(cluster3, "n4")
    assert code == 0, out
    code, out = _add(cluster3, "n5")
    assert code == 65, out
    assert "n4 is a member but does not answer" in out and "--force" in out
    assert sorted(cluster3.reload().node_ids()) == ["n1", "n2", "n3", "n4"]
    code, out = quorumq(cluster3.data_dir, "member", "remove", "n4")
    assert code == 0, out
    code, out = _add(cluster3, "n5")
    assert code == 0, out  # no silent member left: the normal add-then-start flow
    code, out = _add(cluster3, "n6", "--force")
    assert code == 0, out

    def applied_everywhere() -> bool:
        answering = [s for s in cluster3.statuses().values() if s is not None]
        members = {tuple(s["members"]) for s in answering}
        return len(answering) == 3 and members == {("n1", "n2", "n3", "n5", "n6")}

    wait_until(applied_everywhere, 15, "n1-n3 applying both adds")  # n5, n6 never started


def test_removing_a_needed_member_is_refused_and_a_removed_node_is_stopped(
    cluster3: LocalCluster,
) -> None:
    """Removing an answering follower of a healthy 3-node cluster would leave 2 that cannot
    lose one: refused (exit 65) with the way out; with --force it is removed, and `member
    remove` stops its process (cluster.toml no longer names it: nothing else could)."""
    leader = cluster3.leader()
    victim = next(n for n in ("n3", "n2", "n1") if n != leader)
    node = cluster3.config.node(victim)
    code, out = quorumq(cluster3.data_dir, "member", "remove", victim)
    assert code == 65, out
    assert "could not lose another member" in out and "--force" in out
    assert node_pid(node) is not None
    code, out = quorumq(cluster3.data_dir, "member", "remove", victim, "--force")
    assert code == 0 and "its process stopped" in out, out
    assert node_pid(node) is None
    assert victim not in cluster3.reload().node_ids()
    statuses = cluster3.converged()
    assert {tuple(s["members"]) for s in statuses.values()} == {
        tuple(sorted({"n1", "n2", "n3"} - {victim}))
    }
