"""Peers dialed through `peer_addresses` (link proxies): isolating the leader moves leadership."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.launcher import wait_until
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok
from tests.cluster.proxied import cluster_behind_proxies

pytestmark = pytest.mark.cluster


def test_an_isolated_leader_is_replaced_and_catches_up_after_healing(tmp_path: Path) -> None:
    """Blackhole every link of the leader: the majority elects a leader and goes on; heal: equal."""
    with cluster_behind_proxies(tmp_path / "D") as (cluster, mesh):
        old = cluster.leader()
        majority = [n for n in ("n1", "n2", "n3") if n != old]
        client = cluster.raw_client(majority[0])
        client.command(DeclareQueue("part"))
        assert sum(p.bytes_forwarded()[0] for p in mesh.proxies.values()) > 0  # really proxied
        mesh.isolate(old)

        def majority_leader() -> str | None:
            statuses = {n: s for n, s in cluster.statuses().items() if n in majority and s}
            leaders = {s["leader"] for s in statuses.values()}
            found = leaders.pop() if len(leaders) == 1 else None
            return found if found in majority else None

        wait_until(majority_leader, 15, "a leader in the majority")
        wait_until(lambda: client.command(Enqueue("part", b"during")) == Ok(), 10, "a publish")
        mesh.heal()
        statuses = cluster.converged(20)
        assert len({s["digest"] for s in statuses.values() if s}) == 1
        client.close()
