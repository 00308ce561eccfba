"""A local cluster whose nodes dial each other through link proxies (imported by test modules)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from cluster import config
from cluster.chaos.linkproxy import ProxyMesh
from cluster.launcher import LocalCluster, init_cluster


@contextlib.contextmanager
def cluster_behind_proxies(
    data_dir: Path, nodes: int = 3
) -> Iterator[tuple[LocalCluster, ProxyMesh]]:
    """A started `nodes`-node cluster in `data_dir` whose every peer link runs through the
    returned mesh (`isolate`, `heal`); every node is stopped and the mesh closed after."""
    cfg = init_cluster(data_dir, nodes)
    mesh = ProxyMesh({n.id: n.raft_address for n in cfg.nodes})
    proxied = tuple(
        dataclasses.replace(n, peer_addresses=mesh.peer_addresses(n.id)) for n in cfg.nodes
    )
    cfg = dataclasses.replace(cfg, nodes=proxied)
    config.write(data_dir, cfg)
    cluster = LocalCluster(data_dir, cfg)
    try:
        for node in cfg.nodes:
            cluster.start_node(node.id)
        yield cluster, mesh
    finally:
        cluster.stop()
        mesh.close()
