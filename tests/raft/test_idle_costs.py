"""What an idle cluster still costs (issue 25 item 3): nothing written when nothing changed, and
an idle leader's heartbeat at its idle period."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from fifo.commands import DeclareQueue
from raft import storage
from raft.durability import DurableFileJournal
from raft.settings import DialedTCPNode, RaftSettings
from raft.sim.clock import Scheduler
from raft.sim.cluster import ClusterParams, SimCluster, SimNode
from raft.sim.network import SimNetwork
from raft.sim.patches import simulated
from raft.snapshotter import SnapshotJob
from raft.ticker import PAST_DUE_RETRY_S


def test_an_unchanged_commit_index_rewrites_no_meta_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj sets the commit index on every AppendEntries a follower handles: the meta file
    (temporary file, fsync, rename) is written again only when the value changed."""
    journal = DurableFileJournal(str(tmp_path / "raft.journal"), "batch", "n1")
    writes: list[bytes] = []
    real_write = storage.write_atomically

    def counting(path: Path, data: bytes, sync: bool) -> None:
        writes.append(data)
        real_write(path, data, sync)

    monkeypatch.setattr(storage, "write_atomically", counting)
    try:
        journal.setRaftCommitIndex(7)
        journal.onOneSecondTimer()
        assert len(writes) == 1
        for _ in range(3):  # idle heartbeats, one second apart
            journal.setRaftCommitIndex(7)
            journal.onOneSecondTimer()
        assert len(writes) == 1
        journal.setRaftCommitIndex(8)
        journal.onOneSecondTimer()
        assert len(writes) == 2
        journal.setCurrentTerm(3, "n2")  # term and vote: written at once, always
        assert len(writes) == 3
    finally:
        journal._destroy()
    again = DurableFileJournal(str(tmp_path / "raft.journal"), "batch", "n1")
    try:
        assert (again.getRaftCommitIndex(), again.getCurrentTerm()) == (8, 3)
        assert again.getVotedForNodeId() == "n2"
    finally:
        again._destroy()


# --- an idle leader's heartbeat (raft.appends._stretch_idle_heartbeat), on the simulator --------

PRODUCTION = RaftSettings("n", "a:1", {}, Path("."), "", 1, 1)  # the defaults a node runs with
IDLE_HEARTBEAT_S = PRODUCTION.idle_heartbeat_s
BUSY_HEARTBEAT_S = 0.05
# on the simulator's exact clock the ticker's timer fires at the very instant of the heartbeat
# deadline, which pysyncobj (`now > deadline`) does not take as passed: the heartbeat goes at the
# past-due retry, PAST_DUE_RETRY_S later (not on a real loop, whose clock has moved on by then)
LATE_S = PAST_DUE_RETRY_S + 0.002


@contextlib.contextmanager
def simulated_cluster(root: Path) -> Iterator[tuple[SimCluster, list[tuple[float, str, str]]]]:
    """A running 3-node simulated cluster (real node code, virtual time) with a leader, and the
    AppendEntries sent on it from then on: (virtual time, from address, to address)."""
    scheduler = Scheduler()
    network = SimNetwork(scheduler, random.Random(1), [])
    params = ClusterParams(
        election_timeout_ms=PRODUCTION.election_timeout_ms,
        idle_heartbeat_ms=PRODUCTION.idle_heartbeat_ms,
        tick_period_ms=PRODUCTION.tick_period_ms,
    )
    cluster = SimCluster(params, scheduler, network, root, _ignore, random.Random(2))
    sent: list[tuple[float, str, str]] = []
    real_send = network.send

    def recording(source: str, target: str, message: Any) -> bool:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            sent.append((scheduler.now, source, target))
        return real_send(source, target, message)

    network.send = recording  # type: ignore[method-assign]
    with simulated(lambda: scheduler.now, random.Random(3)):
        network.start()
        for node_id in sorted(cluster.nodes):
            cluster.start(node_id)
        try:
            scheduler.run_until(3.0)  # elected, hellos committed and applied everywhere
            assert leader_of(cluster) is not None
            sent.clear()
            yield cluster, sent
        finally:
            cluster.stop_all()


def _ignore(*_args: Any) -> None:
    pass


def leader_of(cluster: SimCluster) -> SimNode | None:
    """The member that leads (None while there is none)."""
    leaders = [n for n in cluster.up_nodes() if n.replica and n.replica._node._isLeader()]
    return leaders[0] if len(leaders) == 1 else None


def gaps(sent: list[tuple[float, str, str]], source: str, target: str) -> list[float]:
    """Seconds between consecutive AppendEntries from source to target."""
    times = [at for at, s, t in sent if (s, t) == (source, target)]
    return [b - a for a, b in itertools.pairwise(times)]


def test_an_idle_leader_heartbeats_at_its_idle_period_and_keeps_its_term(tmp_path: Path) -> None:
    """Nothing pending: one heartbeat per follower every IDLE_HEARTBEAT_S (not 50 ms), and over
    20 idle seconds no follower hears too little to stand: same leader, same term."""
    assert IDLE_HEARTBEAT_S == 0.2
    with simulated_cluster(tmp_path) as (cluster, sent):
        leader = leader_of(cluster)
        assert leader is not None and leader.replica is not None
        term = leader.replica._node.current_term
        cluster.scheduler.run_until(cluster.scheduler.now + 20.0)
        assert leader_of(cluster) is leader
        assert all(
            n.replica and n.replica._node.current_term == term for n in cluster.nodes.values()
        )
        for follower in cluster.nodes.values():
            if follower is leader:
                continue
            between = gaps(sent, leader.address, follower.address)
            assert len(between) >= 20 / (IDLE_HEARTBEAT_S + LATE_S) - 2, len(between)
            assert all(IDLE_HEARTBEAT_S <= g <= IDLE_HEARTBEAT_S + LATE_S for g in between)


def test_a_leader_with_a_follower_behind_heartbeats_at_the_busy_period(tmp_path: Path) -> None:
    """A follower cut off while an entry commits without it: the leader is not idle (that
    follower's match index is behind) and heartbeats the other one every 50 ms."""
    with simulated_cluster(tmp_path) as (cluster, sent):
        leader = leader_of(cluster)
        assert leader is not None and leader.replica is not None and leader.loop is not None
        behind, other = [n for _id, n in sorted(cluster.nodes.items()) if n is not leader]
        cluster.network.disconnect(leader.address, behind.address)
        cluster.network.blocked.update(
            {(leader.address, behind.address), (behind.address, leader.address)}
        )
        replies: list[Any] = []
        leader.loop.run_now(leader.replica.propose, DeclareQueue("q"), replies.append)
        cluster.scheduler.run_until(cluster.scheduler.now + 2.0)
        assert replies and leader_of(cluster) is leader
        late = [at for at, s, t in sent if (s, t) == (leader.address, other.address)]
        between = gaps([(at, leader.address, other.address) for at in late if at > late[0] + 0.5],
                       leader.address, other.address)  # fmt: skip
        assert between and max(between) <= BUSY_HEARTBEAT_S + LATE_S < IDLE_HEARTBEAT_S, between


@pytest.mark.parametrize(
    ("election_ms", "idle_ms", "expected_s"),
    [
        ((800, 1600), 200, 0.2),
        ((400, 800), 200, 0.1),
        ((300, 500), 100, 0.075),
        ((400, 800), 30, 0.05),
    ],
)
def test_the_idle_heartbeat_stays_a_quarter_of_the_shortest_election_timeout_at_most(
    election_ms: tuple[int, int], idle_ms: int, expected_s: float
) -> None:
    settings = RaftSettings(
        "n", "a:1", {}, Path("."), "", 1, 1, election_timeout_ms=election_ms,
        idle_heartbeat_ms=idle_ms,
    )  # fmt: skip
    assert settings.idle_heartbeat_s == pytest.approx(expected_s)


def test_an_idle_cluster_snapshots_an_unchanged_state_only_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time-based compaction (every `compaction_min_time_s`, 300 s) takes one snapshot of what
    the nodes applied since they started, and none more while nothing is applied: pysyncobj
    skips a snapshot whose last applied entry is the one already snapshotted."""
    started: list[tuple[float, int]] = []
    real_start = SnapshotJob.start

    with simulated_cluster(tmp_path) as (cluster, _sent):

        def recording(job: SnapshotJob, encode: Any, below: int, in_child: bool = True) -> None:
            started.append((cluster.scheduler.now, below))
            real_start(job, encode, below, in_child)

        monkeypatch.setattr(SnapshotJob, "start", recording)
        period = PRODUCTION.compaction_min_time_s
        cluster.scheduler.run_until(2.2 * period)
        assert leader_of(cluster) is not None
    assert len(started) == len(cluster.nodes), started  # one each, in the first period
    assert all(at < period + 5 for at, _below in started), started


def test_an_idle_leader_ticks_once_per_heartbeat_round_not_once_per_reply(tmp_path: Path) -> None:
    """Each heartbeat round is one tick on the leader: the followers' replies to it leave an
    idle leader idle and are handled without a tick (`RaftNode._event_handled_lightly`). Before,
    every reply ran a full pysyncobj tick: three a round with two followers. Counted on the
    simulator's virtual clock: exact, not timed."""
    with simulated_cluster(tmp_path) as (cluster, sent):
        leader = leader_of(cluster)
        assert leader is not None and leader.replica is not None
        ticker = leader.replica._node._ticker
        ticks, light = ticker.ticks, ticker.light_events
        cluster.scheduler.run_until(cluster.scheduler.now + 20.0)
        assert leader_of(cluster) is leader
        rounds = len([1 for _at, source, _to in sent if source == leader.address]) / 2
        assert rounds >= 20 / (IDLE_HEARTBEAT_S + LATE_S) - 2, rounds
        # a round's tick on this exact clock is two: the timer at the very deadline, then the
        # past-due retry that sends (LATE_S above; a real loop's clock has moved on by then)
        assert ticker.ticks - ticks <= 2 * rounds + 2, (ticker.ticks - ticks, rounds)
        assert ticker.light_events - light >= 2 * rounds - 2  # every reply, no tick


def test_one_command_at_a_time_costs_the_leader_no_tick_for_the_second_ack(tmp_path: Path) -> None:
    """One command at a time (issue 29): the first follower's ack commits and applies the entry
    in a tick; the second one's finds the leader settled (every follower holds everything, all
    committed and applied) and is handled without a tick, although the commit index is still
    held back (`_commit_send_at`: its own timer ticks for it). Two ticks a command: that ack's
    and the held-back commit index's (before: 2.72, a third of them for the second ack)."""
    with simulated_cluster(tmp_path) as (cluster, _sent):
        leader = leader_of(cluster)
        assert leader is not None and leader.replica is not None and leader.loop is not None
        ticker = leader.replica._node._ticker
        ticks, light = ticker.ticks, ticker.light_events
        commands = 50
        for number in range(commands):
            replies: list[Any] = []
            leader.loop.run_now(leader.replica.propose, DeclareQueue(f"q{number}"), replies.append)
            while not replies:
                cluster.scheduler.run_until(cluster.scheduler.now + 0.001)
            cluster.scheduler.run_until(cluster.scheduler.now + 0.02)  # < the idle heartbeat
        assert leader_of(cluster) is leader
        assert ticker.ticks - ticks <= 2 * commands, (ticker.ticks - ticks) / commands
        assert ticker.light_events - light >= 3 * commands - 2  # both acks of the commit index


def test_a_peer_hashes_and_compares_as_pysyncobj_s_node_of_its_address() -> None:
    """`DialedTCPNode` computes its hash once (pysyncobj's goes through a property on every
    dict lookup); it stays the hash of pysyncobj's own node for that address, proxied or not,
    so dicts keyed by either find the other."""
    for dial in ("127.0.0.1:7001", "127.0.0.1:9999"):  # direct, then through a proxy
        peer, plain = DialedTCPNode("127.0.0.1:7001", dial), TCPNode("127.0.0.1:7001")
        assert hash(peer) == hash(plain) and peer == plain
        assert {plain: "found"}[peer] == "found" and {peer: "found"}[plain] == "found"
    assert hash(DialedTCPNode("127.0.0.1:7002", "127.0.0.1:7002")) != hash(plain)
