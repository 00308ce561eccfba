"""The ProxyMesh under real pysyncobj nodes (in-process, loopback): partitions behave like Raft
expects, so the cluster can use it once nodes dial their peers through the proxies.

The nodes dial through a TCPNode subclass that keeps the canonical address as identity and
overrides only where it connects, as `raft/node.py` does with cluster.toml `peer_addresses`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.node import TCPNode

from cluster.chaos.linkproxy import ProxyMesh
from cluster.launcher import free_ports

pytestmark = pytest.mark.slow


class ProxiedTCPNode(TCPNode):  # type: ignore[misc]
    """A peer known by its canonical address but dialed at `dial` (its link proxy)."""

    def __init__(self, address: str, dial: str) -> None:
        super().__init__(address)
        host, port = dial.rsplit(":", 1)
        self._dial = (host, int(port))

    @property
    def ip(self) -> str:
        return self._dial[0]

    @property
    def port(self) -> int:
        return self._dial[1]


class Counter(SyncObj):  # type: ignore[misc]
    """The smallest replicated state: one counter."""

    def __init__(self, me: str, peers: list[Any]) -> None:
        conf = SyncObjConf(
            appendEntriesPeriod=0.05,
            raftMinTimeout=0.3,
            raftMaxTimeout=0.7,
            connectionTimeout=1.0,
            connectionRetryTime=0.2,
            leaderFallbackTimeout=1.5,
            autoTickPeriod=0.02,
        )
        super().__init__(me, peers, conf)
        self.value = 0  # after SyncObj.__init__: pysyncobj snapshots only later attributes

    @replicated  # type: ignore[untyped-decorator]
    def inc(self) -> int:
        self.value += 1
        return self.value


@pytest.fixture
def cluster() -> Iterator[tuple[dict[str, Counter], ProxyMesh, dict[str, str]]]:
    ids = ["a", "b", "c"]
    addresses = {n: f"127.0.0.1:{p}" for n, p in zip(ids, free_ports(3), strict=True)}
    mesh = ProxyMesh(addresses)
    nodes = {
        n: Counter(
            addresses[n],
            [ProxiedTCPNode(addresses[p], mesh.peer_addresses(n)[p]) for p in ids if p != n],
        )
        for n in ids
    }
    yield nodes, mesh, addresses
    for node in nodes.values():
        node.destroy()
    mesh.close()


def leader_of(
    nodes: dict[str, Counter], among: list[str], addresses: dict[str, str], timeout_s: float = 10
) -> str:
    """The node id that every node in `among` reports as leader (waits for agreement)."""
    by_address = {a: n for n, a in addresses.items()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = {str(nodes[n]._getLeader()) for n in among}
        if len(seen) == 1 and (leader := by_address.get(seen.pop())) in among:
            return leader
        time.sleep(0.05)
    raise AssertionError(f"no agreed leader among {among}")


def test_isolated_leader_cannot_commit_while_the_majority_elects_and_commits(
    cluster: tuple[dict[str, Counter], ProxyMesh, dict[str, str]],
) -> None:
    """isolate(leader): the other two elect a leader and commit; heal: all three converge."""
    nodes, mesh, addresses = cluster
    old = leader_of(nodes, list(nodes), addresses)
    assert nodes[old].inc(sync=True, timeout=5) == 1
    mesh.isolate(old)
    rest = [n for n in nodes if n != old]
    new = leader_of(nodes, rest, addresses)
    assert new != old
    assert nodes[new].inc(sync=True, timeout=5) == 2
    with pytest.raises(SyncObjException):
        nodes[old].inc(sync=True, timeout=2)
    mesh.heal()
    deadline = time.monotonic() + 10
    while {n.value for n in nodes.values()} != {2} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {n: c.value for n, c in nodes.items()} == dict.fromkeys(nodes, 2)


def test_one_way_cut_of_the_leader_output_moves_leadership(
    cluster: tuple[dict[str, Counter], ProxyMesh, dict[str, str]],
) -> None:
    """Only the leader's outgoing bytes dropped: the followers stop hearing it and elect anew."""
    nodes, mesh, addresses = cluster
    old = leader_of(nodes, list(nodes), addresses)
    for peer in nodes:
        if peer != old:
            mesh.cut(old, peer)
    rest = [n for n in nodes if n != old]
    new = leader_of(nodes, rest, addresses)
    assert new != old
    assert nodes[new].inc(sync=True, timeout=5) >= 1
    mesh.heal()
