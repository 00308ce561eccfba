"""The node process: a RaftNode, the asyncio client server, effect routing and leader timers.

`run_node(data_dir, node_id, max_machine_version)` is what `quorumq node start` calls; it writes
`<node dir>/node.pid`, logs to `<node dir>/node.log`, and exits 0 after SIGTERM (journal flushed).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import signal
import ssl
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

import fifo
from cluster import config, nodelock, protocol
from cluster.amqp.listener import AmqpListener
from cluster.config import UNRELEASED_FLAG as UNRELEASED_FLAG  # re-exported: tests, benches
from cluster.config import ClusterConfig, NodeConfig
from cluster.errors import ConfigError
from cluster.node.client_tls import TlsClientListener
from cluster.node.deadletters import DropReporter
from cluster.node.effects import EffectRouter
from cluster.node.limits import (
    ConnectionCaps,
    RefusalLog,
    effective_connections_max,
    raise_open_files_limit,
    source_address,
)
from cluster.node.listening import log_sockets, log_when_listening
from cluster.node.logs import setup_logging
from cluster.node.memory import LoopStalls, MemoryMonitor, one_malloc_arena, total_memory_bytes
from cluster.node.metrics import MetricsUnavailable, NodeMetrics, NoMetrics
from cluster.node.pacing import Repeating
from cluster.node.session import ClientSession, SessionFlusher
from cluster.node.timers import LeaderTimers
from cluster.nodelock import NodeDirLocked
from cluster.tls import PeerContexts, node_client_port_context, node_peer_contexts
from fifo.commands import ConnectionDown, ConnectionId
from fifo.replies import Error
from raft import storage
from raft.errors import StorageError, SubmitError
from raft.node import RaftSettings
from raft.replica import Applied, Replica, ReplicaView, Reply
from raft.replicated import Outcome

if TYPE_CHECKING:
    from cluster.management import ManagementServer

log = structlog.get_logger("cluster.node")

EX_OK = 0
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_DATAERR = 65  # a damaged journal, meta or snapshot: `quorumq node recover` rebuilds it
EX_SOFTWARE = 70
EX_CONFIG = 78
# the periodic pass (memory, leader timers, sweeps, status): on an idle leader's heartbeat tick
# (raft's `tick_period_ms`, 200 ms), so that an idle node wakes once a round, not twice
TIMER_PERIOD_S = 0.2
STATUS_PERIOD_S = 2.0
RAFT_BIND_TIMEOUT_S = 10.0
GIL_SWITCH_INTERVAL_S = 0.001
# the cyclic garbage collector: its youngest generation is collected after this many net
# container allocations (Python's default: 700). A node allocates a few per command and its
# state is nearly free of cycles (refcounting frees it), so at the default most collections
# find nothing and, with a backlog, each one of the older generations walks the whole queue.
GC_GEN0_THRESHOLD = 20_000
CONNECTION_DOWN_RESUBMIT_S = 2.0
# a node with no reachable leader for this long "knows" there is none: it answers commands and
# data queries with `unavailable` at once instead of holding them (an election takes less)
LEADERLESS_REFUSE_AFTER_S = 2.0
REFUSAL_WRITE_TIMEOUT_S = 1.0  # to hand a refused connection its reason
NO_LEADER = "no leader/quorum"  # starts every such message (clients and operators grep for it)


class NodeServer:
    """Everything one node runs, wired together on one asyncio loop."""

    _status_written = ""  # status.json's last text: an unchanged one is not rewritten
    frame_bytes_max = protocol.FRAME_BYTES_MAX_DEFAULT

    def __init__(
        self,
        cluster: ClusterConfig,
        node: NodeConfig,
        secret: bytes,
        supported: int,
        incarnation: int,
        node_dir: Path,
        metrics_port: int | None = None,
        metrics_bind: str = "127.0.0.1",
        peer_tls: PeerContexts | None = None,
        client_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.cluster = cluster
        self.client_tls = client_tls  # the client port's server context (tls = true)
        self.node = node
        self.node_id = node.id
        self.node_dir = node_dir
        self.client_key = config.client_key(secret)
        self.endpoints = cluster.endpoints()
        self.incarnation = incarnation
        self.router = EffectRouter(node.id, incarnation)
        self.stopping = False
        self.refused_reason: str | None = None
        self._numbers = itertools.count(1)
        self._down_submitted: dict[int, float] = {}  # connection number -> last submit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: set[ClientSession] = set()
        self.flusher = SessionFlusher()
        self.open_files = raise_open_files_limit()  # (soft, hard) RLIMIT_NOFILE
        self.refusals = RefusalLog()  # of unauthenticated or over-the-cap clients
        self.connection_caps = ConnectionCaps(
            effective_connections_max(cluster.connections_max, self.open_files[0]),
            cluster.connections_per_source_max,
            self.refusals,
        )
        self.memory = MemoryMonitor(
            node.id,
            config.memory_watermark_bytes(cluster.memory_high_watermark, total_memory_bytes()),
        )
        self.loop_stalls = LoopStalls()
        self.amqp: AmqpListener | None = None
        if node.amqp_port is not None:
            self.amqp = AmqpListener(self, node.amqp_port, cluster.amqp_guest)
        self._leaderless_since: float | None = time.monotonic()  # None while a leader is reachable
        self.exit_code = EX_OK
        self.settings = RaftSettings(
            node_id=node.id,
            address=node.raft_address,
            peers={n.id: n.raft_address for n in cluster.nodes if n.id != node.id},
            data_dir=node_dir,
            password=secret.decode("ascii"),
            supported_version=supported,
            incarnation=incarnation,
            fsync=cluster.fsync,
            bind_host=cluster.bind,
            peer_dial={peer: dial for peer, dial in node.peer_addresses.items() if peer != node.id},
            compaction_min_entries=cluster.snapshot_every_entries,
            compaction_min_time_s=cluster.snapshot_every_s,
            founders=tuple(cluster.founder_ids()),
            tls_server_context=peer_tls.server if peer_tls else None,
            tls_client_context=peer_tls.client if peer_tls else None,
        )
        self.replica: Replica
        self.timers: LeaderTimers
        self.metrics: NoMetrics = NoMetrics()
        self.drops = DropReporter(lambda: self.replica)
        self.management: ManagementServer | None = None  # set by run_node (http_port)
        if metrics_port is not None or node.http_port is not None:  # the API shows the counters
            self.metrics = NodeMetrics(
                node.id,
                lambda: self.replica,
                lambda: len(self._sessions),
                metrics_port,
                metrics_bind,
                self.status_extra,
            )

    def new_connection(self) -> ConnectionId:
        """A fresh connection id owned by this node incarnation."""
        return ConnectionId(self.node_id, self.incarnation, next(self._numbers))

    def client_connections(self) -> list[dict[str, Any]]:
        """The client connections this node serves now: connection id and peer address."""
        return [
            {
                "connection": f"{c.node}/{c.incarnation}/{c.number}",
                "peer": str(session.writer.get_extra_info("peername")),
            }
            for session in list(self._sessions)
            if (c := session.connection) is not None
        ]

    def status_extra(self) -> dict[str, Any]:
        """Fields of the status map that the raft node does not know."""
        extra: dict[str, Any] = {
            "id": self.node_id,
            "address": self.node.client_address,
            "raft_address": self.node.raft_address,
            "incarnation": self.incarnation,
            "fsync": self.cluster.fsync,
            **self.memory.status(),
            **self.loop_stalls.status(),
            "read_refusal": self.unavailable_reason(for_read=True),
        }
        if self.refused_reason is not None:
            extra["reason"] = self.refused_reason
        return extra

    # --- availability: can this node vouch for its state? -----------------------------------

    def _leader_problem(self) -> str | None:
        """Why this node cannot count on a leader right now (None when it can): it has none,
        lost its connection to it, or leads without a majority connected (pysyncobj steps such a
        leader down only after its fallback timeout)."""
        if self.replica.stopped_reason is not None:
            return "this node stopped applying"
        leader = self.replica.leader_id()
        if leader is None:
            return "an election is under way or this node is cut off from the majority"
        if leader == self.node_id:
            if not self.replica.has_quorum():
                return "this leader is connected to fewer than a majority of the cluster"
        elif not self.replica.peer_connected(leader):
            return f"this node lost its connection to the leader {leader}"
        return None

    def _track_leader(self) -> None:
        """Loop thread, every timer period: note since when no leader has been reachable."""
        if self._leader_problem() is None:
            self._leaderless_since = None
        elif self._leaderless_since is None:
            self._leaderless_since = time.monotonic()

    def unavailable_reason(self, for_read: bool) -> str | None:
        """Why this node refuses a command (`for_read` False) or a data query now, or None.

        Commands: only once no leader was reachable for LEADERLESS_REFUSE_AFTER_S (before that
        pysyncobj holds them until an election ends). Reads: whenever what this node applied is
        not known current (`applied_state_current`, the rule that also holds its deliveries,
        raft/contact.py): just started, cut off, back from a pause or a partition and still
        catching up. Before (issue 26), a restarted or rejoined node answered from a state
        seconds behind what the majority had confirmed. (The simulator's node shell runs this
        method on itself: what it uses must be attributes the shell has too.)"""
        if for_read:
            if self.replica.applied_state_current():
                return None
            problem = self._leader_problem() or (
                "it is catching up with the leader (not yet heard steadily and applied)"
            )
        else:
            since = self._leaderless_since
            if since is None or time.monotonic() - since < LEADERLESS_REFUSE_AFTER_S:
                return None
            leader_problem = self._leader_problem()
            if leader_problem is None:
                return None
            problem = leader_problem
        stopped = self.replica.stopped_reason
        if stopped is not None:  # older code than the log needs: it will not catch up
            return f"{self.node_id} stopped applying the log: {stopped}"
        return f"{NO_LEADER} on {self.node_id}: {problem}"

    # --- what the replica hands over (loop thread) ------------------------------------------

    def _reset_sessions(self, index: int) -> None:
        """Close every client session: what they were sent no longer matches the state (deliveries
        the snapshot skipped were never sent; entries applied again would send duplicates). Each
        close becomes a ConnectionDown, so their checked-out messages come back, and the clients
        reconnect and attach again: at-least-once, nothing stuck. A session still in its
        handshake was sent nothing yet: it stays (closed, its client took it for an AuthError)."""
        if self.amqp is not None:
            self.amqp.close_all()
        served = [session for session in self._sessions if session.connection is not None]
        if not served:
            return
        log.warning("sessions_reset_after_snapshot", index=index, sessions=len(served))
        for session in served:
            session.close()

    def _observe_outcome(self, outcome: Outcome, mine: bool) -> None:
        """Every applied entry, on every node (inside the tick): counters and drop reports."""
        self.metrics.on_outcome(outcome, mine)
        self.drops.observe(outcome, mine)

    def _on_applied(self, applied: Applied) -> None:
        self.router.dispatch(applied.effects)
        self.flusher.now()  # the entry's replies and effects leave inside its tick (issue 29)

    # --- lifecycle ---------------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        """Start raft and the client server; run until `stop` is set; shut down cleanly."""
        self._loop = asyncio.get_running_loop()
        self.replica = Replica(
            self.settings, self._loop, self._on_applied, self._reset_sessions, self._observe_outcome
        )
        self.router.use_replica(self.replica)  # deliveries only from current state (issue 24)
        self.timers = LeaderTimers(self.replica)
        try:
            server = await self._listen()
            if self.amqp is not None:
                await self.amqp.start(self.cluster.bind)
            self.metrics.start()
            if self.management is not None:
                await self.management.start()
        except (OSError, MetricsUnavailable):
            self.replica.destroy()
            raise
        log.info(
            "node_started",
            client=self.node.client_address,
            client_tls=self.client_tls is not None,
            raft=self.node.raft_address,
            incarnation=self.incarnation,
            supported=self.settings.supported_version,
            open_files=self.open_files[0],
            connections_max=self.connection_caps.total_max,
        )
        peer_tls = self.settings.tls_server_context is not None
        tasks = [
            asyncio.create_task(
                log_when_listening("peer", self.cluster.bind, self.node.raft_port, peer_tls)
            ),
            asyncio.create_task(self._hello()),
        ]
        periodic = self._start_periodic(stop)
        await stop.wait()
        self.stopping = True
        log.info("node_stopping")
        server.close()
        if self.management is not None:
            await self.management.stop()
        if self.amqp is not None:
            self.amqp.stop()
        periodic.cancel()
        for task in tasks:
            task.cancel()
        for session in list(self._sessions):
            session.close()
        for _ in range(50):  # let the session tasks see EOF and finish before the loop closes
            if not self._sessions:
                break
            await asyncio.sleep(0.01)
        self.replica.fail_pending(SubmitError("unavailable", "the node is shutting down"))
        await asyncio.sleep(0)
        self.replica.destroy()
        self.metrics.stop()
        log.info("node_stopped")

    async def _listen(self) -> asyncio.Server | TlsClientListener:
        """Serve the client port: plaintext, or TLS when the cluster has `tls = true`."""
        if self.client_tls is None:
            server = await asyncio.start_server(
                self._on_client, host=self.cluster.bind, port=self.node.client_port
            )
            log_sockets("client", server.sockets, tls=False)
            return server
        listener = TlsClientListener(
            self.client_tls, self.node_id, self.node.client_address, self._on_client
        )
        await listener.start(self.cluster.bind, self.node.client_port)
        log_sockets("client", listener.sockets, tls=True)
        return listener

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        source = source_address(writer)
        refused = self.connection_caps.admit(source)
        if refused is not None:
            await self._refuse_connection(writer, refused)
            return
        session = ClientSession(self, reader, writer)
        self._sessions.add(session)
        try:
            await session.run()
        finally:
            self._sessions.discard(session)
            self.connection_caps.release(source)

    async def _refuse_connection(self, writer: asyncio.StreamWriter, reason: str) -> None:
        """Tell a connection past a cap why (instead of the challenge) and close it."""
        text = f"{self.node_id} refuses new client connections: {reason}; try another node"
        writer.write(protocol.encode_frame(protocol.error(protocol.CONNECTION_LIMIT, text)))
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.drain(), REFUSAL_WRITE_TIMEOUT_S)
        writer.close()

    def _start_periodic(self, stop: asyncio.Event) -> Repeating:
        """The periodic pass, about every TIMER_PERIOD_S on the raft ticker's wake-up when near
        (cluster.node.pacing): a plain timer callback, no task to wake."""
        started = time.monotonic()
        last_status = [0.0]

        def one_pass() -> bool:
            return self._periodic_pass(stop, started, last_status)

        periodic = Repeating(
            asyncio.get_running_loop(), TIMER_PERIOD_S, self.replica.raft_timer_at, one_pass,
            self.loop_stalls.note,
        )  # fmt: skip
        periodic.start()
        return periodic

    def _periodic_pass(self, stop: asyncio.Event, started: float, last_status: list[float]) -> bool:
        """One pass (memory, storage damage, bind timeout, leader timers, sweeps, status);
        False when the node must stop (`stop` set, the exit code chosen)."""
        self.memory.sample()
        damage = self.replica.storage_damage()
        if damage is not None:
            # raft stopped on it; the node exits as a damaged start does (65), and the operator
            # rebuilds it from its peers
            log.error("storage_damaged", file=damage.path, offset=damage.offset, error=str(damage))
            print(f"error: {damage}", file=sys.stderr, flush=True)
            self.exit_code = EX_DATAERR
            stop.set()
            return False
        if not self.replica.bound() and time.monotonic() - started > RAFT_BIND_TIMEOUT_S:
            log.error("raft_port_unavailable", raft=self.node.raft_address)
            self.exit_code = EX_UNAVAILABLE  # pysyncobj would retry the bind forever
            stop.set()
            return False
        try:
            self._track_leader()
            self.timers.tick()
            if self.replica.sweep():  # a drained node dropped its cached bodies
                self.memory.trim()
            self._reconcile_connections()
            self.router.reconcile()
            if time.monotonic() - last_status[0] > STATUS_PERIOD_S:
                last_status[0] = time.monotonic()
                self._write_status()
        except Exception:
            log.exception("periodic_failed")
        return True

    def _reconcile_connections(self) -> None:
        """Close, through the log, every connection of this incarnation that the replicated
        state still lists but no session serves any more.

        A closed session submits its ConnectionDown at once, but that submit can fail (no
        leader, a partition) and a session can close before its first command is applied; the
        consumers of such a connection would keep their checked-out messages for ever (until
        this node restarts). Retried every `CONNECTION_DOWN_RESUBMIT_S` until applied."""
        if self.stopping:
            return  # a stopping node leaves its connections to the next incarnation's hello
        listed = self.replica.read(partial(ReplicaView.connections_of, node=self.node_id))
        dead = [
            number
            for incarnation, number in listed
            if incarnation == self.incarnation and not self.router.is_live(number)
        ]
        now = time.monotonic()
        for number in dead:
            if now - self._down_submitted.get(number, -1e9) < CONNECTION_DOWN_RESUBMIT_S:
                continue
            self._down_submitted[number] = now
            down = ConnectionDown(ConnectionId(self.node_id, self.incarnation, number), "normal")
            log.info("connection_down_reconciled", connection=number)
            self.replica.propose(down, _ignore)
        for number in [n for n in self._down_submitted if n not in dead]:
            del self._down_submitted[number]

    def _write_status(self) -> None:
        status = {
            **self.status_extra(),
            **self.replica.status(with_digest=False),
            "pid": os.getpid(),
        }
        text = json.dumps(status, default=str) + "\n"
        if text == self._status_written:
            return  # an idle node: no file created, written and renamed every 2 s for nothing
        tmp = self.node_dir / "status.json.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.node_dir / "status.json")
        self._status_written = text

    async def _hello(self) -> None:
        """Record, through the log, the machine version this node's code supports. A node
        whose code is older than the log needs sends it too (once: it stops applying, so it
        never sees the refusal applied): the leader records the refusal, operators see it in
        `machine`. Before, a node that stopped while replaying its own journal never said it."""
        while True:
            done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
            self.replica.propose_hello(partial(_settle, done))
            reply = await done
            if isinstance(reply, SubmitError):
                if self.replica.stopped_reason is not None:
                    return  # older code than the log needs: its reply cannot come back
                await asyncio.sleep(0.5)
                continue
            if isinstance(reply, Error):
                self.refused_reason = reply.message
                log.error("join_refused", reason=reply.message)
            else:
                log.info("hello_recorded", supported=self.settings.supported_version)
            return


def _settle(future: asyncio.Future[Reply], value: Reply) -> None:
    if not future.done():
        future.set_result(value)


def _ignore(_reply: Reply) -> None:
    """A ConnectionDown needs no reply: it is retried until the state no longer lists it."""


def next_incarnation(node_dir: Path) -> int:
    """Start time in ms, forced strictly above the previous incarnation (persisted, fsynced)."""
    path = node_dir / "incarnation"
    try:
        previous = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        previous = 0
    incarnation = max(int(time.time() * 1000), previous + 1)
    tmp = node_dir / "incarnation.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{incarnation}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return incarnation


def supported_version(cap: int | None) -> int:
    """The highest machine version this code supports, capped by `--max-machine-version`.

    An unreleased version (`fifo.UNRELEASED_VERSIONS`) is allowed as the cap only with the
    environment variable UNRELEASED_FLAG set to 1 (development; never the default)."""
    latest = max(fifo.SUPPORTED_VERSIONS)
    if cap is None:
        return int(latest)
    allowed = fifo.SUPPORTED_VERSIONS
    if os.environ.get(UNRELEASED_FLAG) == "1":
        allowed = (*allowed, *fifo.UNRELEASED_VERSIONS)
    if cap not in allowed:
        raise ConfigError(
            f"--max-machine-version {cap}: this code supports {fifo.SUPPORTED_VERSIONS} "
            f"(unreleased {fifo.UNRELEASED_VERSIONS} only with {UNRELEASED_FLAG}=1)"
        )
    return cap


def run_node(
    data_dir: Path,
    node_id: str,
    max_machine_version: int | None,
    metrics_port: int | None = None,
    metrics_bind: str | None = None,
) -> int:
    """Run one node in the foreground until SIGTERM/SIGINT; returns the process exit code.

    `metrics_port`/`metrics_bind` override the node's `metrics_port` and the cluster's
    `metrics_bind` in cluster.toml (metrics are off when neither names a port).
    """
    data_dir = Path(data_dir)
    try:
        cluster = config.load(data_dir)
        node = cluster.node(node_id)
        secret = config.read_secret(data_dir)
        peer_tls = node_peer_contexts(data_dir, cluster, node_id)
        client_tls = node_client_port_context(data_dir, cluster, node_id)
        cap = max_machine_version if max_machine_version is not None else node.max_machine_version
        supported = supported_version(cap)
        if metrics_port is not None and not 1 <= metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {metrics_port} is not a TCP port")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EX_CONFIG
    node_dir = node.data_dir if node.data_dir.is_absolute() else data_dir / node.data_dir
    lock_fd = _lock_node_dir(data_dir, node_id, node_dir)  # before anything is written
    if lock_fd is None:
        return EX_USAGE
    os.umask(0o077)  # journal, snapshot, meta and logs are for the node's owner only (0600)
    storage.private_dir(node_dir)
    setup_logging(
        node_dir / "node.log", node_id, cluster.log_file_bytes_max, cluster.log_files_kept
    )
    tune_threads()
    incarnation = next_incarnation(node_dir)
    pid_file = _write_pid_file(node_dir)
    try:
        server = NodeServer(
            cluster,
            node,
            secret,
            supported,
            incarnation,
            node_dir,
            metrics_port if metrics_port is not None else node.metrics_port,
            metrics_bind or cluster.metrics_bind,
            peer_tls,
            client_tls,
        )
        if node.http_port is not None:
            server.management = _management(server, data_dir)
    except MetricsUnavailable as err:
        pid_file.unlink(missing_ok=True)
        print(f"error: {err}", file=sys.stderr)
        return EX_CONFIG
    tune_gc()
    try:
        return _serve(server)
    finally:
        pid_file.unlink(missing_ok=True)
        os.close(lock_fd)  # (the kernel would drop it at exit anyway)


def _write_pid_file(node_dir: Path) -> Path:
    """Write node.pid atomically (the launcher may read it at any moment: a truncated file
    reads as "no node"); its path."""
    pid_file = node_dir / "node.pid"
    pid_tmp = node_dir / "node.pid.tmp"
    pid_tmp.write_text(f"{os.getpid()}\n", encoding="ascii")
    os.replace(pid_tmp, pid_file)
    return pid_file


def _serve(server: NodeServer) -> int:
    """Serve until SIGTERM/SIGINT; the exit code (a failure while serving is logged)."""
    try:
        asyncio.run(_serve_until_signal(server))
    except MetricsUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        log.error("node_failed", error=str(err))
        return EX_UNAVAILABLE
    except StorageError as err:
        log.error("storage_damaged", file=err.path, offset=err.offset, error=str(err))
        print(f"error: {err}", file=sys.stderr)
        return EX_DATAERR
    except OSError as err:
        log.error("node_failed", error=str(err))
        return EX_SOFTWARE
    return server.exit_code


def _lock_node_dir(data_dir: Path, node_id: str, node_dir: Path) -> int | None:
    """The node dir's lock (held for the process's life), or None after saying on stderr which
    process holds it: a second start must not touch a running node's files."""
    try:
        return nodelock.take(node_dir)
    except NodeDirLocked as err:
        print(
            f"error: node {node_id} is already running (pid {err.pid}); nothing was changed. "
            f"Stop it with: quorumq node stop {node_id} --data-dir {data_dir}",
            file=sys.stderr,
        )
        return None


def _management(server: NodeServer, data_dir: Path) -> ManagementServer:
    """The node's management API (`http_port`); MetricsUnavailable without its extra."""
    try:
        from cluster.management import ManagementServer
    except ImportError as err:
        raise MetricsUnavailable(
            f"http_port needs aiohttp: pip install 'quorumq[management]' ({err})"
        ) from err
    return ManagementServer(server, data_dir)


def tune_threads() -> None:
    """Before any thread starts: raft ticks on the loop thread, and the metrics thread (if any)
    must not hold the GIL 5 ms (the default switch interval) while the loop returns from an
    fsync or a poll; every thread allocates from one malloc arena (cluster.node.memory)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    one_malloc_arena()


def tune_gc() -> None:
    """Once the node is built (code loaded, journal replayed): move every object alive now
    out of the collector's sight (`gc.freeze`: freed by refcounting as before, only never
    walked again) and collect the youngest generation every GC_GEN0_THRESHOLD allocations.
    Cyclic garbage is still collected; it may wait longer (at most that many objects)."""
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


async def _serve_until_signal(server: NodeServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.serve(stop)
