"""Partitioned queues through the CLI on a real 3-node cluster (machine v3): declare, publish to
the base name by key and round robin, `queue info`, refusals, and `queue delete` of the whole."""

from __future__ import annotations

import json
import time
from typing import Any

import click
import pytest
from click.testing import CliRunner

from cluster.cli.main import cli
from cluster.client import Client
from cluster.client.groups import partition_of
from cluster.launcher import LocalCluster

pytestmark = pytest.mark.cluster


def run(cluster: LocalCluster, *args: str) -> Any:
    """Run a CLI command with `-o json`; its parsed output."""
    result = CliRunner().invoke(cli, ["--data-dir", str(cluster.data_dir), "-o", "json", *args],
                                catch_exceptions=False, standalone_mode=False)  # fmt: skip
    return json.loads(result.output)


def refused(cluster: LocalCluster, *args: str) -> tuple[int, str]:
    """Run a CLI command expected to fail: its sysexits code and message."""
    from cluster.cli.exits import CliError

    result = CliRunner().invoke(cli, ["--data-dir", str(cluster.data_dir), *args],
                                standalone_mode=False)  # fmt: skip
    error = result.exception
    if isinstance(error, CliError):
        return error.exit_code, str(error)
    if isinstance(error, click.UsageError):
        return 64, error.format_message()
    raise AssertionError(f"expected a refusal, got {result.output!r} / {error!r}")


def totals(client: Client, base: str, partitions: int) -> list[int]:
    found = []
    for index in range(partitions):
        overview = client.overview(f"{base}.{index}")
        found.append(overview.total if overview is not None else -1)
    return found


@pytest.fixture
def v3(cluster3: LocalCluster) -> LocalCluster:
    with Client.from_data_dir(cluster3.data_dir, name="wait-v3") as client:
        deadline = time.monotonic() + 30  # a new cluster upgrades to machine v3 by itself
        while int(str(client.machine()["effective_version"])) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    return cluster3


def test_publish_to_a_partitioned_queue_by_key_and_round_robin_then_delete_it(
    v3: LocalCluster,
) -> None:
    """`publish NAME --key K` lands on NAME.<crc32(K) mod P> (and says so); without a key the
    messages spread round robin; `queue info` names the partitions; deleting one partition is
    refused; `queue delete NAME` removes all of them with their messages."""
    assert run(v3, "queue", "declare", "parted", "--partitions", "4")["created"] is True
    out = run(v3, "publish", "parted", "--count", "5", "--key", "customer-42")
    want = f"parted.{partition_of('customer-42', 4)}"
    assert out["confirmed"] == 5 and out["partitions"] == 4 and out["partition"] == want
    out = run(v3, "publish", "parted", "--count", "8")
    assert out["confirmed"] == 8 and "round robin" in out["routing"]
    with Client.from_data_dir(v3.data_dir, name="check") as client:
        expected = [2, 2, 2, 2]
        expected[int(want.rsplit(".", 1)[1])] += 5
        assert totals(client, "parted", 4) == expected
    info = run(v3, "queue", "info", "parted")
    assert info["partitioned"] is True and info["partitions"] == 4
    code, message = refused(v3, "queue", "delete", "parted.1")
    assert code != 0 and "delete 'parted'" in message
    deleted = run(v3, "queue", "delete", "parted")
    assert deleted == {"queue": "parted", "deleted": True, "messages": 13, "partitions": 4}
    names = [row["name"] for row in run(v3, "queue", "list")]
    assert not [name for name in names if name.startswith("parted")]
    code, message = refused(v3, "queue", "info", "parted")
    assert code == 65 and "no queue" in message  # exit 65 for an unknown queue (issue 34)


def test_publish_and_delete_help_teach_partitioned_queues() -> None:
    """The help of publish, queue declare and queue delete explains partitioned queues with an
    example."""
    for args, needle in ((["publish"], "--key customer-42"),
                         (["queue", "declare"], "--partitions 8"),
                         (["queue", "delete"], "partitioned")):  # fmt: skip
        result = CliRunner().invoke(cli, [*args, "--help"])
        assert result.exit_code == 0 and needle in result.output, (args, result.output)
