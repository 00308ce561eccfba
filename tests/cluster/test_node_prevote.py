"""Pre-vote: a follower cut off from the leader does not depose it (raft.prevote).

Before, a follower isolated for a few seconds came back at a higher term and forced an
election (measured: term 1 -> 7), and a follower that lost only its link to the leader went
through an election every timeout (term 1 -> 8 in 5 s), each one holding commands. Real node
processes; the peer links run through the chaos harness's proxies.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import LocalCluster, wait_until
from cluster.rawclient import RawClient
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import DeclareOk, Ok
from tests.cluster.proxied import cluster_behind_proxies

pytestmark = pytest.mark.cluster

CUT_S = 5.0  # several election timeouts (800-1600 ms)


def _roles_and_terms(cluster: LocalCluster) -> dict[str, tuple[Any, Any]]:
    return {row["id"]: (row.get("role"), row.get("term")) for row in cluster.status()}


def _total(client: RawClient, queue: str) -> int:
    overview = client.query("overview", queue=queue, stale_ok=True)
    return int(overview["total"]) if overview else 0


@pytest.mark.parametrize("cut", ["isolated", "link to the leader"])
def test_a_follower_cut_off_from_the_leader_never_deposes_it(tmp_path: Path, cut: str) -> None:
    with cluster_behind_proxies(tmp_path / "D") as (cluster, mesh):
        leader = cluster.leader()
        follower, other = cluster.followers()
        client = cluster.raw_client(leader)
        client.command(DeclareQueue("jobs"))
        wait_until(lambda: len({t for _, t in _roles_and_terms(cluster).values()}) == 1, 10, "")
        before = _roles_and_terms(cluster)
        term = before[leader][1]

        if cut == "isolated":
            mesh.isolate(follower)
        else:
            mesh.cut(follower, leader)
            mesh.cut(leader, follower)
        deadline = time.monotonic() + CUT_S
        sent = 0
        while time.monotonic() < deadline:  # the majority goes on committing meanwhile
            assert client.command(Enqueue("jobs", b"m%d" % sent)) == Ok()
            sent += 1
            time.sleep(0.05)
        during = _roles_and_terms(cluster)
        assert during[leader] == ("leader", term), during
        assert during[other] == ("follower", term), during
        assert during[follower][1] == term, during  # it never started a term of its own

        mesh.heal()
        back = cluster.raw_client(follower)
        wait_until(lambda: _total(back, "jobs") == sent, 20, "the follower caught up")
        assert _roles_and_terms(cluster) == before  # no election at all
        back.close()
        client.close()


def test_a_dead_leader_is_still_replaced(tmp_path: Path) -> None:
    """Pre-vote does not hold up failover: the followers' peers stop hearing from the leader,
    so they say yes, and a new leader of a later term is elected."""
    with cluster_behind_proxies(tmp_path / "D") as (cluster, _mesh):
        leader = cluster.leader()
        term = _roles_and_terms(cluster)[leader][1]
        cluster.kill(leader)
        new_leader = wait_until(
            lambda: next(
                (r["id"] for r in cluster.status() if r.get("role") == "leader"), None
            ),
            10,
            "a new leader",
        )
        assert new_leader != leader
        client = cluster.raw_client(new_leader)
        assert client.command(DeclareQueue("after")) == DeclareOk(created=True)
        client.close()
        assert all(t > term for _, t in _roles_and_terms(cluster).values() if t is not None)
