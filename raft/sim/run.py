"""One seeded run of the simulated cluster, and campaigns of them with shrinking.

A run: start the members, declare the queue, run the workload under the fault schedule for
`seconds` of virtual time (checking every STEP_S), heal and restart everything, let the clients
disconnect, drain the queue on the leader, let the followers catch up, then the final checks.
Everything a run does is appended to its trace; `trace_hash` is its SHA-256, so two runs of one
seed (and schedule) must print the same hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fifo.commands import DeclareQueue
from fifo.replies import DeclareOk, DequeueOk
from raft.replica import ReplicaView
from raft.sim.checkers import QueueVerdict, RaftChecker, check_queue
from raft.sim.clock import Scheduler
from raft.sim.cluster import ClusterParams, SimCluster, SimNode
from raft.sim.faults import LEADER, Fault, encode_faults, generate_faults
from raft.sim.network import SimNetwork
from raft.sim.patches import CUTS_BELOW_COMMIT, simulated
from raft.sim.reads import ReadChecker
from raft.sim.workload import CLIENT_TIMEOUT_S, QUEUE, Event, Workload

STEP_S = 0.05
SETUP_S_MAX = 20.0
AFTER_HEAL_S = 4.0
CLOSE_S = 3.0
DRAIN_REPLY_S = 3.0
DRAIN_ROUNDS_MAX = 5000
DRAIN_PARALLEL = 8  # settled dequeues in flight at once in the drain (one group commit)
WAIT_SLICE_S = 0.002  # virtual time between looks for a reply while waiting for one
DRAIN_S_MAX = 60.0  # virtual seconds for the drain: what is still held after it is stuck
CATCH_UP_S = 4.0
ROTATE = "rotate"  # SimParams.wire of a campaign: each seed runs on WIRE_ROTATION[seed % 3]
# seed 1 on ours; protocol-2 pickles (peers from before 8345617) are the only wire on which
# a snapshot transfer's empty last chunk needs `bytes()` unpickled (raft/sim/README.md)
WIRE_ROTATION = ("pysyncobj2", "quorumq", "pysyncobj")


@dataclass(frozen=True, slots=True)
class SimParams:
    """What a run simulates (all of it goes into the reproduce command)."""

    nodes: int = 3
    seconds: float = 30.0  # virtual seconds of workload under faults
    clients: int = 6
    flaky: bool = True
    compaction_min_entries: int = 60
    # the peer codec: one of raft.sim.network.WIRES, or ROTATE (each seed's from WIRE_ROTATION)
    wire: str = "quorumq"
    slow: bool = False  # schedules with slow links (messages delayed across elections)
    reads: bool = False  # reads on every member, checked for bounded staleness (raft.sim.reads)
    disk: bool = False  # power cuts may also leave garbage in the unsynced tail


@dataclass
class SimResult:
    """The outcome of one run."""

    seed: int
    faults: list[Fault]
    trace_hash: str = ""
    violations: list[str] = field(default_factory=list)
    verdict: QueueVerdict | None = None
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time: the speed on a loaded machine
    events: int = 0
    messages: int = 0
    operations: int = 0
    history: list[Event] = field(default_factory=list)  # the workload's (checkers' input)

    @property
    def failed(self) -> bool:
        """Whether any checker failed."""
        return bool(self.violations)


class _Run:
    """The objects of one run (built inside the patched context)."""

    def __init__(self, seed: int, params: SimParams, root: Path) -> None:
        master = random.Random(seed)
        self.raft_rng = random.Random(master.getrandbits(64))
        self.trace: list[Any] = []
        self.scheduler = Scheduler()
        self.network = SimNetwork(
            self.scheduler, random.Random(master.getrandbits(64)), self.trace, params.wire
        )
        self.checker = RaftChecker()
        cluster_params = ClusterParams(params.nodes, params.compaction_min_entries)
        self.cluster = SimCluster(
            cluster_params,
            self.scheduler,
            self.network,
            root,
            self.checker.on_outcome,
            random.Random(master.getrandbits(64)),
        )
        self.workload = Workload(
            self.cluster, self.scheduler, random.Random(master.getrandbits(64)), params.clients
        )
        self.fault_rng = random.Random(master.getrandbits(64))
        self.reads = ReadChecker(random.Random(master.getrandbits(64))) if params.reads else None
        self._checked_at = 0.0

    def advance(self, seconds: float, workload: bool = True) -> None:
        """Run `seconds` of virtual time in steps, checking after each."""
        end = self.scheduler.now + seconds
        while self.scheduler.now < end - 1e-9:
            self.scheduler.run_until(min(end, self.scheduler.now + STEP_S))
            if workload:
                self.workload.step()
                if self.reads is not None:
                    self.reads.step(self.cluster, self.scheduler.now)
            else:
                self.workload.give_up_stale()  # a client that stopped still times out
            self._check_step()

    def wait_for(self, done: Callable[[], bool], seconds: float) -> None:
        """Run virtual time (no workload) until `done()` or `seconds` passed, in slices of
        WAIT_SLICE_S, checking at least every STEP_S (a reply is taken when it lands, not at
        the next step)."""
        end = self.scheduler.now + seconds
        while not done() and self.scheduler.now < end - 1e-9:
            self.scheduler.run_until(min(end, self.scheduler.now + WAIT_SLICE_S))
            if self.scheduler.now >= self._checked_at + STEP_S - 1e-9:
                self._check_step()

    def _check_step(self) -> None:
        """Sweep every running node's timed-out proposals, then run the step checkers."""
        self._checked_at = self.scheduler.now
        for node in self.cluster.up_nodes():
            assert node.loop is not None and node.replica is not None
            node.loop.run_now(node.replica.sweep)
        self.checker.step(self.cluster)

    def leader(self) -> SimNode | None:
        """The running node that leads in the highest term, if any."""
        best: tuple[int, SimNode] | None = None
        for node in self.cluster.up_nodes():
            raft = node.replica._node if node.replica else None
            if raft is not None and raft._isLeader():
                term = int(raft.raftCurrentTerm)
                if best is None or term > best[0]:
                    best = (term, node)
        return best[1] if best else None

    def propose_and_wait(self, node: SimNode, command: Any, seconds: float) -> Any:
        """Propose `command` on `node`; its reply, or None if none came within `seconds`."""
        box: dict[str, Any] = {}
        assert node.loop is not None and node.replica is not None
        node.loop.run_now(node.replica.propose, command, lambda reply: box.setdefault("r", reply))
        end = self.scheduler.now + seconds
        while "r" not in box and self.scheduler.now < end:
            self.advance(STEP_S, workload=False)
        return box.get("r")

    def apply_fault(self, fault: Fault) -> None:
        """Carry one nemesis action out now."""
        self.trace.append(("fault", round(self.scheduler.now, 6), fault.text()))
        net, nodes = self.network, self.cluster.nodes
        args = fault.args
        if fault.op == "isolate" and args and args[0] == LEADER:
            leader = self.leader()
            args = (leader.node_id,) if leader is not None else ()
            self.trace.append(("leader", round(self.scheduler.now, 6), args))
        if fault.op == "isolate" and args and args[0] in nodes:
            me = nodes[args[0]].address
            for other in nodes.values():
                if other.address != me:
                    net.blocked |= {(me, other.address), (other.address, me)}
        elif fault.op in ("oneway", "flaky", "slow") and len(args) == 2 and set(args) <= set(nodes):
            link = (nodes[args[0]].address, nodes[args[1]].address)
            {"oneway": net.blocked, "flaky": net.flaky, "slow": net.slow}[fault.op].add(link)
        elif fault.op == "heal":
            net.blocked.clear()
            net.flaky.clear()
            net.slow.clear()
        elif fault.op == "crash" and args and args[0] in nodes:
            if len(self.cluster.up_nodes()) > 1 or not nodes[args[0]].up:
                self.cluster.crash(
                    args[0],
                    power_loss="power" in args[1:],
                    garbage="garbage" in args[1:],
                    lied="lied" in args[1:],
                )
        elif fault.op == "restart" and args and args[0] in nodes and not nodes[args[0]].up:
            self.start(args[0])

    def start(self, node_id: str) -> None:
        """Start a member and have it record its incarnation (hello), as the node server does."""
        node = self.cluster.start(node_id)
        assert node.loop is not None and node.replica is not None
        assert node.sessions is not None
        node.loop.run_now(node.sessions.say_hello)


def seed_params(seed: int, params: SimParams) -> SimParams:
    """`params` with the wire this seed runs on (`ROTATE` resolved; any other kept)."""
    if params.wire != ROTATE:
        return params
    return dataclasses.replace(params, wire=WIRE_ROTATION[seed % len(WIRE_ROTATION)])


def run_seed(seed: int, params: SimParams, faults: list[Fault] | None = None) -> SimResult:
    """Run one seed (with `faults`, or the seed's own schedule) and check it."""
    params = seed_params(seed, params)
    started, cpu_started = time.perf_counter(), time.process_time()
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="quorumq-sim-", dir=base))
    try:
        run = _Run(seed, params, root)
        with simulated(lambda: run.scheduler.now, run.raft_rng):
            result = _simulate(run, seed, params, faults)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.wall_seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu_started
    return result


def _simulate(run: _Run, seed: int, params: SimParams, faults: list[Fault] | None) -> SimResult:
    nodes = sorted(run.cluster.nodes)
    if faults is None:
        faults = generate_faults(
            run.fault_rng, nodes, params.seconds, params.flaky, params.slow, params.disk
        )
    result = SimResult(seed, faults)
    run.network.start()
    try:
        for node_id in nodes:
            run.start(node_id)
        _setup(run)
        _under_faults(run, faults, params.seconds)
        _heal_and_drain(run)
        run.checker.final(run.cluster)
        _check_nobody_listed_down(run)
        _check_closed_connections_closed(run)
    finally:
        run.cluster.stop_all()
    result.verdict = check_queue(run.workload.history)
    result.violations = list(run.checker.violations) + _queue_violations(result.verdict)
    result.violations += [f"committed entries cut: {cut}" for cut in CUTS_BELOW_COMMIT[:3]]
    result.violations += [f"node code raised: {e}" for e in run.network.errors[:3]]
    result.violations += [f"apply failed: {m}" for m in run.workload.apply_failures[:3]]
    result.violations += [f"liveness: {m}" for m in run.workload.stalls[:3]]
    if run.reads is not None:
        result.violations += run.reads.violations(run.workload.confirms)
    result.sim_seconds = run.scheduler.now
    result.events = run.scheduler.events
    result.messages = run.network.messages
    result.operations = sum(1 for e in run.workload.history if e[2] == "invoke")
    result.history = run.workload.history
    digests = [(n.node_id, n.incarnation) for n in run.cluster.nodes.values()]
    blob = repr((run.trace, run.workload.history, digests, result.violations)).encode()
    result.trace_hash = hashlib.sha256(blob).hexdigest()[:16]
    return result


def _setup(run: _Run) -> None:
    """Wait for a leader, declare the queue through it."""
    while run.scheduler.now < SETUP_S_MAX:
        run.advance(STEP_S, workload=False)
        leader = run.leader()
        if leader is not None:
            reply = run.propose_and_wait(leader, DeclareQueue(QUEUE), 2.0)
            if isinstance(reply, DeclareOk):
                return
    run.checker.fail(f"no leader declared the queue within {SETUP_S_MAX} s")


def _under_faults(run: _Run, faults: list[Fault], seconds: float) -> None:
    end = run.scheduler.now + seconds
    pending = sorted(faults, key=lambda f: f.at)
    origin = run.scheduler.now
    while run.scheduler.now < end - 1e-9:
        while pending and origin + pending[0].at <= run.scheduler.now:
            run.apply_fault(pending.pop(0))
        run.advance(STEP_S)


def _heal_and_drain(run: _Run) -> None:
    """Heal, restart everyone, let clients finish and disconnect, drain, catch up."""
    run.apply_fault(Fault(0.0, "heal"))
    for node_id in sorted(run.cluster.nodes):
        if not run.cluster.nodes[node_id].up:
            run.start(node_id)
    run.workload.healed_at = run.scheduler.now
    run.advance(AFTER_HEAL_S)
    run.workload.close_connections()
    run.advance(CLOSE_S, workload=False)
    _wait_for_clients(run)
    _drain(run)
    run.advance(CATCH_UP_S, workload=False)


def _wait_for_clients(run: _Run) -> None:
    """Let every client operation get its reply or be given up before the drain: a publish
    confirmed after the drain had found the queue empty was reported lost (seed 367)."""
    deadline = run.scheduler.now + CLIENT_TIMEOUT_S + STEP_S
    while run.workload.pending() and run.scheduler.now < deadline:
        run.advance(STEP_S, workload=False)
    if run.workload.pending():
        stuck = run.workload.pending()
        run.checker.fail(f"{stuck} client operations neither answered nor given up")


def _check_nobody_listed_down(run: _Run) -> None:
    """After healing every member runs and is connected: none may stay listed down (its
    consumers would be suspected for ever, nothing delivered to them)."""
    for node in run.cluster.up_nodes():
        assert node.replica is not None
        down = node.replica.read(lambda view: sorted(view.meta.down_nodes))
        if down:
            run.checker.fail(f"liveness: {node.node_id} still lists {down} down after healing")
            return


def _check_closed_connections_closed(run: _Run) -> None:
    """After healing every client session is closed: the state may list no connection of a
    running incarnation (what such a consumer holds would stay checked out for ever)."""
    for node in run.cluster.up_nodes():
        assert node.replica is not None and node.sessions is not None
        sessions = node.sessions
        listed = node.replica.read(partial(ReplicaView.connections_of, node=node.node_id))
        stale = [
            number
            for incarnation, number in listed
            if incarnation == node.incarnation and not sessions.router.is_live(number)
        ]
        if stale:
            run.checker.fail(
                f"liveness: {node.node_id} still lists closed connections {sorted(stale)[:5]}"
            )
            return


def _drain(run: _Run) -> None:
    """Take every message left, DRAIN_PARALLEL settled dequeues at a time on the leader, each
    round as soon as its replies land, until one finds the queue empty and nothing is held."""
    deadline = run.scheduler.now + DRAIN_S_MAX
    for round_number in range(DRAIN_ROUNDS_MAX):
        if run.scheduler.now > deadline:
            break
        leader = run.leader()
        if leader is None:
            run.advance(STEP_S, workload=False)
            continue
        first = round_number * DRAIN_PARALLEL
        states = [run.workload.drain_step(leader, first + k) for k in range(DRAIN_PARALLEL)]
        run.wait_for(partial(_all_replied, states), DRAIN_REPLY_S)
        if any(_found_empty(state.get("reply")) for state in states):
            if _messages_held(leader) == 0:
                return
            run.advance(0.5, workload=False)
    leader = run.leader()
    held = _messages_held(leader) if leader is not None else "?"
    run.checker.fail(f"liveness: the drain left {held} messages held after {DRAIN_S_MAX:g} s")


def _all_replied(states: list[dict[str, Any]]) -> bool:
    """Whether every drain dequeue of a round has its reply."""
    return all("reply" in state for state in states)


def _found_empty(reply: Any) -> bool:
    """Whether a drain dequeue's reply says the queue had nothing ready."""
    return isinstance(reply, DequeueOk) and reply.message is None and reply.ready == 0


def _messages_held(node: SimNode) -> int:
    """Messages the queue still holds (ready or checked out), on `node`'s state."""
    assert node.replica is not None

    def count(view: Any) -> int:
        queue = view.state.queues.get(QUEUE)
        return 0 if queue is None else int(queue.messages_total)

    return int(node.replica.read(count))


def _queue_violations(verdict: QueueVerdict) -> list[str]:
    out = []
    for name in ("lost", "unexpected", "redelivered_after_ack", "failed_but_consumed"):
        values = getattr(verdict, name)
        if values:
            out.append(f"queue: {len(values)} {name.replace('_', ' ')}: {values[:5]}")
    return out


def reproduce_command(result: SimResult, params: SimParams) -> str:
    """The CLI command that replays `result` exactly."""
    params = seed_params(result.seed, params)
    flags = f"--nodes {params.nodes} --clients {params.clients} --seconds {params.seconds:g}"
    if not params.flaky:
        flags += " --no-flaky"
    if params.slow:
        flags += " --slow"
    if params.reads:
        flags += " --reads"
    if params.disk:
        flags += " --disk"
    if params.wire != "quorumq":
        flags += f" --wire {params.wire}"
    return (
        f"quorumq simulate --seed {result.seed} {flags} --faults '{encode_faults(result.faults)}'"
    )


def shrink(
    result: SimResult,
    params: SimParams,
    runs_max: int = 40,
    log: Callable[[str], None] | None = None,
) -> tuple[SimResult, SimParams]:
    """A shorter schedule (faults removed one at a time, then a shorter run) that still fails."""
    best, best_params, runs = result, params, 0
    last = max((f.at for f in best.faults), default=0.0) + 3.0
    if last < params.seconds:
        shorter = dataclasses.replace(params, seconds=last)
        trial = run_seed(result.seed, shorter, best.faults)
        runs += 1
        if trial.failed:
            best, best_params = trial, shorter
    changed = True
    while changed and runs < runs_max:
        changed = False
        for i in range(len(best.faults)):
            if runs >= runs_max:
                break
            fewer = best.faults[:i] + best.faults[i + 1 :]
            trial = run_seed(result.seed, best_params, fewer)
            runs += 1
            if trial.failed:
                best, changed = trial, True
                if log is not None:
                    log(f"shrunk to {len(fewer)} faults")
                break
    return best, best_params
