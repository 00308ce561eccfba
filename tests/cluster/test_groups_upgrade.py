"""Rolling machine upgrade v2 -> v3 under traffic, then message groups (issue 9, acceptance 2).

Three nodes start capped at version 2 (today's code minus v3). Before the upgrade a grouped
declare and a grouped publish are refused with a clear error (client and CLI). A producer and a
consumer run the whole time while the nodes restart one at a time with v3; the switch comes after
the last restart, nothing confirmed is lost, every replica ends on v3 with the same digest; then
a grouped queue works on the upgraded cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.client.errors import CommandRefused
from cluster.launcher import LocalCluster, local_cluster
from fifo.commands import GroupConfig
from tests.cluster.test_upgrade_rolling import QUEUE, Traffic, check_delivery, machine, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path / "D", 3, max_machine_version=2) as running:
        yield running


def invoke(*args: str) -> tuple[int, str]:
    """Run the CLI like `main()`: a CliError becomes its exit code and message."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None:
        raise result.exception
    return 0, result.output


def replicas_agree(cluster: LocalCluster) -> list[dict[str, Any]]:
    def same() -> list[dict[str, Any]] | None:
        rows = cluster.status()
        pairs = {(row.get("last_applied"), row.get("digest")) for row in rows}
        return rows if len(pairs) == 1 and None not in next(iter(pairs)) else None

    rows: list[dict[str, Any]] = wait_until(same, 20, "equal digests at the same applied index")
    return rows


def test_rolling_upgrade_2_to_3_under_traffic_then_groups(cluster: LocalCluster) -> None:
    data_dir = str(cluster.data_dir)
    nodes = cluster.config.node_ids()
    wait_until(lambda: all(machine(cluster, n)["effective_version"] == 2 for n in nodes), 20,
               "the automatic switch to v2")  # fmt: skip
    with cluster.client("n1") as client:
        client.declare_queue(QUEUE)
        with pytest.raises(CommandRefused, match="not a command of machine version 2"):
            client.declare_queue("orders", groups=GroupConfig())
        with pytest.raises(CommandRefused, match="not a command of machine version 2"):
            client.publish(QUEUE, b"grouped", group="g1")
    code, output = invoke("--data-dir", data_dir, "queue", "declare", "orders",
                          "--group-policy", "sequenced")  # fmt: skip
    assert code == 65 and "message groups need machine version 3" in output, output
    code, output = invoke("--data-dir", data_dir, "queue", "groups", QUEUE)
    assert code == 65 and "runs version 2" in output, output

    with Traffic(cluster) as traffic:
        time.sleep(1.0)
        for position, node_id in enumerate(nodes):
            commit_before = max(row.get("commit_index") or 0 for row in cluster.status())
            cluster.restart(node_id, max_machine_version=3)
            wait_until(
                lambda n=node_id: machine(cluster, n)["supported"].get(n) == 3, 20, "hello v3"
            )
            if position < len(nodes) - 1:
                time.sleep(1.0)  # the leader's timers had every chance to upgrade too early
                status = machine(cluster, node_id)
                assert status["effective_version"] == 2, f"switched too early: {status}"
        wait_until(lambda: all(machine(cluster, n)["effective_version"] == 3 for n in nodes), 20,
                   "v3")  # fmt: skip
        switches = machine(cluster, "n1")["switches"]
        assert [s["version"] for s in switches][-1] == 3
        assert switches[-1]["index"] > commit_before, "the switch predates the last restart"
        time.sleep(1.5)  # traffic runs on v3 for a while
    assert not traffic.errors, traffic.errors
    check_delivery(traffic)
    rows = replicas_agree(cluster)
    assert {row["effective_machine_version"] for row in rows} == {3}

    # groups work on the upgraded cluster
    code, output = invoke("--data-dir", data_dir, "queue", "declare", "orders",
                          "--group-policy", "sequenced")  # fmt: skip
    assert code == 0, output
    with cluster.client("n2") as client:
        with client.publisher("orders", window=50) as publisher:
            for n in range(40):
                publisher.publish(b"o-%02d" % n, group=f"g{n % 4}")
        consumer = client.consume("orders", prefetch=10)
        got: list[tuple[str | None, int]] = []
        while len(got) < 40:
            message = consumer.get(timeout_s=10)
            assert message is not None, f"only {len(got)} of 40 grouped messages arrived"
            got.append((message.group, int(message.body[2:])))
            message.ack()
        consumer.cancel()
        consumer.wait_settled()
        assert client.groups("orders") == []
    for group in ("g0", "g1", "g2", "g3"):
        numbers = [n for g, n in got if g == group]
        assert numbers == sorted(numbers) and len(numbers) == 10
    replicas_agree(cluster)
