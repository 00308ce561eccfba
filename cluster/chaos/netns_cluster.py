"""A TLS cluster of bundle nodes, each in a network namespace of its own (`NetnsLab`).

`NetnsCluster` writes the bundles of `quorumq cluster init --hosts` for the lab's addresses,
copies each node's bundle into a directory standing for its machine and runs
`quorumq node start --bundle` there, in the node's namespace. Clients live in a fourth
namespace, `client`: every status query of this class enters it, and callers use the cluster
from there (`with cluster.client_side(): ...`). It offers the chaos nemeses' verbs
(`cluster.chaos.nemesis.ClusterHandle`) plus `partition`/`heal` on real links.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from cluster import bundles
from cluster import config as cluster_config
from cluster.chaos.netns import NetnsLab, log_file
from cluster.client import Client
from cluster.client.errors import ClusterError
from cluster.client.tls import client_context
from cluster.config import ClusterConfig, NodeConfig
from cluster.launcher import node_status

log = structlog.get_logger(__name__)

CLIENT_HOST = "client"
STATUS_TIMEOUT_S = 1.0
CHANGE_RETRY_S = 30.0
CATCH_UP_TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0


class NetnsCluster:
    """Bundle nodes in namespaces of `lab` (one host per node, labelled by node id)."""

    def __init__(self, lab: NetnsLab, workdir: Path, nodes: int = 3) -> None:
        self.lab = lab
        self.workdir = Path(workdir)
        if CLIENT_HOST not in lab.hosts:
            lab.add_host(CLIENT_HOST)
        node_ids = [f"n{i}" for i in range(1, nodes + 1)]
        hosts = [lab.hosts.get(n) or lab.add_host(n) for n in node_ids]
        self.out = self.workdir / "bundles"
        config = bundles.init_bundles(
            self.out, [bundles.HostSpec(host.address) for host in hosts], name="netns"
        )
        self.members: dict[str, NodeConfig] = {node.id: node for node in config.nodes}
        self.client_dir = self.out / bundles.CLIENT_DIR
        self.key = cluster_config.read_client_key(self.client_dir / cluster_config.CLIENT_KEY_FILE)
        self.tls = client_context(self.client_dir / "ca.crt")
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        for node_id in node_ids:
            self._install(node_id)

    def _install(self, node_id: str) -> None:
        """Copy the node's bundle to its 'machine' (workdir/hosts/ID), as an operator would."""
        shutil.copytree(self.out / node_id, self.machine(node_id), symlinks=True)

    def machine(self, node_id: str) -> Path:
        """The directory standing for `node_id`'s machine: its bundle, its data dir."""
        return self.workdir / "hosts" / node_id

    def node_ids(self) -> list[str]:
        """Every member's id, sorted."""
        return sorted(self.members)

    def endpoints(self) -> dict[str, str]:
        """Every member's client address, by node id."""
        return {n: self.members[n].client_address for n in self.node_ids()}

    @property
    def config(self) -> ClusterConfig:
        """The members as a cluster config (data dirs: each machine's node dir)."""
        nodes = tuple(
            dataclasses.replace(self.members[n], data_dir=self.machine(n) / n)
            for n in self.node_ids()
        )
        return ClusterConfig(name="netns", created_ms=0, nodes=nodes, tls=True)

    @contextlib.contextmanager
    def client_side(self) -> Iterator[None]:
        """Run the block (and the threads it starts) in the clients' namespace."""
        with self.lab.entered(CLIENT_HOST):
            yield

    def client(self, **kwargs: Any) -> Client:
        """A TLS client of every member (call it inside `client_side`)."""
        return Client(list(self.endpoints().values()), self.key, tls=self.tls, **kwargs)

    # --- processes ---------------------------------------------------------------------------

    def start(self, node: str) -> None:
        """Start `node` from its machine dir in its namespace (no-op while it runs)."""
        running = self.processes.get(node)
        if running is not None and running.poll() is None:
            return
        machine = self.machine(node)
        with log_file(machine / "stdout.log") as out, log_file(machine / "stderr.log") as err:
            self.processes[node] = self.lab.popen(
                node,
                [sys.executable, "-m", "cluster.cli", "node", "start", "--bundle", str(machine)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )  # fmt: skip

    def start_all(self) -> None:
        """Start every member that is not running."""
        for node in self.node_ids():
            self.start(node)

    def _signal(self, node: str, sig: int) -> None:
        process = self.processes.get(node)
        if process is not None and process.poll() is None:
            process.send_signal(sig)

    def kill(self, node: str) -> None:
        """SIGKILL `node` and reap it."""
        self._signal(node, signal.SIGCONT)
        self._signal(node, signal.SIGKILL)
        if node in self.processes:
            self.processes[node].wait(10)

    def pause(self, node: str) -> None:
        """SIGSTOP `node`."""
        self._signal(node, signal.SIGSTOP)

    def resume(self, node: str) -> None:
        """SIGCONT `node`."""
        self._signal(node, signal.SIGCONT)

    def stop(self, node: str, grace_s: float = 5.0) -> None:
        """SIGTERM `node`, SIGKILL after `grace_s`."""
        self._signal(node, signal.SIGCONT)
        self._signal(node, signal.SIGTERM)
        process = self.processes.get(node)
        if process is None:
            return
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill(node)

    def stop_all(self) -> None:
        """Stop every node this cluster started."""
        for node in list(self.processes):
            self.stop(node)

    def shutdown(self) -> None:
        """Stop every node for good (paused ones are resumed first)."""
        self.stop_all()

    def lose_power(self, node: str, seed: int) -> str:
        """Not on namespaces (the page cache is the machine's): refused."""
        raise RuntimeError("power-loss faults are not supported with --netns")

    # --- links -------------------------------------------------------------------------------

    def partition(self, node: str) -> None:
        """Cut `node`'s link: it reaches no peer and no client (a real link failure)."""
        self.lab.link_down(node)

    def heal(self, node: str) -> None:
        """Bring `node`'s link back."""
        self.lab.link_up(node)

    # --- status ------------------------------------------------------------------------------

    def status(self, node: str) -> dict[str, Any] | None:
        """`node`'s status map, asked from the clients' namespace; None when unreachable."""
        with self.client_side():
            return node_status(self.members[node], self.key, STATUS_TIMEOUT_S, self.tls)

    def leader(self) -> str | None:
        """The leader a majority of the members report, or None."""
        votes: dict[str, int] = {}
        for node in self.node_ids():
            leader = (self.status(node) or {}).get("leader")
            if isinstance(leader, str):
                votes[leader] = votes.get(leader, 0) + 1
        return next((n for n, c in votes.items() if c > len(self.members) // 2), None)

    def wait_leader(self, timeout_s: float = START_TIMEOUT_S, exclude: str | None = None) -> str:
        """Wait for a leader (other than `exclude`) a majority reports; its id."""
        return str(
            _wait(lambda: ld if (ld := self.leader()) != exclude else None, timeout_s, "a leader")
        )

    def converged(self, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
        """Wait until every member answers with one (last_applied, digest); the statuses."""

        def same() -> dict[str, dict[str, Any]] | None:
            found = {n: self.status(n) for n in self.node_ids()}
            answered = {n: s for n, s in found.items() if s is not None}
            pairs = {(s.get("last_applied"), s.get("digest")) for s in answered.values()}
            return answered if len(answered) == len(found) and len(pairs) == 1 else None

        found: dict[str, dict[str, Any]] = _wait(same, timeout_s, "equal digests on every member")
        return found

    # --- membership --------------------------------------------------------------------------

    def replace(self, old: str) -> str:
        """Replace member `old` by a new host and node (`cluster add-host`, `member add`,
        start it, wait until it caught up, `member remove old`, stop old); the new id."""
        number = max(int(n[1:]) for n in (*self.members, *self.processes)) + 1
        new = f"n{number}"
        host = self.lab.add_host(new)
        node = bundles.add_node_bundle(self.out, bundles.HostSpec(host.address))
        if node.id != new:
            raise RuntimeError(f"the authority issued {node.id}, expected {new}")
        self._install(new)
        self._change(
            "member_add",
            {"node": new, "raft_address": node.raft_address, "client_address": node.client_address},
        )
        target = int((self.status(self.wait_leader()) or {}).get("commit_index") or 0)
        self.members[new] = node
        self.start(new)
        _wait(
            lambda: int((self.status(new) or {}).get("raft_last_applied") or 0) >= target,
            CATCH_UP_TIMEOUT_S,
            f"{new} caught up to {target}",
        )
        self._change("member_remove", {"node": old})
        del self.members[old]
        self.stop(old, grace_s=3.0)
        log.info("node_replaced", old=old, new=new)
        return new

    def _change(self, action: str, args: dict[str, str | int]) -> None:
        """A membership change through the leader, retried while refused as unavailable."""
        deadline = time.monotonic() + CHANGE_RETRY_S
        reason = "no leader"
        while time.monotonic() < deadline:
            result = self._admin_on_leader(action, args)
            if isinstance(result, str):
                reason = result
            elif result.get("changed"):
                return
            else:
                reason = str(result.get("refused"))
                if not result.get("unavailable"):
                    break
            time.sleep(0.5)
        raise RuntimeError(f"{action} {args.get('node')} refused: {reason}")

    def _admin_on_leader(self, action: str, args: dict[str, str | int]) -> dict[str, Any] | str:
        """The leader's answer to one admin action, or why it could not be asked."""
        leader = self.leader()
        if leader is None:
            return "no leader"
        try:
            with self.client_side(), Client(
                [self.members[leader].client_address], self.key, tls=self.tls,
                reconnect=False, prefer_leader=False, connect_timeout_s=2.0,
                name="netns-membership",
            ) as client:  # fmt: skip
                return dict(client.admin(action, args, timeout_s=40.0))
        except (ClusterError, OSError) as err:
            return f"{type(err).__name__}: {err}"


def _wait(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `predicate` every 0.1 s until truthy (returned); RuntimeError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)
