"""A ClusterHandle over the nodes of a `cluster.launcher.LocalCluster`.

The LocalCluster keeps the Popen handle of every node it starts so killed nodes are reaped (no
zombies); this adds the nemesis' verbs (pause, power loss, crash-stop) and routes every node's
peer traffic through a ProxyMesh when the cluster config can express it.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import structlog

from cluster import config as cluster_config
from cluster import launcher
from cluster.chaos.linkproxy import ProxyMesh
from cluster.config import ClusterConfig, NodeConfig
from raft import storage

log = structlog.get_logger(__name__)

# The NodeConfig field (peer id -> "host:port" to dial) that lets peers go through proxies.
PEER_ADDRESSES_FIELD = "peer_addresses"
STATUS_TIMEOUT_S = 1.0
REAP_TIMEOUT_S = 5.0


def supports_peer_addresses() -> bool:
    """True when `cluster.config.NodeConfig` can carry per-node peer dial addresses."""
    return PEER_ADDRESSES_FIELD in {f.name for f in dataclasses.fields(NodeConfig)}


def route_through_proxies(data_dir: Path, mesh: ProxyMesh) -> bool:
    """Rewrite `cluster.toml` so each node dials its peers via the mesh; False if unsupported."""
    if not supports_peer_addresses():
        return False
    config = cluster_config.load(data_dir)
    overrides: dict[str, Any] = {}
    nodes = []
    for node in config.nodes:
        overrides[PEER_ADDRESSES_FIELD] = mesh.peer_addresses(node.id)
        nodes.append(dataclasses.replace(node, **overrides))
    cluster_config.write(data_dir, dataclasses.replace(config, nodes=tuple(nodes)))
    return True


class LauncherCluster:
    """Start, kill, pause and query the nodes of one local data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.local = launcher.LocalCluster(data_dir)
        self.data_dir = self.local.data_dir
        self.config: ClusterConfig = self.local.config
        self.key = self.local.key
        self.starts: dict[str, int] = dict.fromkeys(self.config.node_ids(), 0)

    def node_ids(self) -> list[str]:
        """Every node id, sorted."""
        return sorted(self.config.node_ids())

    def node(self, node_id: str) -> NodeConfig:
        """The config of one node."""
        return self.config.node(node_id)

    def endpoints(self) -> dict[str, str]:
        """Client endpoints by node id."""
        return self.config.endpoints()

    def leader(self) -> str | None:
        """The leader a majority of reachable nodes report, or None."""
        votes: dict[str, int] = {}
        for node in self.config.nodes:
            status = launcher.node_status(node, self.key, timeout_s=STATUS_TIMEOUT_S)
            leader = status.get("leader") if status else None
            if isinstance(leader, str):
                votes[leader] = votes.get(leader, 0) + 1
        majority = len(self.config.nodes) // 2 + 1
        for leader, count in votes.items():
            if count >= majority:
                return leader
        return None

    def start(self, node: str) -> None:
        """Start one node from its journal and dump (no-op if it is running)."""
        if launcher.node_pid(self.node(node)) is not None:
            return
        self.local.start_node(node)
        self.starts[node] += 1

    def start_all(self) -> None:
        """Start every node that is not running."""
        for node in self.node_ids():
            self.start(node)

    def kill(self, node: str) -> None:
        """SIGKILL the node and reap it."""
        self._signal(node, signal.SIGCONT)  # a paused node must die too, not linger stopped
        launcher.kill_node(self.node(node), signal.SIGKILL)
        self.local.reap(node, wait_s=REAP_TIMEOUT_S)

    def lose_power(self, node: str, seed: int) -> str:
        """SIGKILL the node, then drop its journal writes that were not fsynced (seeded)."""
        self.kill(node)
        node_dir = self.node(node).data_dir
        lost = storage.power_loss(node_dir / "raft.journal", seed)
        kept, size, synced = lost["kept"], lost["size"], lost["synced"]
        return f"{node}: kept {kept} of {size} journal bytes ({synced} synced)"

    def pause(self, node: str) -> None:
        """SIGSTOP the node."""
        self._signal(node, signal.SIGSTOP)

    def resume(self, node: str) -> None:
        """SIGCONT the node."""
        self._signal(node, signal.SIGCONT)

    def stop_all(self) -> None:
        """Crash-stop every node at once (SIGKILL): the harshest restart for durability."""
        for node in self.node_ids():
            self._signal(node, signal.SIGCONT)
            launcher.kill_node(self.node(node), signal.SIGKILL)
        for node in self.node_ids():
            self.local.reap(node, wait_s=REAP_TIMEOUT_S)

    def shutdown(self) -> None:
        """Stop every node for good (resume paused ones first so SIGTERM is handled)."""
        for node in self.node_ids():
            self._signal(node, signal.SIGCONT)
        launcher.stop_cluster(self.config, grace_s=3.0)
        for node in self.node_ids():
            self.local.reap(node, wait_s=REAP_TIMEOUT_S)

    def pids(self) -> dict[str, int]:
        """Node id -> pid of every running node."""
        return launcher.running_nodes(self.config)

    def _signal(self, node: str, sig: int) -> None:
        pid = launcher.node_pid(self.node(node))
        if pid is not None:
            launcher.kill_node(self.node(node), sig)
