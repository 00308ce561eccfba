"""Refusals of the upgrade protocol on real node processes.

A premature upgrade (a member still capped at 1) is refused with the reason; a node capped at 1
restarting into a v2 cluster is refused, stops applying before the first v2 entry, keeps its log,
says why in its status and never leads; restarted with newer code it catches up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import fifo
from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.client import Client
from cluster.client.errors import ClusterError, CommandRefused
from cluster.launcher import LocalCluster, init_cluster, set_node_cap, spawn_node, wait_for_leader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def wait_until(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (ClusterError, OSError, KeyError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def machine(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    with cluster.client(node_id, only=True, request_timeout_s=5.0) as client:
        return dict(client.machine())


def status(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    return next(row for row in cluster.status() if row["id"] == node_id)


def publish(client: Client, prefix: str, count: int) -> None:
    with client.publisher("jobs", window=count) as publisher:
        publisher.publish_many(b"%s-%d" % (prefix.encode(), i) for i in range(count))


def invoke(*args: str) -> tuple[int, str]:
    """Run the CLI like `main()`: a CliError becomes its exit code and message."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None:
        raise result.exception
    return 0, result.output


def start(data_dir: Path, caps: dict[str, int]) -> LocalCluster:
    """A 3-node cluster with per-node machine-version caps recorded in cluster.toml."""
    init_cluster(data_dir, 3)
    for node_id, cap in caps.items():
        set_node_cap(data_dir, node_id, cap)
    cluster = LocalCluster(data_dir)
    for node_id in cluster.config.node_ids():
        spawn_node(data_dir, node_id)
    wait_for_leader(cluster.config, cluster.key)
    return cluster


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "D"
    if (tmp_path / "D" / "cluster.toml").exists():
        LocalCluster(tmp_path / "D").stop()


def test_an_upgrade_is_refused_while_a_member_is_capped_at_1(data_dir: Path) -> None:
    cluster = start(data_dir, {"n3": 1})
    wait_until(lambda: len(machine(cluster, "n1")["supported"]) == 3, 20, "three hellos")
    code, output = invoke("--data-dir", str(data_dir), "machine", "upgrade", "--to", "2")
    assert code == 65
    assert "upgrade refused" in output and "n3 supports 1" in output
    with cluster.client("n1") as client, pytest.raises(CommandRefused, match="n3 supports 1"):
        client.admin("machine_upgrade", {"to": 2})
    time.sleep(1.0)  # the leader's timers must not upgrade on their own either
    code, output = invoke("--data-dir", str(data_dir), "-o", "json", "machine", "status")
    state = json.loads(output)
    assert code == 0
    assert (state["effective_version"], state["switches"]) == (1, [])
    latest = fifo.LATEST_VERSION  # n1 and n2 run today's code
    assert state["supported"] == {"n1": latest, "n2": latest, "n3": 1}
    cluster.restart("n3", max_machine_version=2)  # newer code: the upgrade follows by itself
    wait_until(lambda: machine(cluster, "n1")["effective_version"] == 2, 20, "the switch")
    code, output = invoke("--data-dir", str(data_dir), "machine", "status")
    switch_index = machine(cluster, "n1")["switches"][0]["index"]
    assert "effective machine version: 2" in output
    assert f"\n{switch_index}  " in output.replace("INDEX  VERSION", "")


def test_a_node_capped_at_1_restarting_into_a_v2_cluster_is_refused_and_never_leads(
    data_dir: Path,
) -> None:
    cluster = start(data_dir, {"n1": 2, "n2": 2, "n3": 2})  # a v2 cluster (v3 is newer)
    wait_until(lambda: machine(cluster, "n1")["effective_version"] == 2, 20, "automatic v2")
    switch = machine(cluster, "n1")["switches"][0]["index"]
    with cluster.client("n1") as client:
        client.declare_queue("jobs")
        publish(client, "before", 50)
    leader = cluster.leader()
    capped = next(n for n in cluster.config.node_ids() if n != leader)
    # its journal holds the switch to v2 as committed: restarted capped at 1, the node stops
    # applying while it replays it, before its hello could go out (the hello used to be
    # skipped then, and the leader never learned the refusal: a flake, by who won the race)
    wait_until(lambda: status(cluster, capped)["last_applied"] > switch, 20, "the switch applied")
    cluster.restart(capped, max_machine_version=1)

    def stopped() -> dict[str, Any] | None:
        row = status(cluster, capped)
        return row if row.get("role") == "stopped" else None

    row = wait_until(stopped, 20, f"{capped} to stop applying")
    assert "machine version 2 is effective" in row["reason"]
    assert "supports only up to 1" in row["reason"]
    assert row["last_applied"] < switch, "the capped node applied a v2 entry"
    assert wait_until(lambda: machine(cluster, leader)["refused"].get(capped) == 1, 10, "refusal")
    code, output = invoke("--data-dir", str(data_dir), "-o", "json", "cluster", "status")
    assert code == 0
    listed = {r["id"]: r for r in json.loads(output)}
    assert listed[capped]["role"] == "stopped"
    assert "restart it with newer code" in listed[capped]["reason"]

    # the log keeps growing on the capped node, which applies none of it and never leads
    leader = cluster.leader()
    survivor = next(n for n in cluster.config.node_ids() if n not in (leader, capped))
    cluster.kill(leader)
    assert cluster.leader(exclude=leader, timeout_s=20) == survivor
    with cluster.client(survivor, only=True) as client:
        publish(client, "after", 20)
    row = wait_until(
        lambda: (r := status(cluster, capped))["commit_index"] > switch + 1 and r, 10, "commits"
    )
    assert row["role"] == "stopped" and row["last_applied"] < switch
    assert (Path(data_dir) / capped / "raft.journal").stat().st_size > 0

    # newer code: it applies everything it kept and converges
    cluster.restart(capped, max_machine_version=2)
    cluster.restart(leader)

    def converged() -> bool:
        rows = cluster.status()
        return len({(r.get("last_applied"), r.get("digest")) for r in rows}) == 1

    wait_until(converged, 30, "equal digests after the capped node was upgraded")
    assert status(cluster, capped)["effective_machine_version"] == 2
