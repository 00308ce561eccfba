"""Membership changes on real node processes: replacing a node under traffic, and refusals."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.client.errors import ClusterError
from cluster.launcher import LocalCluster, free_ports, node_status, start_cluster, wait_until
from raft import membership
from tests.background import Background

pytestmark = pytest.mark.cluster

QUEUE = "replace"


def quorumq(data_dir: Path, *args: str) -> tuple[int, str]:
    """Run the CLI like `main()` does: (exit code, output and error message)."""
    result = CliRunner().invoke(cli, ["--data-dir", str(data_dir), *args], standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if isinstance(result.exception, click.UsageError):
        return 64, result.exception.format_message()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


class Traffic(Background):
    """A publisher with confirms (to the leader) and a consumer (on `consume_on` first), on
    threads that stop when the `with` block ends, however the test ends."""

    def __init__(self, cluster: LocalCluster, consume_on: str) -> None:
        super().__init__("membership-traffic")
        self.cluster = cluster
        self.consume_on = consume_on
        self.confirmed: list[bytes] = []
        self.consumed: set[bytes] = set()

    def __enter__(self) -> Traffic:
        self.start(self._publish, "publish")
        self.start(self._consume, "consume")
        return self

    def _publish(self) -> None:
        with self.cluster.client(request_timeout_s=10.0) as client:
            publisher = client.publisher(QUEUE, window=1, enqueuer="replace-test")
            number = 0
            while not self.stop.is_set():
                body = b"m%d" % number
                number += 1
                try:
                    publisher.publish(body, timeout_s=10.0)
                    publisher.wait_for_confirms(10.0)
                except ClusterError as err:  # outcome unknown: not counted as confirmed
                    self.failed(f"publish {body!r}: {err}")
                    continue
                self.confirmed.append(body)
                self.stop.wait(0.01)

    def _consume(self) -> None:
        with self.cluster.client(self.consume_on, request_timeout_s=10.0) as client:
            consumer = client.consume(QUEUE, prefetch=10)
            while not self.stop.is_set():
                try:
                    message = consumer.get(timeout_s=0.2)
                except ClusterError as err:
                    self.failed(f"consume: {err}")
                    continue
                if message is None:  # none yet, or none ever again (the client gave up)
                    self.stop.wait(0.05)
                    continue
                self.consumed.add(message.body)
                try:
                    message.ack()
                except ClusterError as err:
                    self.failed(f"ack {message.body!r}: {err}")


def drain(cluster: LocalCluster) -> set[bytes]:
    """Everything left in the queue, read (and acked) through the leader."""
    got: set[bytes] = set()
    with cluster.client() as client:
        consumer = client.consume(QUEUE, prefetch=100)
        while (message := consumer.get(timeout_s=2.0)) is not None:
            got.add(message.body)
            message.ack()
        consumer.flush_acks()
    return got


def add_n4(cluster: LocalCluster) -> tuple[int, str, str, str]:
    raft_port, client_port = free_ports(2)
    raft, client = f"127.0.0.1:{raft_port}", f"127.0.0.1:{client_port}"
    code, out = quorumq(
        cluster.data_dir, "member", "add", "n4", "--raft-address", raft, "--client-address", client
    )
    return code, out, raft, client


def applied(cluster: LocalCluster, node_id: str) -> int:
    status = node_status(cluster.config.node(node_id), cluster.key, timeout_s=2.0) or {}
    return int(status.get("raft_last_applied") or 0)


def _replace_under_traffic(
    cluster: LocalCluster, traffic: Traffic, leader: str, victim: str
) -> None:
    """With traffic flowing: add n4 (from the leader's snapshot, then the log), then remove
    and stop `victim`; traffic goes on after each step."""
    wait_until(lambda: len(traffic.confirmed) >= 50, 60, "traffic before the change")
    raw = cluster.raw_client(leader)
    raw.admin("snapshot")  # the new node must be rebuilt from a snapshot, then the log
    raw.close()
    code, out, _raft, _client = add_n4(cluster)
    assert code == 0, out
    cluster.reload()
    cluster.start_node("n4")
    target = applied(cluster, leader)
    wait_until(lambda: applied(cluster, "n4") >= target, 60, "n4 catching up")
    n4_log = (cluster.config.node("n4").data_dir / "node.log").read_text()
    assert '"snapshot_loaded"' in n4_log  # rebuilt from the leader's snapshot, then the log
    settled = len(traffic.confirmed)
    wait_until(lambda: len(traffic.confirmed) >= settled + 30, 60, "traffic with n4")
    code, out = quorumq(cluster.data_dir, "member", "remove", victim)
    assert code == 0, out
    cluster.terminate(victim)
    cluster.reload()
    assert sorted(cluster.config.node_ids()) == sorted({"n1", "n2", "n3", "n4"} - {victim})
    settled = len(traffic.confirmed)
    wait_until(lambda: len(traffic.confirmed) >= settled + 30, 60, "traffic after the removal")


def test_replacing_n3_by_n4_under_traffic_loses_nothing_and_ends_with_equal_digests(
    cluster3: LocalCluster,
) -> None:
    """add n4 (rebuilt from a snapshot and the log), remove n3 and stop it, with a publisher
    and a consumer running: every confirmed message is consumed or still in the queue, and
    n1, n2, n4 reach the same digest at the same applied index; after a restart of every node
    the member set is still n1, n2, n4 (members file, cluster.toml)."""
    leader = cluster3.leader()
    victim = next(n for n in ("n3", "n2", "n1") if n != leader)
    with cluster3.client() as client:
        client.declare_queue(QUEUE)
    with Traffic(cluster3, consume_on=victim) as traffic:
        _replace_under_traffic(cluster3, traffic, leader, victim)
    left = drain(cluster3)
    lost = set(traffic.confirmed) - traffic.consumed - left
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    statuses = cluster3.converged(timeout_s=30)
    assert set(statuses) == set(cluster3.config.node_ids())
    assert {s["last_applied"] for s in statuses.values()} == {statuses["n4"]["last_applied"]}
    assert {tuple(s["members"]) for s in statuses.values()} == {tuple(sorted(statuses))}
    for node_id in statuses:
        member_set = membership.read_member_set(cluster3.data_dir / node_id)
        assert member_set is not None and member_set.ids() == sorted(statuses)
    cluster3.stop()
    for node_id in cluster3.config.node_ids():
        cluster3.start_node(node_id)
    before = statuses["n4"]["last_applied"]

    def replayed() -> dict[str, dict[str, Any]] | None:
        after = cluster3.converged(timeout_s=60)
        return after if all(int(s["last_applied"]) >= before for s in after.values()) else None

    after = wait_until(replayed, 60, "every node replayed its journal")
    assert {tuple(s["members"]) for s in after.values()} == {tuple(sorted(statuses))}


def test_refusals_are_clear_and_change_nothing(cluster3: LocalCluster) -> None:
    """Duplicate id or address, a non-member, the leader itself, the last member: refused
    with a reason, and the member set is unchanged."""
    leader = cluster3.leader()
    n1 = cluster3.config.node("n1")
    cases: list[tuple[list[str], int, str]] = [
        (["add", "n1", "--raft-address", "127.0.0.1:1", "--client-address", "127.0.0.1:2"],
         64, "already in the cluster config"),
        (["add", "n9", "--raft-address", n1.raft_address, "--client-address", "127.0.0.1:2"],
         65, f"n1 already uses {n1.raft_address}"),
        (["add", "n9", "--raft-address", "127.0.0.1:1", "--client-address", n1.client_address],
         65, f"n1 already uses {n1.client_address}"),
        (["remove", "n9"], 65, "n9 is not a member"),
        (["remove", leader], 65, "could not lose another member"),
        (["remove", leader, "--force"], 69, f"{leader} leads the cluster and cannot remove itself"),
        (["add", "bad id!", "--raft-address", "127.0.0.1:1", "--client-address", "127.0.0.1:2"],
         64, "bad node id"),
    ]  # fmt: skip
    for args, code, message in cases:
        got, out = quorumq(cluster3.data_dir, "member", *args)
        assert (got, message in out) == (code, True), out
    statuses = cluster3.converged()
    assert {tuple(s["members"]) for s in statuses.values()} == {("n1", "n2", "n3")}
    assert sorted(cluster3.reload().node_ids()) == ["n1", "n2", "n3"]


def test_adding_a_member_is_refused_without_a_quorum_then_dead_n3_is_replaced(
    cluster3: LocalCluster,
) -> None:
    """n3 dead: adding n4 would leave 2 of 4 answering (refused, exit 69, with the procedure);
    removing the dead n3 first works, then n4 is added and catches up."""
    leader = cluster3.leader()
    dead = next(n for n in ("n3", "n2", "n1") if n != leader)
    cluster3.kill(dead)
    with cluster3.client() as client:
        client.declare_queue(QUEUE)
        for number in range(20):
            client.publisher(QUEUE).publish(b"x%d" % number)

    def refused_for_quorum() -> str | None:
        code, out, _raft, _client = add_n4(cluster3)
        assert code != 0, out  # never added while a majority of the new set cannot answer
        return out if code == 69 and "no quorum" in out else None

    out = wait_until(refused_for_quorum, 30, "the leader to see the dead node gone")
    assert "remove a dead member before adding its replacement" in out
    code, out = quorumq(cluster3.data_dir, "member", "remove", dead)
    assert code == 0, out
    code, out, _raft, _client = add_n4(cluster3)
    assert code == 0, out
    cluster3.reload()
    cluster3.start_node("n4")
    statuses = cluster3.converged(timeout_s=60)
    assert set(statuses) == {"n1", "n2", "n3", "n4"} - {dead}
    assert {tuple(s["members"]) for s in statuses.values()} == {tuple(sorted(statuses))}


def test_a_second_change_is_refused_while_the_first_is_in_flight(cluster3: LocalCluster) -> None:
    """One follower paused, so `add n4` (n4 never started) cannot commit at once: a second
    change sent to the leader meanwhile is refused as in flight; once the follower resumes,
    the first one commits."""
    leader = cluster3.leader()
    paused = next(n for n in ("n3", "n2", "n1") if n != leader)
    other = next(n for n in ("n1", "n2", "n3") if n not in (leader, paused))
    raft_port, client_port = free_ports(2)
    add: dict[str, str | int] = {
        "node": "n4",
        "raft_address": f"127.0.0.1:{raft_port}",
        "client_address": f"127.0.0.1:{client_port}",
    }
    first: list[dict[str, object]] = []
    with (
        cluster3.client(leader, only=True, request_timeout_s=40.0) as one,
        cluster3.client(leader, only=True, request_timeout_s=40.0) as two,
    ):
        cluster3.kill(paused, signal.SIGSTOP)
        try:
            thread = threading.Thread(
                target=lambda: first.append(one.admin("member_add", add)), daemon=True
            )
            thread.start()

            def appended() -> bool:  # the leader appended the change; it waits for a quorum
                return bool(two.status().get("membership_change_pending"))

            wait_until(appended, 5, "the first change in the leader's log")
            second = two.admin("member_remove", {"node": other, "force": True})
        finally:
            cluster3.kill(paused, signal.SIGCONT)
        thread.join(60)
    assert second["changed"] is False and second["unavailable"] is True, second
    assert "another membership change is in flight" in str(second["refused"]), second

    def n4_member() -> bool:
        statuses = [s for s in cluster3.statuses().values() if s is not None]
        return len(statuses) == 3 and all("n4" in s["members"] for s in statuses)

    wait_until(n4_member, 60, "the first change applied everywhere")


def test_the_last_member_cannot_be_removed(tmp_path: Path) -> None:
    """A single-node cluster: removing its only member is refused (exit 65), nothing changes."""
    cluster = start_cluster(tmp_path / "D", nodes=1)
    try:
        code, out = quorumq(cluster.data_dir, "member", "remove", "n1")
        assert code == 65 and "n1 is the last member" in out, out
        assert cluster.converged()["n1"]["members"] == ["n1"]
    finally:
        cluster.stop()
