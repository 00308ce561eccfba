"""What a RaftNode is built from: its settings, pysyncobj's configuration, peer nodes, transports.

`RaftSettings` is the node's whole configuration (cluster/node/server.py builds it from
cluster.toml); `syncobj_conf` turns it into pysyncobj's SyncObjConf (journal and CBOR dump always
together, our timeouts, no autoTick: the node's loop ticks it, raft/ticker.py).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pysyncobj import SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from raft.transport import QuorumTransport

APPEND_ENTRIES_BYTES_MAX = 64 * 1024 * 1024
SNAPSHOT_CHUNK_BYTES = 1024 * 1024
# the shortest election timeout is at least this many idle heartbeat periods (pysyncobj asks
# more than 3 of its heartbeat): a follower misses 3 in a row before it asks for votes
IDLE_HEARTBEAT_MARGIN = 4
# the peer transport: "quorumq" (raft/transport.py, the default) or "pysyncobj" (its pickle +
# zlib + Fernet transport, kept selectable only to measure against; every node must agree)
TRANSPORT_ENV = "QUORUMQ_RAFT_TRANSPORT"
TRANSPORTS = ("quorumq", "pysyncobj")


def transport_name() -> str:
    """The peer transport this process uses (TRANSPORT_ENV, default quorumq)."""
    name = os.environ.get(TRANSPORT_ENV, "") or "quorumq"
    if name not in TRANSPORTS:
        raise ValueError(f"{TRANSPORT_ENV} must be one of {TRANSPORTS}, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class RaftSettings:
    """Everything a RaftNode needs; addresses are pysyncobj `host:port` strings."""

    node_id: str
    address: str
    peers: dict[str, str]  # node id -> raft address, without this node
    data_dir: Path
    password: str
    supported_version: int
    incarnation: int
    fsync: str = "batch"
    bind_host: str = "127.0.0.1"
    # etcd's 1-2 s order: an idle leader heartbeats every 200 ms (below), four times within the
    # shortest; (400, 800) with 100 ms cost an idle 3-node leader 0.008 cores (issue 25)
    election_timeout_ms: tuple[int, int] = (800, 1600)
    heartbeat_ms: int = 50
    # an idle leader's heartbeat period (raft.appends: every follower holds every entry, all
    # committed), capped by `idle_heartbeat_s`: with the default election timeouts 4x below
    # the shortest (800 ms), which is also raft.contact's silence bound (`silence_s`)
    idle_heartbeat_ms: int = 200
    # a tick runs when the next heartbeat or election deadline falls due (`_next_timer_due`), and
    # at least this often for the other timers (connection retries, handshake deadlines, the
    # disk probe): an idle leader's heartbeat period, so that it wakes once a round
    tick_period_ms: int = 200
    compaction_min_entries: int = 5000
    compaction_min_time_s: int = 300
    peer_dial: dict[str, str] = field(default_factory=dict)  # node id -> address to dial
    # the members the cluster was created with (the replicated member set before any change;
    # empty: this node and its peers, which is the same for a cluster that never changed)
    founders: tuple[str, ...] = ()
    # mutual TLS on the peer connections (built by cluster/tls.py; None: plain TCP)
    tls_server_context: ssl.SSLContext | None = None
    tls_client_context: ssl.SSLContext | None = None

    @property
    def silence_s(self) -> float:
        """The longest silence after which a peer's contact starts over (raft.contact): the
        shortest election timeout."""
        return self.election_timeout_ms[0] / 1000

    @property
    def tick_period_s(self) -> float:
        """The longest time between two ticks."""
        return self.tick_period_ms / 1000

    @property
    def idle_heartbeat_s(self) -> float:
        """An idle leader's heartbeat period: `idle_heartbeat_ms`, at most the shortest election
        timeout / IDLE_HEARTBEAT_MARGIN, never below `heartbeat_ms`."""
        cap = self.election_timeout_ms[0] / IDLE_HEARTBEAT_MARGIN
        return max(self.heartbeat_ms, min(self.idle_heartbeat_ms, cap)) / 1000

    @property
    def journal_file(self) -> str:
        """pysyncobj's journalFile."""
        return str(self.data_dir / "raft.journal")

    @property
    def dump_file(self) -> str:
        """pysyncobj's fullDumpFile: our CBOR snapshot."""
        return str(self.data_dir / "raft.dump")


class DialedTCPNode(TCPNode):  # type: ignore[misc]
    """A peer known by its raft address (its identity) but dialed at `dial` (e.g. a proxy)."""

    def __init__(self, address: str, dial: str) -> None:
        super().__init__(address)
        host, port = dial.rsplit(":", 1)
        self._dial = (host, int(port))
        self._proxied = dial != address
        self._hash = hash(address)

    def __hash__(self) -> int:
        """The hash of the id, computed once (it never changes): pysyncobj's `Node.__hash__`
        reads the id through a property on every dict lookup, 36 per idle leader tick."""
        return self._hash

    @property
    def ip(self) -> Any:
        """The address to connect to (resolved like TCPNode when not proxied)."""
        return self._dial[0] if self._proxied else super().ip

    @property
    def port(self) -> int:
        """The port to connect to."""
        return self._dial[1]


class _BindOnTick:
    """Mixin for a pysyncobj transport: the constructor does not bind.

    Without its tick thread (autoTick off) pysyncobj binds in its constructor, retrying for
    ever while the port is taken; here the first tick binds and later ticks retry (every
    bindRetryTime), as the tick thread did, so the node can give up (`bound()`)."""

    _constructing = True
    _ready: bool

    @property
    def ready(self) -> bool:
        """Bound (or still being constructed: pysyncobj must not bind in its constructor)."""
        return bool(self._ready) or self._constructing


class LoopQuorumTransport(_BindOnTick, QuorumTransport):
    """Our transport (raft/transport.py), bound on the first tick."""


class LoopPysyncobjTransport(_BindOnTick, TCPTransport):  # type: ignore[misc]
    """pysyncobj's own transport (measurements only), bound on the first tick."""


def syncobj_conf(
    settings: RaftSettings,
    serializer: Callable[..., Any],
    deserializer: Callable[..., Any],
    transport: str,
) -> Any:
    """pysyncobj's configuration: journal + CBOR dump always together, password, timeouts."""
    low, high = settings.election_timeout_ms
    return SyncObjConf(
        # our transport authenticates with the secret itself; pysyncobj's uses it for Fernet
        password=settings.password if transport == "pysyncobj" else None,
        bindAddress=f"{settings.bind_host}:{settings.address.rsplit(':', 1)[1]}",
        journalFile=settings.journal_file,
        fullDumpFile=settings.dump_file,
        serializer=serializer,
        deserializer=deserializer,
        appendEntriesUseBatch=False,  # we group-commit ourselves; send at once
        appendEntriesPeriod=settings.heartbeat_ms / 1000,
        # larger than any entry (frames are at most 16 MiB): pysyncobj's chunked transfer
        # of a single oversized entry miscounts its last chunk, so it must never be used
        appendEntriesBatchSizeBytes=APPEND_ENTRIES_BYTES_MAX,
        raftMinTimeout=low / 1000,
        raftMaxTimeout=high / 1000,
        leaderFallbackTimeout=2 * high / 1000,
        connectionTimeout=max(0.5, 2 * high / 1000),
        connectionRetryTime=0.3,
        autoTick=False,  # the node's loop ticks it (raft/ticker.py)
        autoTickPeriod=settings.tick_period_s,
        # a snapshot goes to a lagging follower in chunks of this size, one per AppendEntries
        # (with issue 32 it carries the live entries' bodies: 64 KiB per tick was too slow)
        logCompactionBatchSize=SNAPSHOT_CHUNK_BYTES,
        logCompactionMinEntries=settings.compaction_min_entries,
        logCompactionMinTime=settings.compaction_min_time_s,
        commandsWaitLeader=True,
        dynamicMembershipChange=True,  # through raft.membership's entries only
    )


def int_field(value: Any) -> int:
    """`value` if it is an int (not a bool), else TypeError."""
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def int_or(value: Any, default: int) -> int:
    """`value` if it is an int (not a bool), else `default`."""
    return value if type(value) is int else default
