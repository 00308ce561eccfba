"""Local cluster launcher: create a data dir, start, stop and inspect node processes on one host.

The one local cluster of quorumq: `quorumq cluster ...`, `quorumq node ...`, the demo, the
benchmarks, the chaos runner and every test use it (`start_cluster -> LocalCluster`). Nodes run
as `python -m cluster.cli node start --data-dir D --node-id ID` in their own session, with
stdout/stderr in their node dir, so they outlive the command that started them.

Errors are `LauncherError` subclasses; the CLI maps each class to its exit code (cluster.cli).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, TypeVar

from cluster import config as cluster_config
from cluster import nodelock
from cluster import tls as cluster_tls
from cluster.client.client import Client
from cluster.client.errors import ClusterError, Unavailable
from cluster.client.tls import TlsOption, client_context, data_dir_ca
from cluster.config import ClusterConfig, FsyncPolicy, NodeConfig
from cluster.errors import ProtocolError
from cluster.rawclient import RawClient

PID_FILE = "node.pid"
STOP_GRACE_S = 5.0
LEADER_TIMEOUT_S = 30.0


T = TypeVar("T")


class LauncherError(ClusterError):
    """Raised when a cluster cannot be created, started or stopped as asked (message says why)."""


class LaunchRefused(LauncherError):
    """Raised when the request itself cannot be done: too few nodes, ports out of range, a node
    or a cluster that is already running."""


class DataDirTaken(LauncherError):
    """Raised when a new cluster's data dir already holds something that is not a cluster."""


class NoLeader(LauncherError):
    """Raised when no leader is elected (or a node does not answer) within the timeout."""


# --- creating a data dir ----------------------------------------------------------------------


# ports handed to test and local clusters come from below Linux's default ephemeral range
# (32768-60999): a port taken by bind(0) is an ephemeral one, which the kernel may give to any
# outgoing connection (a client's, a peer's) between the choice and the node's bind: a node
# then failed to start, "address already in use" (twice in two full test runs)
LOCAL_PORTS = range(20000, 32768)


def _bindable(sock: socket.socket, host: str, port: int) -> bool:
    try:
        sock.bind((host, port))
    except OSError:
        return False
    return True


def free_port_run(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """The first of `count` consecutive free TCP ports on `host` in LOCAL_PORTS (a
    `metrics_base_port`: node i takes base + i). Bound then released: a small race."""
    pick = random.SystemRandom()
    for _ in range(attempts):
        base = pick.randrange(LOCAL_PORTS.start, LOCAL_PORTS.stop - count + 1)
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
        try:
            if all(_bindable(sock, host, base + i) for i, sock in enumerate(socks)):
                return base
        finally:
            for sock in socks:
                sock.close()
    raise LauncherError(f"no {count} consecutive free ports on {host} in {attempts} attempts")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free TCP ports on `host` in LOCAL_PORTS (bound then released: a small
    race)."""
    pick = random.SystemRandom()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * 50):
            if len(ports) == count:
                return ports
            port = pick.randrange(LOCAL_PORTS.start, LOCAL_PORTS.stop)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            if port not in ports and _bindable(sock, host, port):
                ports.append(port)
        if len(ports) == count:
            return ports
        raise LauncherError(f"not {count} free ports on {host} in {LOCAL_PORTS}")
    finally:
        for sock in socks:
            sock.close()


def init_cluster(
    data_dir: Path,
    nodes: int = 3,
    *,
    base_port: int | None = None,
    max_machine_version: int | None = None,
    fsync: FsyncPolicy = "batch",
    host: str = "127.0.0.1",
    snapshot_every_entries: int = cluster_config.SNAPSHOT_EVERY_ENTRIES_DEFAULT,
    metrics_base_port: int | None = None,
    caps: dict[str, int] | None = None,
    tls: bool = False,
    http_base_port: int | None = None,
) -> ClusterConfig:
    """Write `D/cluster.toml`, `D/secret` and `D/client.key` for a new local cluster
    (node i serves Prometheus metrics on `metrics_base_port + i` and the management API on
    `http_base_port + i` (0: free ports) when given; `caps` gives single nodes their own
    `max_machine_version`; `tls`: peer traffic over mutual TLS, whose certificates
    `start_cluster` creates)."""
    if nodes < 1:
        raise LaunchRefused("a cluster needs at least one node")
    # raft and client ports in pairs, then one AMQP port per node
    ports = (
        free_ports(3 * nodes, host)
        if base_port is None
        else list(range(base_port, base_port + 3 * nodes))
    )
    if ports[-1] > 65535:
        raise LaunchRefused(f"--base-port {base_port} leaves no room for {nodes} nodes")
    _check_room("--metrics-base-port", metrics_base_port, nodes)
    http_ports = _http_ports(http_base_port, nodes)
    data_dir = data_dir.resolve()
    members = tuple(
        NodeConfig(
            id=f"n{i + 1}",
            host=host,
            raft_port=ports[2 * i],
            client_port=ports[2 * i + 1],
            data_dir=data_dir / f"n{i + 1}",
            max_machine_version=(caps or {}).get(f"n{i + 1}", max_machine_version),
            metrics_port=None if metrics_base_port is None else metrics_base_port + i,
            http_port=None if http_ports is None else http_ports[i],
            amqp_port=ports[2 * nodes + i],
        )
        for i in range(nodes)
    )
    config = ClusterConfig(
        name=data_dir.name,
        created_ms=int(time.time() * 1000),
        nodes=members,
        fsync=fsync,
        bind=host,
        snapshot_every_entries=snapshot_every_entries,
        tls=tls,
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster_config.write(data_dir, config)
    cluster_config.create_secret(data_dir)
    for node in members:
        node.data_dir.mkdir(parents=True, exist_ok=True)
    return config


def _check_room(flag: str, base: int | None, nodes: int) -> None:
    """LaunchRefused when ports `base` .. `base + nodes - 1` do not all exist."""
    if base is not None and base + nodes - 1 > 65535:
        raise LaunchRefused(f"{flag} {base} leaves no room for {nodes} nodes")


def _http_ports(base: int | None, nodes: int) -> list[int] | None:
    """The management ports of a new cluster: none, free ones (base 0), or base + i."""
    if base is None:
        return None
    if base == 0:
        return free_ports(nodes)
    _check_room("--http-base-port", base, nodes)
    return list(range(base, base + nodes))


def client_key(data_dir: Path) -> bytes:
    """The client key of a data dir."""
    return cluster_config.read_client_key(Path(data_dir) / cluster_config.CLIENT_KEY_FILE)


# --- processes ---------------------------------------------------------------------------------


def node_pid(node: NodeConfig) -> int | None:
    """The pid of the running node process for `node`, or None (stale pid files are ignored;
    a node whose pid file is gone is found by the lock it holds on its dir)."""
    try:
        pid: int | None = int((node.data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and _is_node_process(pid, node.id):
        return pid
    holder = nodelock.lock_holder(node.data_dir)
    return holder if holder and _is_node_process(holder, node.id) else None


def _is_node_process(pid: int, node_id: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False  # a zombie is dead, only not yet reaped
    return b"node" in cmdline and node_id.encode() in cmdline


def running_nodes(config: ClusterConfig) -> dict[str, int]:
    """Node id -> pid of every node of `config` that is running."""
    pids = {node.id: node_pid(node) for node in config.nodes}
    return {node_id: pid for node_id, pid in pids.items() if pid is not None}


def spawn_node(
    data_dir: Path, node_id: str, max_machine_version: int | None = None
) -> subprocess.Popen[bytes]:
    """Start one node in the background (its own session; output in its node dir)."""
    config = cluster_config.load(data_dir)
    node = config.node(node_id)
    if (pid := node_pid(node) or nodelock.lock_holder(node.data_dir)) is not None:
        raise LaunchRefused(f"node {node_id} is already running (pid {pid})")
    cluster_tls.ensure_certificates(data_dir, config)  # a new member's pair; a clear error
    node.data_dir.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "cluster.cli",
        "node",
        "start",
        "--data-dir",
        str(Path(data_dir).resolve()),
        "--node-id",
        node_id,
    ]
    if max_machine_version is not None:
        args += ["--max-machine-version", str(max_machine_version)]
    with (
        _private_log(node.data_dir / "stdout.log") as out,
        _private_log(node.data_dir / "stderr.log") as err,
    ):
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            cwd=node.data_dir,
        )
    # atomically (the node rewrites it at start): a reader never sees a truncated file
    pid_tmp = node.data_dir / f"{PID_FILE}.launcher.tmp"
    pid_tmp.write_text(f"{process.pid}\n")
    os.replace(pid_tmp, node.data_dir / PID_FILE)
    return process


def _private_log(path: Path) -> IO[bytes]:
    """A node's log file opened for appending, readable by its owner only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def set_node_cap(data_dir: Path, node_id: str, max_machine_version: int | None) -> None:
    """Record a node's `max_machine_version` in `cluster.toml` (so later starts keep it)."""
    config = cluster_config.load(data_dir)
    nodes = tuple(
        dataclasses.replace(node, max_machine_version=max_machine_version)
        if node.id == node_id
        else node
        for node in config.nodes
    )
    cluster_config.write(data_dir, dataclasses.replace(config, nodes=nodes))


def stop_node(node: NodeConfig, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM the node, SIGKILL it after `grace_s`; False if it was not running."""
    pid = node_pid(node)
    if pid is None:
        return False
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _is_node_process(pid, node.id):
            return True
        time.sleep(0.05)
    _signal(pid, signal.SIGKILL)
    while _is_node_process(pid, node.id) and time.monotonic() < deadline + 5.0:
        time.sleep(0.05)
    return True


def kill_node(node: NodeConfig, sig: int = signal.SIGKILL) -> int | None:
    """Send `sig` (default SIGKILL) to the node; returns its pid, or None if it was not running."""
    pid = node_pid(node)
    if pid is not None:
        _signal(pid, sig)
    return pid


def _signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


# --- status --------------------------------------------------------------------------------


# a status with a forced digest encodes the whole state (about 2 us per message held)
DIGEST_TIMEOUT_S = 120.0


def node_status(
    node: NodeConfig,
    key: bytes,
    timeout_s: float = 2.0,
    tls: TlsOption = None,
    digest: bool = False,
) -> dict[str, Any] | None:
    """The status map of one node, or None if it cannot be reached (`tls` as for `Client`;
    a TLS mismatch raises TlsError: the node is there, the setting is wrong; `digest` as for
    `Client.status`: it may take a while, the answer is waited for DIGEST_TIMEOUT_S)."""
    try:
        with Client(
            [node.client_address],
            key,
            reconnect=False,
            prefer_leader=False,
            connect_timeout_s=timeout_s,
            connect_retry_s=0.0,
            request_timeout_s=timeout_s,
            name="quorumq-status",
            tls=tls,
        ) as client:
            status = client.status(digest, DIGEST_TIMEOUT_S if digest else None)
    except (Unavailable, OSError):
        return None
    return dict(status) if isinstance(status, dict) else None


def cluster_status(
    config: ClusterConfig,
    key: bytes,
    timeout_s: float = 2.0,
    tls: TlsOption = None,
    digest: bool = False,
) -> list[dict[str, Any]]:
    """One row per node; unreachable nodes are `role: down` (with the pid if one is running)."""
    rows: list[dict[str, Any]] = []
    tls = client_context(tls)  # (the CA file read once)
    for node in config.nodes:
        status = node_status(node, key, timeout_s, tls, digest)
        if status is None:
            status = {
                "id": node.id,
                "address": node.client_address,
                "role": "down",
                "pid": node_pid(node),
            }
        status.setdefault("id", node.id)
        status.setdefault("address", node.client_address)
        rows.append(status)
    return rows


def wait_for_leader(
    config: ClusterConfig,
    key: bytes,
    timeout_s: float = LEADER_TIMEOUT_S,
    exclude: str | None = None,
    tls: TlsOption = None,
) -> str:
    """Wait until a majority of reachable nodes agree on a leader; returns its id."""
    deadline = time.monotonic() + timeout_s
    majority = len(config.nodes) // 2 + 1
    tls = client_context(tls)
    while True:
        votes: dict[str, int] = {}
        for node in config.nodes:
            status = node_status(node, key, timeout_s=1.0, tls=tls)
            leader = status.get("leader") if status else None
            if isinstance(leader, str) and leader != exclude:
                votes[leader] = votes.get(leader, 0) + 1
        for leader, count in votes.items():
            if count >= majority:
                return leader
        if time.monotonic() >= deadline:
            raise NoLeader(
                f"no leader elected within {timeout_s:.0f}s (see the node.log and stderr.log "
                f"files in the node dirs of {config.nodes[0].data_dir.parent})"
            )
        time.sleep(0.1)


# --- whole clusters -------------------------------------------------------------------------


def start_cluster(
    data_dir: Path,
    nodes: int = 3,
    *,
    base_port: int | None = None,
    max_machine_version: int | None = None,
    fsync: FsyncPolicy | None = None,
    caps: dict[str, int] | None = None,
    timeout_s: float = LEADER_TIMEOUT_S,
    metrics_base_port: int | None = None,
    wait_leader: bool = True,
    tls: bool = False,
    http_base_port: int | None = None,
) -> LocalCluster:
    """Create (or reuse) a cluster in `data_dir`, start every node that is not running, wait
    until each of them answers and (unless `wait_leader` is False) until every answering node
    agrees on one leader. `LocalCluster.started` lists the nodes this call started.

    A node that exits at start, or does not answer within `timeout_s`, raises NoLeader naming
    it with the end of its stderr.log; the nodes this call started are stopped again (those
    that were running are left alone). A cluster whose every node runs is refused.

    `tls` makes a new cluster's peer traffic mutual TLS (`tls = true` in cluster.toml); the
    CA and node certificates are created in `D/tls` on the first start of such a cluster and
    checked (never replaced) on every later one."""
    data_dir = data_dir.resolve()
    config, running = _config_to_start(
        data_dir,
        nodes,
        tls,
        lambda: init_cluster(
            data_dir,
            nodes,
            base_port=base_port,
            max_machine_version=max_machine_version,
            fsync=fsync or "batch",
            metrics_base_port=metrics_base_port,
            caps=caps,
            tls=tls,
            http_base_port=http_base_port,
        ),
    )
    cluster_tls.ensure_certificates(data_dir, config)  # before any node: a clear error first
    if max_machine_version is not None:  # a restart with a new cap keeps it for later starts
        for node in config.nodes:
            set_node_cap(data_dir, node.id, max_machine_version)
    cluster = LocalCluster(data_dir, config)
    down = [node for node in config.nodes if node.id not in running]
    try:
        stderr_from = {node.id: file_size(node.data_dir / "stderr.log") for node in down}
        for node in down:
            cluster.start_node(node.id, max_machine_version)
        wait_answering(cluster, stderr_from, timeout_s)
        if wait_leader:
            _wait_ready(cluster, timeout_s)
    except BaseException:
        for node in down:
            stop_node(node, grace_s=2.0)
            cluster.reap(node.id, wait_s=5.0)
        raise
    return cluster


def _wait_ready(cluster: LocalCluster, timeout_s: float) -> None:
    """Wait until every answering node agrees on one leader and serves reads."""
    wait_for_leader(cluster.config, cluster.key, timeout_s, tls=cluster.tls)
    cluster.leader(timeout_s=timeout_s)
    cluster.serving(timeout_s=timeout_s)


def _config_to_start(
    data_dir: Path, nodes: int, tls: bool, create: Callable[[], ClusterConfig]
) -> tuple[ClusterConfig, dict[str, int]]:
    """The config of the cluster to start (`create` makes a new one) and its running nodes;
    LaunchRefused for a cluster already running whole, or a TLS switch it cannot make."""
    if not (data_dir / cluster_config.CONFIG_FILE).exists():
        if data_dir.exists() and any(data_dir.iterdir()):
            raise DataDirTaken(
                f"{data_dir} is not empty and holds no cluster.toml; pick another dir"
            )
        return create(), {}
    config = cluster_config.load(data_dir)
    running = running_nodes(config)
    if len(running) == len(config.nodes):
        raise LaunchRefused(
            f"{data_dir} holds a running cluster (pids {sorted(running.values())}): every node "
            f"is running, nothing to start; to restart it: quorumq cluster stop --data-dir "
            f"{data_dir}, then start it again (one node: quorumq node restart ID)"
        )
    if tls and not config.tls:
        raise LaunchRefused(
            f"{data_dir} holds a cluster without TLS; to turn it on, stop it, set "
            f"tls = true in the [cluster] table of {data_dir / cluster_config.CONFIG_FILE} "
            "and start it again (every node must restart: a TLS node refuses plain peers)"
        )
    return config, running


# how much of a failed node's stderr.log `cluster start` quotes
STDERR_TAIL_LINES = 12
STDERR_TAIL_BYTES = 4096


def wait_answering(cluster: LocalCluster, stderr_from: dict[str, int], timeout_s: float) -> None:
    """Wait until every node of `stderr_from` (node id -> the size of its stderr.log before it
    was started) answers a status query; NoLeader naming the first that exits or stays silent
    for `timeout_s`, with what it wrote to stderr since it was started."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(stderr_from)
    while waiting:
        for node_id in list(waiting):
            node = cluster.config.node(node_id)
            if node_status(node, cluster.key, timeout_s=1.0, tls=cluster.tls) is not None:
                del waiting[node_id]
                continue
            proc = cluster.procs.get(node_id)
            code = proc.poll() if proc is not None else None
            if code is not None or (proc is None and node_pid(node) is None):
                tail = stderr_tail(node, waiting[node_id])
                raise NoLeader(f"node {node_id} exited at start (exit code {code}){tail}")
        if waiting and time.monotonic() >= deadline:
            node_id = sorted(waiting)[0]
            tail = stderr_tail(cluster.config.node(node_id), waiting[node_id])
            raise NoLeader(f"node {node_id} did not answer within {timeout_s:.0f}s{tail}")
        if waiting:
            time.sleep(0.1)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def stderr_tail(node: NodeConfig, offset: int) -> str:
    """': <the last lines it wrote to stderr.log since `offset>' (or where to look)."""
    path = node.data_dir / "stderr.log"
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, file_size(path) - STDERR_TAIL_BYTES))
            text = f.read(STDERR_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        text = ""
    lines = [line for line in text.splitlines() if line.strip()][-STDERR_TAIL_LINES:]
    if not lines:
        return f" (nothing on its stderr; see {node.data_dir / 'node.log'})"
    quoted = "\n  ".join(lines)
    return f"; the end of {path}:\n  {quoted}"


def stop_cluster(config: ClusterConfig, grace_s: float = STOP_GRACE_S) -> list[str]:
    """Stop every running node (SIGTERM, then SIGKILL after `grace_s`); returns those stopped."""
    running = running_nodes(config)
    for node in config.nodes:
        if node.id in running:
            _signal(running[node.id], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and running_nodes(config):
        time.sleep(0.05)
    for node in config.nodes:
        if node_pid(node) is not None:
            stop_node(node, grace_s=0.0)
    return sorted(running)


@contextmanager
def local_cluster(data_dir: Path, nodes: int = 3, **kwargs: Any) -> Iterator[LocalCluster]:
    """A started cluster for the duration of a `with` block; every node is stopped after, also
    when the program is stopped with SIGTERM (`_sigterm_exits`)."""
    with _sigterm_exits():
        cluster = start_cluster(data_dir, nodes, **kwargs)
        try:
            yield cluster
        finally:
            cluster.stop()


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While it holds, SIGTERM raises SystemExit(143) in the main thread, unless the program
    handles SIGTERM itself: with the default action a benchmark stopped with `kill` died at once
    and left its nodes running, holding their ports."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def exit_on_sigterm(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def wait_until(predicate: Callable[[], T | None], timeout_s: float = 10.0, what: str = "") -> T:
    """Poll `predicate` until it returns a truthy value (returned); AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.05)


class LocalCluster:
    """The nodes of a local data dir: start, stop, kill and restart them, connect clients
    (the library `Client` or the protocol-level `RawClient`), ask who leads, wait for
    convergence. Keeps the process handle of every node it starts, so none is left a zombie."""

    def __init__(self, data_dir: Path, config: ClusterConfig | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.config = config if config is not None else cluster_config.load(self.data_dir)
        self.key = client_key(self.data_dir)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[str] = []  # the nodes this object started, in order
        self._tls: ssl.SSLContext | None = None

    @property
    def tls(self) -> ssl.SSLContext | None:
        """The client TLS context of a `tls = true` cluster (trusting D/tls/ca.crt), else None;
        every client this object makes uses it."""
        if self._tls is None and self.config.tls:
            self._tls = client_context(data_dir_ca(self.data_dir, True))
        return self._tls

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reload(self) -> ClusterConfig:
        """Read cluster.toml again (after `member add` / `member remove` rewrote it)."""
        self.config = cluster_config.load(self.data_dir)
        return self.config

    # --- processes ---------------------------------------------------------------------------

    def start_node(self, node_id: str, max_machine_version: int | None = None) -> None:
        """Start one node in the background (returns at once; see `restart` to wait)."""
        self.reap(node_id)
        self.procs[node_id] = spawn_node(self.data_dir, node_id, max_machine_version)
        self.started.append(node_id)

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> int | None:
        """Send `sig` to a node (SIGKILL by default: then wait until it is gone); its pid."""
        node = self.config.node(node_id)
        pid = kill_node(node, sig)
        deadline = time.monotonic() + 10.0
        while sig == signal.SIGKILL and node_pid(node) is not None:
            if time.monotonic() > deadline:
                raise LauncherError(f"{node_id} (pid {pid}) survived SIGKILL")
            time.sleep(0.02)
        if sig == signal.SIGKILL:
            self.reap(node_id, wait_s=5.0)
        return pid

    def terminate(self, node_id: str) -> int | None:
        """SIGTERM a node and wait for it; its exit code (None if this object did not start it)."""
        proc = self.procs.pop(node_id, None)
        if proc is None:
            stop_node(self.config.node(node_id), grace_s=15.0)
            return None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)

    def restart(self, node_id: str, max_machine_version: int | None = None) -> None:
        """Stop (if running) and start a node, then wait until it answers."""
        node = self.config.node(node_id)
        stop_node(node, grace_s=2.0)
        self.start_node(node_id, max_machine_version)
        deadline = time.monotonic() + LEADER_TIMEOUT_S
        while node_status(node, self.key, timeout_s=1.0, tls=self.tls) is None:
            if time.monotonic() > deadline:
                raise NoLeader(f"{node_id} did not answer after its restart")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after a grace period)."""
        stop_cluster(self.config, grace_s=2.0)
        for node_id in list(self.procs):
            self.reap(node_id, wait_s=5.0)

    def reap(self, node_id: str, wait_s: float = 0.0) -> None:
        """Collect the exit status of a node this object started, once it has exited (waiting
        up to `wait_s`): a killed node must not linger as a zombie."""
        proc = self.procs.get(node_id)
        if proc is None:
            return
        with suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s) if wait_s > 0 else proc.poll()
        if proc.returncode is not None:
            del self.procs[node_id]

    # --- clients -----------------------------------------------------------------------------

    def endpoint(self, node_id: str) -> str:
        """The client endpoint of a node."""
        return self.config.node(node_id).client_address

    def client(self, node_id: str | None = None, *, only: bool = False, **kwargs: Any) -> Client:
        """A library client that connects to `node_id` first (`only`: to it alone, no
        reconnect); over TLS on a `tls = true` cluster."""
        endpoints = list(self.config.endpoints().values())
        if node_id is not None:
            kwargs.setdefault("prefer_leader", False)  # the caller chose this node
            first = self.endpoint(node_id)
            endpoints = [first] if only else [first] + [e for e in endpoints if e != first]
        if only:
            kwargs.setdefault("reconnect", False)
        kwargs.setdefault("tls", self.tls)
        return Client(endpoints, self.key, **kwargs)

    def raw_client(self, node_id: str, name: str = "test") -> RawClient:
        """A protocol-level RawClient connected to `node_id` (retries while the node starts)."""
        address = self.endpoint(node_id)
        return wait_until(lambda: _try_raw(address, self.key, name, tls=self.tls), 10, address)

    # --- status ------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """`cluster status` rows."""
        return cluster_status(self.config, self.key, tls=self.tls)

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        """Each node's status map, or None for a node that does not answer."""
        out: dict[str, dict[str, Any] | None] = {}
        for node in self.config.nodes:
            client = _try_raw(node.client_address, self.key, "status", timeout_s=2, tls=self.tls)
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

    def leader(self, exclude: str | None = None, timeout_s: float = LEADER_TIMEOUT_S) -> str:
        """The one leader (other than `exclude`) that every answering node agrees on."""

        def agreed() -> str | None:
            statuses = [s for s in self.statuses().values() if s is not None]
            leaders = {s["id"] for s in statuses if s["role"] == "leader"}
            if len(leaders) == 1 and all(s["leader"] in leaders for s in statuses):
                leader = str(leaders.pop())
                return leader if leader != exclude else None
            return None

        try:
            return wait_until(agreed, timeout_s, "an agreed leader")
        except AssertionError as err:
            raise NoLeader(str(err)) from err

    def serving(self, timeout_s: float = LEADER_TIMEOUT_S) -> None:
        """Wait until every answering node serves reads (status `read_refusal` null): a
        follower does about a second after it first hears a new leader (raft/contact.py)."""

        def all_serve() -> bool:
            statuses = [s for s in self.statuses().values() if s is not None]
            return bool(statuses) and all(s.get("read_refusal") is None for s in statuses)

        wait_until(all_serve, timeout_s, "every node serving reads")

    def followers(self) -> list[str]:
        """Every node id but the leader's."""
        leader = self.leader()
        return [node_id for node_id in self.config.node_ids() if node_id != leader]

    def converged(self, timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
        """Wait until every node answers with the same last_applied and digest, follows the
        same leader and serves reads (equal digests alone hold right after a restart, before an
        election: a read then is refused `unavailable`)."""

        def same() -> dict[str, dict[str, Any]] | None:
            statuses = self.statuses()
            answered = {n: s for n, s in statuses.items() if s is not None}
            if len(answered) < len(statuses):
                return None
            pairs = {(s["last_applied"], s["digest"]) for s in answered.values()}
            leaders = {s["leader"] for s in answered.values()}
            serving = all(s.get("read_refusal") is None for s in answered.values())
            agreed = len(leaders) == 1 and None not in leaders
            return answered if len(pairs) == 1 and agreed and serving else None

        return wait_until(same, timeout_s, "equal digests")


def _try_raw(
    address: str, key: bytes, name: str, timeout_s: float = 5, tls: TlsOption = None
) -> RawClient | None:
    try:
        return RawClient(address, key, name, timeout_s, tls)
    except (OSError, ProtocolError):
        return None
