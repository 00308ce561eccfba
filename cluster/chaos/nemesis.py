"""Nemeses (kill, pause, partition, restart-all, power-loss, leader variants) and their schedule.

`membership` replaces a random follower by a new node (member add, catch up, member remove,
stop the old one: what an operator does with a dead machine); the replacement is permanent, so
the fault has nothing to heal and later faults pick among the new member set.

`power-loss` (one node) and `power-loss-all` (every node at once) SIGKILL and then drop every
journal write the node had not fsynced (a seeded prefix of the unsynced tail may survive, its
last record torn), as LazyFS does for Jepsen; the nodes run with the test-only power-loss layer
(`raft.durability.FAULT_POWER_LOSS_ENV`) so the journal records what was synced.

The schedule is pure data drawn from `random.Random(seed)`: the same seed, duration and fault
list give the same schedule. Targets that depend on the run ("the leader") are resolved when the
fault starts; random targets are drawn up front as an index into the sorted node ids.
Faults never overlap: one fault at a time keeps a majority reachable between faults, so that
every unavailability the report shows belongs to a fault window.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import structlog

from cluster.chaos.history import Recorder
from cluster.chaos.linkproxy import ProxyMesh

log = structlog.get_logger(__name__)

# Fault kinds a schedule can contain; `--faults` tokens expand to these (see `expand_faults`).
FAULT_KINDS: tuple[str, ...] = (
    "kill",
    "kill-leader",
    "pause",
    "pause-leader",
    "partition",
    "partition-leader",
    "restart-all",
    "power-loss",
    "power-loss-all",
    "membership",
)
# `leader` on the command line adds the leader variant of every other chosen fault.
LEADER_TOKEN = "leader"
PARTITION_SHAPES: tuple[str, ...] = ("isolate", "one-way-out", "one-way-in")


class ClusterHandle(Protocol):
    """What the nemeses need from a running cluster (real processes, via an adapter)."""

    def node_ids(self) -> list[str]:
        """Every node id, sorted."""
        ...

    def leader(self) -> str | None:
        """The current leader's node id, or None when no leader is known."""
        ...

    def kill(self, node: str) -> None:
        """SIGKILL the node's process (no clean shutdown)."""
        ...

    def start(self, node: str) -> None:
        """Start the node again from its journal and dump."""
        ...

    def pause(self, node: str) -> None:
        """SIGSTOP the node's process."""
        ...

    def resume(self, node: str) -> None:
        """SIGCONT the node's process."""
        ...

    def lose_power(self, node: str, seed: int) -> str:
        """SIGKILL the node and drop the journal writes it had not fsynced (seeded); returns
        what was lost, for the report."""
        ...

    def stop_all(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL if it lingers)."""
        ...

    def replace(self, node: str) -> str:
        """Replace member `node` by a new node through membership changes; the new id."""
        ...

    def start_all(self) -> None:
        """Start every stopped node."""
        ...


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    """One fault of a schedule; times in seconds from the start of the run."""

    kind: str
    start_s: float
    duration_s: float
    pick: int  # index into the sorted candidate nodes, for targets not fixed by role
    shape: str = "isolate"  # partitions only: isolate | one-way-out | one-way-in

    @property
    def end_s(self) -> float:
        """When the fault is healed."""
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class ScheduleParams:
    """Bounds of a schedule (seconds)."""

    warmup_s: float = 5.0
    fault_min_s: float = 3.0
    fault_max_s: float = 8.0
    quiet_min_s: float = 4.0
    quiet_max_s: float = 8.0
    tail_s: float = 2.0  # no fault starts in the last tail_s + fault_min_s of the run


def expand_faults(tokens: Sequence[str]) -> list[str]:
    """Turn `--faults` tokens into fault kinds; ValueError on an unknown token."""
    kinds: list[str] = []
    for token in tokens:
        if token != LEADER_TOKEN and token not in FAULT_KINDS:
            raise ValueError(f"unknown fault {token!r}; known: {[*FAULT_KINDS, LEADER_TOKEN]}")
        if token in FAULT_KINDS and token not in kinds:
            kinds.append(token)
    if LEADER_TOKEN in tokens:
        bases = [k for k in kinds if f"{k}-leader" in FAULT_KINDS] or ["kill", "pause", "partition"]
        for base in bases:
            if f"{base}-leader" not in kinds:
                kinds.append(f"{base}-leader")
    return kinds


def make_schedule(
    kinds: Sequence[str], duration_s: float, seed: int, params: ScheduleParams | None = None
) -> list[ScheduledFault]:
    """A reproducible, non-overlapping schedule of `kinds` within `duration_s`."""
    p = params or ScheduleParams()
    rng = random.Random(seed)
    faults: list[ScheduledFault] = []
    if not kinds:
        return faults
    t = p.warmup_s
    last_start = duration_s - p.tail_s - p.fault_min_s
    while t <= last_start:
        kind = kinds[len(faults) % len(kinds)] if len(faults) < len(kinds) else rng.choice(kinds)
        longest = min(p.fault_max_s, duration_s - p.tail_s - t)
        length = round(rng.uniform(p.fault_min_s, longest), 3)
        shape = rng.choice(PARTITION_SHAPES) if kind.startswith("partition") else "isolate"
        faults.append(ScheduledFault(kind, round(t, 3), length, rng.randrange(1 << 16), shape))
        t += length + rng.uniform(p.quiet_min_s, p.quiet_max_s)
    return faults


@dataclass(slots=True)
class FaultRecord:
    """A fault as it happened: kind, target nodes and history-clock times (seconds)."""

    kind: str
    nodes: list[str]
    start_s: float
    end_s: float | None = None
    leader: str | None = None  # the leader when the fault started
    shape: str | None = None
    detail: str = ""
    errors: list[str] = field(default_factory=list)
    op: int = -1  # the fault's op id in the history

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        fields = asdict(self)
        del fields["op"]
        return fields


class Nemesis:
    """Injects and heals faults on a cluster, recording each one in the history."""

    def __init__(
        self, cluster: ClusterHandle, recorder: Recorder, mesh: ProxyMesh | None = None
    ) -> None:
        self.cluster = cluster
        self.recorder = recorder
        self.mesh = mesh
        self.records: list[FaultRecord] = []
        self._killed: set[str] = set()
        self._paused: set[str] = set()
        self.power_lost: list[str] = []  # what each power-loss fault dropped, for the report
        self.replaced: list[str] = []  # "old -> new" of each membership fault, for the report

    def inject(self, fault: ScheduledFault) -> FaultRecord:
        """Start `fault` now and return its record (open until `heal`)."""
        leader = self.cluster.leader()  # asked first: a fault changes who leads
        nodes, detail = self._targets(fault, leader)
        record = FaultRecord(fault.kind, nodes, self._now_s(), leader=leader, detail=detail)
        if fault.kind.startswith("partition"):
            record.shape = fault.shape
        record.op = self.recorder.invoke(
            "fault", "nemesis", fault=fault.kind, node=",".join(nodes), detail=detail
        )
        self._guard(record, lambda: self._start(fault, nodes))
        if fault.kind.startswith("power-loss") and self.power_lost:
            record.detail = f"{detail}: {self.power_lost[-1]}"
        if fault.kind == "membership" and self.replaced and not record.errors:
            record.detail = f"{detail}: {self.replaced[-1]}"
        self.records.append(record)
        log.info("fault_started", kind=fault.kind, nodes=nodes, detail=detail)
        return record

    def heal(self, record: FaultRecord) -> None:
        """End the fault of `record`: restart, resume or reconnect its nodes."""
        self._guard(record, lambda: self._end(record))
        record.end_s = self._now_s()
        self.recorder.complete(
            record.op, "ok", "fault", "nemesis", fault=record.kind, node=",".join(record.nodes)
        )
        log.info("fault_healed", kind=record.kind, nodes=record.nodes)

    def heal_everything(self) -> None:
        """Undo any fault still in force (used at the end of a run and on errors)."""
        for node in sorted(self._paused):
            self.cluster.resume(node)
        self._paused.clear()
        if self.mesh is not None:
            self.mesh.heal()
        for node in sorted(self._killed):
            self.cluster.start(node)
        self._killed.clear()

    def run(self, schedule: Sequence[ScheduledFault], stop: threading.Event) -> None:
        """Play `schedule` on the history clock until done or `stop` is set. Each fault lasts
        its full duration once its action is done, and the schedule after it shifts by however
        late its heal finished: a slow action (a restart, a member change) never shortens the
        faults that follow to nothing, and the quiet gaps between faults are kept."""
        late_s = 0.0
        for fault in schedule:
            if stop.wait(max(0.0, fault.start_s + late_s - self._now_s())):
                return
            record = self.inject(fault)
            stop.wait(fault.duration_s)
            self.heal(record)
            late_s = max(late_s, self._now_s() - fault.end_s)
            if stop.is_set():
                return

    def _now_s(self) -> float:
        return self.recorder.now_ns() / 1e9

    def _targets(self, fault: ScheduledFault, leader: str | None) -> tuple[list[str], str]:
        nodes = self.cluster.node_ids()
        if fault.kind in ("restart-all", "power-loss-all"):
            return nodes, "every node"
        if fault.kind.endswith("-leader"):
            if leader is not None:
                return [leader], "leader"
            return [nodes[fault.pick % len(nodes)]], "no leader known: random node"
        if fault.kind == "membership":  # a member cannot remove itself while it leads
            followers = [node for node in nodes if node != leader] or nodes
            return [followers[fault.pick % len(followers)]], "random follower replaced"
        return [nodes[fault.pick % len(nodes)]], "random node"

    def _start(self, fault: ScheduledFault, nodes: list[str]) -> None:
        base = fault.kind.removesuffix("-leader")
        if base == "kill":
            self._killed.update(nodes)
            for node in nodes:
                self.cluster.kill(node)
        elif base == "pause":
            self._paused.update(nodes)
            for node in nodes:
                self.cluster.pause(node)
        elif base == "partition":
            self._partition(nodes[0], fault.shape)
        elif base == "restart-all":
            self._killed.update(nodes)
            self.cluster.stop_all()
        elif base.startswith("power-loss"):
            self._killed.update(nodes)
            lost = [self.cluster.lose_power(node, fault.pick + i) for i, node in enumerate(nodes)]
            self.power_lost.append("; ".join(lost))
            log.info("power_lost", nodes=nodes, lost=lost)
        elif base == "membership":
            new = self.cluster.replace(nodes[0])
            self.replaced.append(f"{nodes[0]} -> {new}")

    def _partition(self, node: str, shape: str) -> None:
        if self.mesh is None:
            raise RuntimeError("partition faults need a ProxyMesh between the peers")
        peers = [n for n in self.cluster.node_ids() if n != node]
        if shape == "isolate":
            self.mesh.isolate(node)
        elif shape == "one-way-out":  # node's messages are dropped, it still hears the others
            for peer in peers:
                self.mesh.cut(node, peer)
        else:  # one-way-in: node hears nothing but its messages still arrive
            for peer in peers:
                self.mesh.cut(peer, node)

    def _end(self, record: FaultRecord) -> None:
        base = record.kind.removesuffix("-leader")
        if base == "pause":
            for node in record.nodes:
                self.cluster.resume(node)
                self._paused.discard(node)
        elif base == "partition" and self.mesh is not None:
            self.mesh.heal()
        elif base == "restart-all" or base.startswith("power-loss"):
            for node in record.nodes:
                self.cluster.start(node)
            self._killed.difference_update(record.nodes)
        elif base == "kill":
            for node in record.nodes:
                self.cluster.start(node)
                self._killed.discard(node)

    def _guard(self, record: FaultRecord, action: Callable[[], None]) -> None:
        # A nemesis failure (a node that will not restart) is data for the report, not a crash
        # of the harness: the run goes on and the report shows the error.
        try:
            action()
        except Exception as err:
            record.errors.append(f"{type(err).__name__}: {err}")
            log.warning("fault_action_failed", kind=record.kind, error=str(err))
