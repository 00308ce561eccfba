"""Test helpers shipped with quorumq: a local cluster of real node processes and a raw client.

`start_cluster(tmp_path, nodes=3) -> LocalCluster` writes a data dir (ephemeral ports on
127.0.0.1, a fresh secret), starts `python -m cluster.node` per node and waits for a leader.
`RawClient` speaks `cluster.protocol` with blocking sockets (tests and debugging only; the real
client library is `cluster.client`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fifo
from cluster import config, protocol
from cluster.config import ClusterConfig, NodeConfig
from cluster.errors import ProtocolError

ROOT = Path(__file__).resolve().parent.parent


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago (ephemeral range)."""
    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((host, 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


def write_cluster(
    data_dir: Path, nodes: int = 3, fsync: str = "batch", caps: dict[str, int] | None = None
) -> ClusterConfig:
    """Write `cluster.toml` and the secret for a local cluster; returns the config."""
    ports = free_ports(2 * nodes)
    node_configs = tuple(
        NodeConfig(
            id=f"n{i + 1}",
            host="127.0.0.1",
            raft_port=ports[2 * i],
            client_port=ports[2 * i + 1],
            data_dir=data_dir / f"n{i + 1}",
            max_machine_version=(caps or {}).get(f"n{i + 1}"),
        )
        for i in range(nodes)
    )
    cfg = ClusterConfig("test", int(time.time() * 1000), node_configs, fsync=fsync)  # type: ignore[arg-type]
    config.write(data_dir, cfg)
    config.create_secret(data_dir)
    return cfg


class RawClient:
    """A blocking protocol client: handshake, commands, queries, admin, collected effects."""

    def __init__(self, address: str, client_key: bytes, name: str = "raw", timeout_s: float = 10):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.ids = itertools.count(1)
        self.effects: list[Any] = []
        self.welcome: dict[str, Any] = {}
        challenge = protocol.recv_frame(self.sock)
        protocol.send_frame(self.sock, protocol.hello(client_key, challenge["nonce"], name))
        answer = protocol.recv_frame(self.sock)
        if answer["op"] != protocol.WELCOME:
            self.sock.close()
            raise ProtocolError(answer.get("code", "auth_failed"), answer.get("message", ""))
        self.welcome = answer
        self.connection = fifo.decode(answer["connection"])

    def close(self) -> None:
        """Close the socket."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return the frame answering it (effects are collected)."""
        protocol.send_frame(self.sock, message)
        return self.wait_for(message["id"])

    def wait_for(self, request_id: int) -> dict[str, Any]:
        """Read frames until the one with `id == request_id`."""
        while True:
            frame = protocol.recv_frame(self.sock)
            if frame["op"] == protocol.EFFECT:
                self.effects.append(fifo.decode(frame["effect"]))
            elif frame.get("id") == request_id:
                return frame

    def command(self, command: Any) -> Any:
        """Run a command; returns the decoded fifo reply or raises ProtocolError."""
        frame = self.request(protocol.command(next(self.ids), fifo.encode(command)))
        if frame["op"] == protocol.ERROR:
            raise ProtocolError(frame["code"], frame["message"])
        return fifo.decode(frame["reply"])

    def query(self, name: str, **args: Any) -> Any:
        """Run a query; returns its result or raises ProtocolError."""
        frame = self.request(protocol.query(next(self.ids), name, args))
        if frame["op"] == protocol.ERROR:
            raise ProtocolError(frame["code"], frame["message"])
        return frame["result"]

    def admin(self, action: str, **args: Any) -> Any:
        """Run an admin action; returns its result or raises ProtocolError."""
        frame = self.request(protocol.admin(next(self.ids), action, args))
        if frame["op"] == protocol.ERROR:
            raise ProtocolError(frame["code"], frame["message"])
        return frame["result"]

    def read_effects(self, count: int, timeout_s: float = 5.0) -> list[Any]:
        """Wait until at least `count` effects were received; returns them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.effects) < count and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                frame = protocol.recv_frame(self.sock)
            except TimeoutError:
                break
            if frame["op"] == protocol.EFFECT:
                self.effects.append(fifo.decode(frame["effect"]))
        self.sock.settimeout(10)
        return list(self.effects)


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "") -> Any:
    """Poll `predicate` until it returns a truthy value; AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.05)


@dataclass
class LocalCluster:
    """Real node processes on loopback, driven from a test."""

    data_dir: Path
    config: ClusterConfig
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def client_key(self) -> bytes:
        """The client credential of this cluster."""
        return config.client_key(config.read_secret(self.data_dir))

    def start_node(self, node_id: str, max_machine_version: int | None = None) -> None:
        """Start (or restart) one node process."""
        args = [sys.executable, "-m", "cluster.node", "--data-dir", str(self.data_dir)]
        args += ["--node-id", node_id]
        if max_machine_version is not None:
            args += ["--max-machine-version", str(max_machine_version)]
        log = open(self.data_dir / f"{node_id}.stderr", "ab")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs[node_id] = subprocess.Popen(args, stdout=log, stderr=log, cwd=ROOT, env=env)
        log.close()

    def client(self, node_id: str, name: str = "test") -> RawClient:
        """A RawClient connected to `node_id` (retries while the node starts)."""
        address = self.config.node(node_id).client_address
        client: RawClient = wait_until(
            lambda: _try_connect(address, self.client_key, name), 10, address
        )
        return client

    def status(self) -> dict[str, dict[str, Any] | None]:
        """Each node's status map, or None for a node that does not answer."""
        out: dict[str, dict[str, Any] | None] = {}
        for node in self.config.nodes:
            client = _try_connect(node.client_address, self.client_key, "status", timeout_s=2)
            if client is None:
                out[node.id] = None
                continue
            try:
                out[node.id] = client.query("status")
            except (OSError, ProtocolError):
                out[node.id] = None
            finally:
                client.close()
        return out

    def leader(self, timeout_s: float = 15.0) -> str:
        """The id of the leader that every answering node agrees on."""

        def agreed() -> str | None:
            statuses = [s for s in self.status().values() if s is not None]
            leaders = {s["id"] for s in statuses if s["role"] == "leader"}
            if len(leaders) == 1 and all(s["leader"] in leaders for s in statuses):
                return str(leaders.pop())
            return None

        return str(wait_until(agreed, timeout_s, "an agreed leader"))

    def kill(self, node_id: str) -> None:
        """SIGKILL a node process."""
        proc = self.procs.pop(node_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def restart(self, node_id: str, max_machine_version: int | None = None) -> None:
        """Stop a node gracefully (if running) and start it again from its journal and dump."""
        if node_id in self.procs:
            self.terminate(node_id)
        self.start_node(node_id, max_machine_version)

    def terminate(self, node_id: str) -> int:
        """SIGTERM a node and wait for it; returns its exit code."""
        proc = self.procs.pop(node_id)
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)

    def converged(self, timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
        """Wait until every node answers with the same last_applied and digest."""

        def same() -> dict[str, dict[str, Any]] | None:
            statuses = self.status()
            if any(s is None for s in statuses.values()):
                return None
            pairs = {(s["last_applied"], s["digest"]) for s in statuses.values() if s}
            return statuses if len(pairs) == 1 else None  # type: ignore[return-value]

        return wait_until(same, timeout_s, "equal digests")  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Terminate every node (SIGTERM, then SIGKILL after a grace period)."""
        for node_id in list(self.procs):
            self.terminate(node_id)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _try_connect(address: str, key: bytes, name: str, timeout_s: float = 5) -> RawClient | None:
    try:
        return RawClient(address, key, name, timeout_s)
    except (OSError, ProtocolError):
        return None


def start_cluster(
    tmp_path: Path,
    nodes: int = 3,
    fsync: str = "batch",
    caps: dict[str, int] | None = None,
    wait_leader: bool = True,
) -> LocalCluster:
    """Write a data dir under `tmp_path`, start `nodes` node processes, wait for a leader."""
    data_dir = Path(tmp_path)
    cfg = write_cluster(data_dir, nodes, fsync, caps)
    cluster = LocalCluster(data_dir, cfg)
    for node in cfg.nodes:
        cluster.start_node(node.id)
    if wait_leader:
        try:
            cluster.leader()
        except BaseException:
            cluster.stop()
            raise
    return cluster
