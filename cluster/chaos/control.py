"""A ClusterHandle over the nodes of a `cluster.launcher.LocalCluster`.

The LocalCluster keeps the Popen handle of every node it starts so killed nodes are reaped (no
zombies); this adds the nemesis' verbs (pause, power loss, crash-stop) and routes every node's
peer traffic through a ProxyMesh when the cluster config can express it.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import time
from pathlib import Path
from typing import Any

import structlog

from cluster import config as cluster_config
from cluster import launcher
from cluster.chaos.linkproxy import ProxyMesh
from cluster.client import Client
from cluster.client.errors import AuthError, ClusterError
from cluster.config import ClusterConfig, NodeConfig
from raft import storage

log = structlog.get_logger(__name__)

# The NodeConfig field (peer id -> "host:port" to dial) that lets peers go through proxies.
PEER_ADDRESSES_FIELD = "peer_addresses"
STATUS_TIMEOUT_S = 1.0
REAP_TIMEOUT_S = 5.0
# a (re)started node that exits within this long is a fault error (its exit code and stderr)
START_CHECK_S = 3.0
STDERR_TAIL_BYTES = 2000
CHANGE_RETRY_S = 30.0  # a membership change refused as unavailable is retried this long
CATCH_UP_TIMEOUT_S = 60.0  # a new member must apply what the leader had when it was added


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
        # the client TLS context of a `tls = true` cluster (its CA), else None
        self.tls = self.local.tls
        self.starts: dict[str, int] = dict.fromkeys(self.config.node_ids(), 0)
        # the link proxies every peer dials through (partition faults), if any: a node added by
        # `replace` gets its links there too
        self.mesh: ProxyMesh | None = None

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
            status = self._status(node)
            leader = status.get("leader") if status else None
            if isinstance(leader, str):
                votes[leader] = votes.get(leader, 0) + 1
        majority = len(self.config.nodes) // 2 + 1
        for leader, count in votes.items():
            if count >= majority:
                return leader
        return None

    def start(self, node: str) -> None:
        """Start one node from its journal and dump (no-op if it is running); a node that exits
        within START_CHECK_S raises LauncherError with its exit code and the end of its stderr
        (a nemesis records it as the fault's error, instead of a node silently down)."""
        if launcher.node_pid(self.node(node)) is not None:
            return
        self.local.start_node(node)
        self.starts[node] += 1
        process = self.local.procs[node]
        deadline = time.monotonic() + START_CHECK_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                stderr = self.node(node).data_dir / "stderr.log"
                tail = stderr.read_bytes()[-STDERR_TAIL_BYTES:].decode(errors="replace")
                raise launcher.LauncherError(
                    f"{node} exited {process.returncode} right after it was started: {tail}"
                )
            if self._status(self.node(node)):
                return
            time.sleep(0.05)

    def _status(self, node: NodeConfig) -> dict[str, Any] | None:
        """The node's status map, or None while it cannot answer: unreachable, or a handshake
        refused while it starts (a transient AuthError, not a fault error; a wrong key fails
        every check the same way and shows as a node that never answers)."""
        try:
            return launcher.node_status(node, self.key, STATUS_TIMEOUT_S, self.tls)
        except AuthError as err:
            log.info("status_auth_refused", node=node.id, error=str(err))
            return None

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
        """SIGKILL the node, then drop every journal write since its last fsync (all of them,
        every time: a surviving prefix made most power losses drop nothing)."""
        self.kill(node)
        node_dir = self.node(node).data_dir
        lost = storage.power_loss(node_dir / "raft.journal", seed, keep_prefix=False)
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

    def replace(self, old: str) -> str:
        """Replace member `old` by a new node, as an operator replaces a machine: `member add`
        through the leader, start the new node empty and wait until it caught up, `member
        remove` the old one, stop it for good. Returns the new node's id."""
        new = self._new_node_id()
        raft, client = self._new_raft_address(), f"127.0.0.1:{launcher.free_ports(1)[0]}"
        args: dict[str, str | int] = {"node": new, "raft_address": raft, "client_address": client}
        self._change("member_add", args)
        if self.mesh is not None:
            self.mesh.add_node(new, raft)
        config = cluster_config.with_member_added(self.config, new, raft, client, self.data_dir)
        self._write(config)
        target = self._leader_commit()
        self.start(new)
        self._wait_applied(new, target)
        self._change("member_remove", {"node": old})
        self._signal(old, signal.SIGCONT)
        launcher.stop_node(self.node(old), grace_s=3.0)
        self.local.reap(old, wait_s=REAP_TIMEOUT_S)
        if self.mesh is not None:
            self.mesh.remove_node(old)
        self._write(cluster_config.with_member_removed(self.config, old))
        log.info("node_replaced", old=old, new=new)
        return new

    def _new_node_id(self) -> str:
        number = len(self.starts) + 1
        while f"n{number}" in self.starts:
            number += 1
        return f"n{number}"

    def _new_raft_address(self) -> str:
        """A free raft address for a new member. With link proxies, one above every member's:
        pysyncobj's higher address dials, so the new node dials every peer itself, through
        the proxies its cluster.toml names, and running members (which would dial its real
        address) never do."""
        if self.mesh is None:
            return f"127.0.0.1:{launcher.free_ports(1)[0]}"
        highest = max(node.raft_address for node in self.config.nodes)
        for port in range(int(highest.rpartition(":")[2]) + 1, 65536):
            address = f"127.0.0.1:{port}"
            if address > highest and _port_free(port):
                return address
        raise RuntimeError(f"no free raft port above {highest} for a new member")

    def _write(self, config: ClusterConfig) -> None:
        if self.mesh is not None:  # every member dials every peer through the mesh
            mesh = self.mesh
            nodes = tuple(
                dataclasses.replace(node, peer_addresses=mesh.peer_addresses(node.id))
                for node in config.nodes
            )
            config = dataclasses.replace(config, nodes=nodes)
        cluster_config.write(self.data_dir, config)
        self.config = self.local.reload()
        for node_id in self.config.node_ids():
            self.starts.setdefault(node_id, 0)

    def _change(self, action: str, args: dict[str, str | int]) -> None:
        """A membership change through the current leader, retried while refused as
        unavailable (no leader yet, another change in flight, the target leads)."""
        deadline = time.monotonic() + CHANGE_RETRY_S
        reason = "no leader"
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is None:
                time.sleep(0.5)
                continue
            try:
                with Client(
                    [self.node(leader).client_address],
                    self.key,
                    name="chaos-membership",
                    tls=self.tls,
                    reconnect=False,
                    prefer_leader=False,
                    connect_timeout_s=2.0,
                ) as client:
                    result = client.admin(action, args, timeout_s=40.0)
            except (ClusterError, OSError) as err:
                reason = f"{type(err).__name__}: {err}"
                time.sleep(0.5)
                continue
            if result.get("changed"):
                return
            reason = str(result.get("refused"))
            if not result.get("unavailable"):
                break
            time.sleep(0.5)
        raise RuntimeError(f"{action} {args.get('node')} refused: {reason}")

    def _leader_commit(self) -> int:
        leader = self.leader()
        status = self._status(self.node(leader)) if leader else None
        return int((status or {}).get("commit_index") or 0)

    def _wait_applied(self, node_id: str, target: int) -> None:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            status = self._status(self.node(node_id))
            if status is not None and int(status.get("raft_last_applied") or 0) >= target:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{node_id} did not catch up to index {target} in time")

    def pids(self) -> dict[str, int]:
        """Node id -> pid of every running node."""
        return launcher.running_nodes(self.config)

    def _signal(self, node: str, sig: int) -> None:
        pid = launcher.node_pid(self.node(node))
        if pid is not None:
            launcher.kill_node(self.node(node), sig)


def _port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` now (it can be bound)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
