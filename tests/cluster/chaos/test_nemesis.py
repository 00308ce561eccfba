"""Nemeses on real OS processes and the seeded schedule (no cluster needed)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.chaos.history import Recorder
from cluster.chaos.linkproxy import ProxyMesh
from cluster.chaos.nemesis import (
    FAULT_KINDS,
    Nemesis,
    ScheduledFault,
    ScheduleParams,
    expand_faults,
    make_schedule,
)


class SleeperCluster:
    """A ClusterHandle over plain `sleep` processes, enough to see SIGKILL/SIGSTOP land."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = dict.fromkeys(ids, 0)
        self.current_leader: str | None = ids[0]
        self.start_all()

    def node_ids(self) -> list[str]:
        return sorted(self.ids)

    def leader(self) -> str | None:
        return self.current_leader

    def kill(self, node: str) -> None:
        self.procs[node].send_signal(signal.SIGKILL)
        self.procs[node].wait()

    def start(self, node: str) -> None:
        self.procs[node] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.starts[node] += 1

    def pause(self, node: str) -> None:
        self.procs[node].send_signal(signal.SIGSTOP)

    def resume(self, node: str) -> None:
        self.procs[node].send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for node in self.ids:
            self.kill(node)

    def start_all(self) -> None:
        for node in self.ids:
            if node not in self.procs or self.procs[node].poll() is not None:
                self.start(node)

    def replace(self, node: str) -> str:
        new = f"n{len(self.starts) + 1}"
        self.ids = [n for n in self.ids if n != node] + [new]
        self.starts[new] = 0
        self.start(new)
        self.kill(node)
        return new

    def lose_power(self, node: str, seed: int) -> str:
        """Part of `ClusterHandle`; a sleeper has no journal whose unsynced tail could be lost."""
        raise NotImplementedError("SleeperCluster cannot lose power: use a real cluster")

    def state(self, node: str) -> str:
        """The process state letter from /proc (R/S running or sleeping, T stopped)."""
        if self.procs[node].poll() is not None:
            return "dead"
        stat = Path(f"/proc/{self.procs[node].pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def close(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


@pytest.fixture
def cluster() -> Iterator[SleeperCluster]:
    handle = SleeperCluster(["n1", "n2", "n3"])
    yield handle
    handle.close()


def wait_state(cluster: SleeperCluster, node: str, states: str) -> str:
    deadline = time.monotonic() + 5
    while cluster.state(node) not in states and time.monotonic() < deadline:
        time.sleep(0.02)
    return cluster.state(node)


def test_same_seed_gives_the_same_schedule_and_another_seed_differs() -> None:
    """A schedule is a pure function of kinds, duration and seed."""
    kinds = ["kill", "pause", "partition"]
    assert make_schedule(kinds, 120, seed=1) == make_schedule(kinds, 120, seed=1)
    assert make_schedule(kinds, 120, seed=1) != make_schedule(kinds, 120, seed=2)


def test_schedule_faults_stay_inside_the_run_and_never_overlap() -> None:
    """Faults start after the warm-up, end before the tail and never overlap."""
    params = ScheduleParams()
    for seed in range(20):
        schedule = make_schedule(["kill", "pause", "partition", "restart-all"], 90, seed, params)
        assert schedule, "a 90 s run has room for faults"
        assert schedule[0].start_s >= params.warmup_s
        assert schedule[-1].end_s <= 90 - params.tail_s + 1e-6
        for earlier, later in itertools.pairwise(schedule):
            assert earlier.end_s < later.start_s


def test_schedule_uses_every_requested_kind_first() -> None:
    """The first faults cycle through every requested kind, so a short run tries each."""
    kinds = ["kill", "pause", "partition"]
    schedule = make_schedule(kinds, 60, seed=3)
    assert [f.kind for f in schedule[:3]] == kinds


def test_expand_faults_adds_leader_variants_and_refuses_unknown_tokens() -> None:
    """`leader` adds the -leader variant of each chosen fault; a typo is an error."""
    assert expand_faults(["kill", "leader"]) == ["kill", "kill-leader"]
    assert expand_faults(["leader"]) == ["kill-leader", "pause-leader", "partition-leader"]
    assert set(expand_faults(list(FAULT_KINDS))) == set(FAULT_KINDS)
    with pytest.raises(ValueError, match="unknown fault"):
        expand_faults(["kil"])


def test_kill_sigkills_and_heal_restarts_the_node(cluster: SleeperCluster) -> None:
    """kill leaves the process dead until heal, which starts it again; both are recorded."""
    recorder = Recorder()
    nemesis = Nemesis(cluster, recorder)
    record = nemesis.inject(ScheduledFault("kill", 0, 1, pick=1))
    assert record.nodes == ["n2"]
    assert cluster.state("n2") == "dead"
    nemesis.heal(record)
    assert cluster.starts["n2"] == 2 and cluster.state("n2") != "dead"
    assert record.end_s is not None and record.end_s >= record.start_s
    events = recorder.events()
    assert [(e.f, e.type, e.fault, e.node) for e in events] == [
        ("fault", "invoke", "kill", "n2"),
        ("fault", "ok", "kill", "n2"),
    ]


def test_pause_leader_stops_the_leader_until_heal(cluster: SleeperCluster) -> None:
    """pause-leader SIGSTOPs the current leader; heal SIGCONTs it."""
    cluster.current_leader = "n3"
    nemesis = Nemesis(cluster, Recorder())
    record = nemesis.inject(ScheduledFault("pause-leader", 0, 1, pick=0))
    assert record.nodes == ["n3"] and record.detail == "leader" and record.leader == "n3"
    assert wait_state(cluster, "n3", "Tt") in "Tt"
    nemesis.heal(record)
    assert wait_state(cluster, "n3", "RS") in "RS"


def test_leader_variant_without_a_leader_falls_back_to_a_random_node(
    cluster: SleeperCluster,
) -> None:
    """With no known leader the fault still happens, on a node picked by the schedule."""
    cluster.current_leader = None
    nemesis = Nemesis(cluster, Recorder())
    record = nemesis.inject(ScheduledFault("kill-leader", 0, 1, pick=2))
    assert record.nodes == ["n3"] and "no leader" in record.detail
    nemesis.heal_everything()
    assert cluster.state("n3") != "dead"


def test_restart_all_stops_every_node_then_starts_them(cluster: SleeperCluster) -> None:
    """restart-all kills all three and heal starts all three."""
    nemesis = Nemesis(cluster, Recorder())
    record = nemesis.inject(ScheduledFault("restart-all", 0, 1, pick=0))
    assert all(cluster.state(n) == "dead" for n in cluster.ids)
    nemesis.heal(record)
    assert all(cluster.state(n) != "dead" for n in cluster.ids)


@pytest.mark.parametrize(
    ("shape", "blocked"),
    [
        ("isolate", {("n1", "n2"), ("n2", "n1"), ("n1", "n3"), ("n3", "n1")}),
        ("one-way-out", {("n1", "n2"), ("n1", "n3")}),
        ("one-way-in", {("n2", "n1"), ("n3", "n1")}),
    ],
)
def test_partition_shapes_block_the_right_directed_links(
    cluster: SleeperCluster, shape: str, blocked: set[tuple[str, str]]
) -> None:
    """Each partition shape blocks exactly its directed links; heal opens them all."""
    servers = [subprocess_free_port() for _ in cluster.ids]
    mesh = ProxyMesh({n: f"127.0.0.1:{port}" for n, port in zip(cluster.ids, servers, strict=True)})
    try:
        nemesis = Nemesis(cluster, Recorder(), mesh)
        record = nemesis.inject(ScheduledFault("partition", 0, 1, pick=0, shape=shape))
        assert record.shape == shape and not record.errors
        assert _blocked_links(mesh) == blocked
        nemesis.heal(record)
        assert _blocked_links(mesh) == set()
    finally:
        mesh.close()


def test_partition_without_proxies_is_recorded_as_an_error(cluster: SleeperCluster) -> None:
    """A partition with no ProxyMesh cannot be made: the record says so, the run goes on."""
    nemesis = Nemesis(cluster, Recorder())
    record = nemesis.inject(ScheduledFault("partition", 0, 1, pick=0))
    assert record.errors and "ProxyMesh" in record.errors[0]


def test_run_plays_a_schedule_on_the_history_clock(cluster: SleeperCluster) -> None:
    """run() injects and heals each fault at its time and stops early when asked."""
    schedule = [ScheduledFault("pause", 0.1, 0.2, pick=0), ScheduledFault("kill", 0.4, 0.2, 1)]
    nemesis = Nemesis(cluster, Recorder())
    nemesis.run(schedule, threading.Event())
    assert [r.kind for r in nemesis.records] == ["pause", "kill"]
    first, second = nemesis.records
    assert first.start_s >= 0.1 and first.end_s is not None and first.end_s >= 0.3
    assert second.start_s >= 0.4 and second.end_s is not None
    assert cluster.state("n1") != "dead" and cluster.state("n2") != "dead"


class SlowCluster(SleeperCluster):
    """Its restarts take `slow_s` (a node that replays a long journal)."""

    slow_s = 0.5

    def start(self, node: str) -> None:
        time.sleep(self.slow_s)
        super().start(node)


def test_a_slow_heal_shifts_the_schedule_instead_of_shortening_the_next_fault() -> None:
    """Each fault lasts its duration after its action, and a heal that ends late shifts the
    faults after it (with their quiet gap): none is cut to nothing."""
    slow = SlowCluster(["n1", "n2", "n3"])
    try:
        schedule = [ScheduledFault("kill", 0.1, 0.2, pick=0), ScheduledFault("pause", 0.4, 0.3, 1)]
        nemesis = Nemesis(slow, Recorder())
        nemesis.run(schedule, threading.Event())
        first, second = nemesis.records
        assert first.end_s is not None and second.end_s is not None
        assert first.end_s - first.start_s >= 0.2 + slow.slow_s
        assert second.start_s >= first.end_s + 0.1  # the quiet gap kept after the late heal
        assert second.end_s - second.start_s >= 0.3
    finally:
        slow.close()


def subprocess_free_port() -> int:
    """An ephemeral port nobody listens on (the proxies only need a target address)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _blocked_links(mesh: ProxyMesh) -> set[tuple[str, str]]:
    """Directed (sender, receiver) pairs whose bytes are held, whichever side dials."""
    blocked = set()
    for (dialer, target), link in mesh.proxies.items():
        if link.mode("forward") != "pass":
            blocked.add((dialer, target))
        if link.mode("backward") != "pass":
            blocked.add((target, dialer))
    return blocked


def test_membership_replaces_a_follower_for_good_and_heal_changes_nothing(
    cluster: SleeperCluster,
) -> None:
    """The membership fault never targets the leader; the new member stays after the heal."""
    nemesis = Nemesis(cluster, Recorder())
    for pick in range(4):
        cluster.current_leader = cluster.node_ids()[pick % 3]
        leader = cluster.current_leader
        record = nemesis.inject(ScheduledFault("membership", 0.0, 1.0, pick))
        assert record.nodes != [leader] and not record.errors
        assert record.nodes[0] not in cluster.node_ids()
        assert record.detail.endswith(nemesis.replaced[-1])
        nemesis.heal(record)
        assert len(cluster.node_ids()) == 3 and leader in cluster.node_ids()
    assert len(nemesis.replaced) == 4
