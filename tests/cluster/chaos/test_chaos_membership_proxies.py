"""Issue 24's harness gap: a member added by the membership fault dials through the link
proxies like the others, so a partition that names it (or an old node) cuts it off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import config as cluster_config
from cluster import launcher
from cluster.chaos.control import LauncherCluster, route_through_proxies
from cluster.chaos.linkproxy import ProxyMesh
from cluster.client import Client
from cluster.launcher import wait_until

pytestmark = pytest.mark.cluster


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[LauncherCluster, ProxyMesh]]:
    data_dir = tmp_path / "D"
    launcher.init_cluster(data_dir, 3)
    mesh = ProxyMesh({n.id: n.raft_address for n in cluster_config.load(data_dir).nodes})
    assert route_through_proxies(data_dir, mesh)
    cluster = LauncherCluster(data_dir)
    cluster.mesh = mesh
    try:
        yield cluster, mesh
    finally:
        cluster.shutdown()
        mesh.close()


def applied(cluster: LauncherCluster, node: str) -> int:
    status = launcher.node_status(cluster.node(node), cluster.key, 2.0)
    return int((status or {}).get("last_applied") or -1)


def test_a_replacement_member_is_partitioned_like_a_founding_one(
    proxied: tuple[LauncherCluster, ProxyMesh],
) -> None:
    """n4 replaces a follower; every link of n4 runs through the mesh (bytes forwarded);
    isolating n4 stops it applying while the majority commits; healed, it catches up."""
    cluster, mesh = proxied
    cluster.start_all()
    launcher.wait_for_leader(cluster.config, cluster.key, 30)
    leader = wait_until(cluster.leader, 30, "a leader")
    old = next(n for n in cluster.node_ids() if n != leader)
    new = cluster.replace(old)
    peers = [n for n in cluster.node_ids() if n != new]
    assert set(mesh.nodes) == set(cluster.node_ids()) and old not in mesh.nodes
    wait_until(lambda: all(mesh.proxies[(new, p)].bytes_forwarded()[0] > 0 for p in peers), 20,
               "the new member's traffic through its proxies")  # fmt: skip
    wait_until(lambda: applied(cluster, new) >= applied(cluster, leader), 30, "n4 caught up")
    mesh.isolate(new)
    frozen = applied(cluster, new)
    endpoints = [cluster.node(p).client_address for p in peers]
    with Client(endpoints, cluster.key, name="majority") as client:
        client.declare_queue("during")
        for i in range(5):
            client.publish("during", f"m{i}".encode(), timeout_s=20)
    assert applied(cluster, leader) > frozen
    assert applied(cluster, new) == frozen  # cut off: nothing reached it
    mesh.heal()
    wait_until(lambda: applied(cluster, new) >= applied(cluster, leader), 30, "caught up")
