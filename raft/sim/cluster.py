"""Replicas of the real node code in one process: `raft.replica.Replica` (RaftNode, group
commit, durable journal, CBOR snapshots, pre-vote, membership guard) on virtual loops, each
with the node server's session layer around it (`raft.sim.session`: leader timers, connection
reconciliation, effect router).

A node's data dir is a real directory (under /dev/shm when it exists: the journal's fsyncs cost
nothing there); its journal records how much was fsynced, so a crash with power loss drops the
rest (`raft.storage.power_loss`, seeded). A restart is a new incarnation on the same files,
which records itself through the log (`hello`) as the node server does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from raft import storage
from raft.node import RaftSettings
from raft.replica import Applied, Replica
from raft.replicated import Outcome
from raft.sim.clock import Scheduler, VirtualLoop
from raft.sim.network import SimNetwork, SimTransport
from raft.sim.patches import JOURNAL_OWNERS, SYNCED, SYNCED_BEFORE
from raft.sim.session import SimSessions

SUPPORTED_VERSION = 2
BASE_PORT = 7100
PASSWORD = "simulated-cluster-secret"


@dataclass(frozen=True, slots=True)
class ClusterParams:
    """The simulated cluster's shape (the same knobs cluster.toml has)."""

    size: int = 3
    compaction_min_entries: int = 60  # small: snapshots and snapshot transfers happen often
    election_timeout_ms: tuple[int, int] = (400, 800)
    heartbeat_ms: int = 50
    # 50: no longer heartbeat when idle, and ticks at least every 100 ms, as when the planted-bug
    # seeds of tests/raft/sim were found (production's election timeouts are (800, 1600), its
    # idle heartbeat and tick period 200 ms: RaftSettings, tests/raft/test_idle_costs.py)
    idle_heartbeat_ms: int = 50
    tick_period_ms: int = 100
    fsync: str = "batch"


@dataclass
class SimNode:
    """One member: its settings, and while it runs, its loop and replica."""

    node_id: str
    address: str
    data_dir: Path
    incarnation: int = 0
    loop: VirtualLoop | None = None
    replica: Replica | None = None
    sessions: SimSessions | None = None  # the node server's session layer, while it runs
    applied_index: int = 0  # the last log index its state reflects (entry or snapshot)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def up(self) -> bool:
        """Whether it runs."""
        return self.replica is not None


OutcomeObserver = Callable[[SimNode, Outcome, bool], None]


class SimCluster:
    """Starts, crashes and restarts the members; `observer` sees every applied entry."""

    def __init__(
        self,
        params: ClusterParams,
        scheduler: Scheduler,
        network: SimNetwork,
        root: Path,
        observer: OutcomeObserver,
        rng: random.Random,
    ) -> None:
        self.params = params
        self.scheduler = scheduler
        self.network = network
        self.observer = observer
        self.rng = rng
        self.nodes = {
            f"n{i}": SimNode(f"n{i}", f"127.0.0.1:{BASE_PORT + i}", root / f"n{i}")
            for i in range(1, params.size + 1)
        }

    def settings(self, node: SimNode) -> RaftSettings:
        """What the node server would build from cluster.toml for this member."""
        params = self.params
        return RaftSettings(
            node_id=node.node_id,
            address=node.address,
            peers={n.node_id: n.address for n in self.nodes.values() if n is not node},
            data_dir=node.data_dir,
            password=PASSWORD,
            supported_version=SUPPORTED_VERSION,
            incarnation=node.incarnation,
            fsync=params.fsync,
            election_timeout_ms=params.election_timeout_ms,
            heartbeat_ms=params.heartbeat_ms,
            idle_heartbeat_ms=params.idle_heartbeat_ms,
            tick_period_ms=params.tick_period_ms,
            compaction_min_entries=params.compaction_min_entries,
        )

    def start(self, node_id: str) -> SimNode:
        """Start (or restart) a member as a new incarnation."""
        node = self.nodes[node_id]
        assert node.replica is None, f"{node_id} already runs"
        node.incarnation += 1
        node.applied_index = 0
        loop = VirtualLoop(self.scheduler, f"{node_id}.{node.incarnation}")
        SimTransport.network = self.network
        settings = self.settings(node)

        def observe(outcome: Outcome, _current: bool) -> None:
            node.applied_index = outcome.index  # before the entry's replies are resolved
            self.observer(node, outcome, False)

        def on_reset(index: int) -> None:
            node.applied_index = index
            self.observer(node, Outcome(index, None, [], []), True)

        node.loop = loop
        node.replica = loop.run_now(Replica, settings, loop, _ignore_applied, on_reset, observe)
        node.sessions = SimSessions(node.replica, loop, node.incarnation)
        # what it loaded is what the disk holds (it was read back and checked)
        SYNCED[settings.journal_file] = int(node.replica._node._journal()._end)
        JOURNAL_OWNERS[settings.journal_file] = node.replica._node
        return node

    def crash(
        self, node_id: str, power_loss: bool, garbage: bool = False, lied: bool = False
    ) -> None:
        """Kill a member at once (kill -9); with `power_loss`, also what was not fsynced; with
        `lied`, its last fsync had lied (what it made stable is lost too); with `garbage`, a
        byte of the unsynced part that survived is flipped (a half-written block)."""
        node = self.nodes[node_id]
        if node.replica is None or node.loop is None:
            return
        replica, loop = node.replica, node.loop
        node.replica = node.sessions = None
        loop.run_now(replica._node._destroy_now)  # no flush: the process just dies
        loop.alive = False
        if power_loss:
            journal = Path(self.settings(node).journal_file)
            synced = (SYNCED_BEFORE if lied else SYNCED).get(str(journal), 0)
            journal.with_name(journal.name + ".synced").write_text(str(synced))
            kept = storage.power_loss(journal, self.rng.randrange(2**31))
            if garbage and kept["kept"] > kept["synced"]:
                _flip_byte(journal, self.rng.randrange(kept["synced"], kept["kept"]))

    def up_nodes(self) -> list[SimNode]:
        """The running members, by id."""
        return [n for _id, n in sorted(self.nodes.items()) if n.up]

    def stop_all(self) -> None:
        """Stop every member (end of a run)."""
        for node_id in sorted(self.nodes):
            self.crash(node_id, power_loss=False)


def _ignore_applied(_applied: Applied) -> None:
    """Deliveries are not used: consumers dequeue (basic.get), as RabbitMQ's polling client."""


def _flip_byte(path: Path, offset: int) -> None:
    """Invert one byte of a file (a write the power cut left half done)."""
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))
