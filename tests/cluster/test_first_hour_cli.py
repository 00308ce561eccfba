"""Issue 34: what a new user meets in the first hour, against three real node processes.

The README's commands run as written (the CLI in-process through click's runner, the nodes as
processes): a dead-letter queue named at declare exists afterwards and receives what is
rejected; a consume loop ends on an idle queue; `consume --count N` leaves nothing returned;
unknown queues exit 65 everywhere; `queue info` shows a grouped queue's policy and key;
`consume --group` joins a consumer group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from cluster import config as cluster_config
from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.client import AsyncClient
from cluster.errors import ConfigError
from cluster.launcher import LocalCluster, init_cluster, local_cluster, wait_until
from fifo.commands import QueueConfig
from tests.cluster.shells import Shells
from tests.must import must

pytestmark = pytest.mark.cluster


def quorumq(cluster: LocalCluster, *args: str) -> tuple[int, str]:
    """(exit code, stdout or the error message) of `quorumq --data-dir D ARGS`, as `main` exits."""
    result = CliRunner().invoke(
        cli, ["--data-dir", str(cluster.data_dir), *args], standalone_mode=False
    )
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, str(result.exception)
    if isinstance(result.exception, click.UsageError):
        return 64, result.exception.format_message()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout


def dead_lettered(cluster: LocalCluster, queue: str) -> int:
    """Messages in `queue`, once it holds some (waits for the dead-lettering to apply)."""

    def held() -> int | None:
        with cluster.client() as client:
            overview = client.overview(queue)
        return overview.total if overview is not None and overview.total else None

    return wait_until(held, 10.0, f"a message in {queue}")


def reject_one(client: Any, queue: str) -> None:
    consumer = client.consume(queue, prefetch=1)
    message = consumer.get(timeout_s=10.0)
    assert message is not None
    message.reject()
    consumer.wait_settled()
    consumer.cancel()


# --- item 1: the README's dead-letter example -------------------------------------------------


def test_readme_declare_with_a_dead_letter_queue_creates_it_and_a_reject_lands_there(
    shared_cluster3: LocalCluster,
) -> None:
    code, out = quorumq(
        shared_cluster3,
        "queue", "declare", "jobs", "--delivery-limit", "5", "--dead-letter-queue", "jobs.dlq",
    )  # fmt: skip
    assert code == 0, out
    assert "jobs.dlq" in out, out  # the user is told the target was created
    with shared_cluster3.client() as client:
        assert client.overview("jobs.dlq") is not None
        client.publish("jobs", b"doomed")
        reject_one(client, "jobs")
    assert dead_lettered(shared_cluster3, "jobs.dlq") == 1


def test_the_library_declare_creates_a_missing_dead_letter_queue_in_both_shells(
    shared_cluster3: LocalCluster, shells: Shells
) -> None:
    name = f"lib-{shells.kind}"
    with shells.client(shared_cluster3) as client:
        client.declare_queue(name, QueueConfig(dead_letter_queue=f"{name}.dlq"))
        assert client.overview(f"{name}.dlq") is not None
        client.publish(name, b"doomed")
        reject_one(client, name)
    assert dead_lettered(shared_cluster3, f"{name}.dlq") == 1


def test_declaring_with_an_existing_dead_letter_queue_keeps_it_as_it_is(
    shared_cluster3: LocalCluster,
) -> None:
    assert quorumq(shared_cluster3, "queue", "declare", "dlx", "--max-length", "7")[0] == 0
    code, out = quorumq(shared_cluster3, "queue", "declare", "src", "--dead-letter-queue", "dlx")
    assert code == 0, out
    assert "declared" in out and "dlx" not in out
    with shared_cluster3.client() as client:
        overview = client.overview("dlx")
        assert overview is not None and overview.config.max_length == 7


def test_deleting_a_dead_letter_queue_warns_that_its_sources_now_drop(
    shared_cluster3: LocalCluster,
) -> None:
    assert (
        quorumq(shared_cluster3, "queue", "declare", "orders", "--dead-letter-queue", "dead")[0]
        == 0
    )
    result = CliRunner().invoke(
        cli, ["--data-dir", str(shared_cluster3.data_dir), "queue", "delete", "dead"],
        standalone_mode=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning: orders dead-letter into dead" in result.stderr


# --- item 7: a consume loop that ends once the queue stays empty ------------------------------


def test_a_consume_loop_with_an_idle_timeout_ends_on_an_empty_queue(
    shared_cluster3: LocalCluster,
) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("idle")
        client.publish("idle", b"one")
        client.publish("idle", b"two")
        started = time.monotonic()
        bodies = []
        for message in client.consume("idle", prefetch=100).messages(idle_timeout_s=1.0):
            bodies.append(message.body)
            message.ack()
        assert bodies == [b"one", b"two"]
        assert time.monotonic() - started < 10.0


def test_an_async_consume_loop_with_an_idle_timeout_ends_on_an_empty_queue(
    shared_cluster3: LocalCluster,
) -> None:
    async def drain() -> list[bytes]:
        async with AsyncClient.from_data_dir(shared_cluster3.data_dir) as client:
            await client.declare_queue("idle-aio")
            await client.publish("idle-aio", b"one")
            bodies = []
            async for message in client.consume("idle-aio").messages(idle_timeout_s=1.0):
                bodies.append(message.body)
                await message.ack()
            return bodies

    assert asyncio.run(asyncio.wait_for(drain(), 30.0)) == [b"one"]


# --- item 8: an export after a compaction says what it lacks; a dry run of it is no "SAFE" ------


def test_an_export_after_a_snapshot_says_what_it_lacks_and_the_dry_run_refuses_it(
    shared_cluster3: LocalCluster, tmp_path: Path
) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("compacted")
        for number in range(20):
            client.publish("compacted", b"m%d" % number)
    node = shared_cluster3.config.node_ids()[0]
    with shared_cluster3.client(node, only=True) as client:
        client.admin("snapshot")
    out = tmp_path / "n.log"

    def exported_after_snapshot() -> str | None:
        code, text = quorumq(shared_cluster3, "log", "export", "--node", node, "--out", str(out))
        assert code == 0, text
        return text if "not exported: the commands of entries 1.." in text else None

    text = wait_until(exported_after_snapshot, 20.0, "an export that starts at a snapshot")
    assert "compacted into" in text
    if "(0 commands" in text:  # nothing came after the snapshot: the dry run must refuse
        code, output = quorumq(shared_cluster3, "machine", "upgrade", "--dry-run",
                               "--log", str(out), "--to", "3")  # fmt: skip
        assert code == 65 and "0 commands" in output, output


def test_snapshot_every_s_in_cluster_toml_sets_how_long_a_node_keeps_its_log(
    tmp_path: Path,
) -> None:
    """The retention setting is wired: at 1 s a node compacts on its own within seconds (at the
    default, 300 s, it would not); docs/upgrades.md raises it to keep traffic for a dry run."""
    data_dir = tmp_path / "D"
    config = init_cluster(data_dir, 1)
    cluster_config.write(data_dir, dataclasses.replace(config, snapshot_every_s=1))
    assert "snapshot_every_s = 1" in (data_dir / "cluster.toml").read_text()
    with local_cluster(data_dir, 1) as cluster:
        with cluster.client() as client:
            client.declare_queue("kept")
            client.publish("kept", b"one")
        out = tmp_path / "n1.log"

        def compacted() -> str | None:
            code, text = quorumq(cluster, "log", "export", "--node", "n1", "--out", str(out))
            assert code == 0, text
            return text if "not exported" in text else None

        wait_until(compacted, 20.0, "a compaction driven by snapshot_every_s")


def test_snapshot_every_s_is_bounded(tmp_path: Path) -> None:
    data_dir = tmp_path / "D"
    config = init_cluster(data_dir, 1)
    cluster_config.write(data_dir, dataclasses.replace(config, snapshot_every_s=0))
    with pytest.raises(ConfigError, match="snapshot_every_s must be within"):
        cluster_config.load(data_dir)


# --- item 11: `consume --count N` takes N messages and gives nothing back ----------------------


@pytest.mark.parametrize("flags", [(), ("--no-ack",), ("--prefetch", "3")], ids=str)
def test_consume_count_takes_exactly_n_and_returns_nothing(
    shared_cluster3: LocalCluster, flags: tuple[str, ...]
) -> None:
    queue = f"counted{len(flags)}{''.join(flags)}"
    with shared_cluster3.client() as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=100) as publisher:
            publisher.publish_many(b"m%d" % i for i in range(50))
    code, out = quorumq(shared_cluster3, "-o", "jsonl", "consume", queue, "--count", "10", *flags)
    assert code == 0, out
    assert len(out.strip().splitlines()) == 10
    with shared_cluster3.client() as client:
        overview = client.overview(queue)
        assert overview is not None
        assert (overview.total, overview.returned, overview.checked_out) == (40, 0, 0)
        consumer = client.consume(queue, prefetch=50)
        redelivered = [m for m in consumer.messages(idle_timeout_s=1.0) if m.delivery_count]
        assert redelivered == [], "surplus messages were counted as failed deliveries"


def test_cancel_after_process_stop_is_a_no_op(shared_cluster3: LocalCluster) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("processed")
        client.publish("processed", b"one")
        consumer = client.consume("processed")
        processing = consumer.process(lambda message: None, workers=1)
        assert processing.stop(drain=True)
        assert consumer.cancel() is None
        assert consumer.cancel() is None


def test_an_async_cancel_after_process_stop_is_a_no_op(shared_cluster3: LocalCluster) -> None:
    async def run() -> None:
        async with AsyncClient.from_data_dir(shared_cluster3.data_dir) as client:
            await client.declare_queue("processed-aio")
            consumer = client.consume("processed-aio")

            async def handler(message: Any) -> None:
                del message

            processing = await consumer.process(handler, workers=1)
            assert await processing.stop(drain=True)
            assert await consumer.cancel() is None

    asyncio.run(asyncio.wait_for(run(), 30.0))


# --- item 9: groups from the CLI ---------------------------------------------------------------


def test_queue_info_shows_the_group_policy_and_key(shared_cluster3: LocalCluster) -> None:
    code, out = quorumq(shared_cluster3, "queue", "declare", "grouped", "--group-policy",
                        "exclusive", "--group-key", "customer")  # fmt: skip
    assert code == 0, out
    code, out = quorumq(shared_cluster3, "-o", "json", "queue", "info", "grouped")
    assert code == 0, out
    info = json.loads(out)
    assert (info["group_policy"], info["group_key"]) == ("exclusive", "customer")
    assert quorumq(shared_cluster3, "queue", "declare", "plain")[0] == 0
    code, out = quorumq(shared_cluster3, "-o", "json", "queue", "info", "plain")
    assert json.loads(out)["group_policy"] == "none"


def test_consume_group_joins_a_consumer_group_and_takes_the_messages(
    shared_cluster3: LocalCluster,
) -> None:
    assert quorumq(shared_cluster3, "queue", "declare", "parted", "--partitions", "3")[0] == 0
    code, out = quorumq(shared_cluster3, "publish", "parted", "--count", "12")
    assert code == 0, out
    code, out = quorumq(shared_cluster3, "-o", "jsonl", "consume", "parted", "--group", "billing",
                        "--count", "12", "--timeout", "10")  # fmt: skip
    assert code == 0, out
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert len(rows) == 12
    assert {row["queue"] for row in rows} == {"parted.0", "parted.1", "parted.2"}
    with shared_cluster3.client() as client:
        assert sum(must(client.overview(f"parted.{i}")).total for i in range(3)) == 0


@pytest.mark.parametrize(
    ("args", "advice"),
    [
        (("consume", "parted"), "consume it with `--group NAME`"),
        (("consume", "parted.1"), "consume parted with `--group NAME`"),
        (("consume", "plain", "--group", "g"), "consume it without --group"),
    ],
)
def test_consume_errors_say_what_to_do_in_cli_terms(
    shared_cluster3: LocalCluster, args: tuple[str, ...], advice: str
) -> None:
    quorumq(shared_cluster3, "queue", "declare", "parted", "--partitions", "3")
    quorumq(shared_cluster3, "queue", "declare", "plain")
    code, message = quorumq(shared_cluster3, *args, "--timeout", "1")
    assert code == 65, message
    assert advice in message
    assert "Checkout" not in message and "JoinGroup" not in message


# --- item 11: an unknown queue exits 65 whatever the command -----------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "info", "nowhere"),
        ("queue", "groups", "nowhere"),
        ("queue", "purge", "nowhere"),
        ("queue", "delete", "nowhere"),
        ("consumer", "list", "nowhere"),
        ("publish", "nowhere", "--body", "x"),
        ("consume", "nowhere", "--timeout", "1"),
        ("consume", "nowhere", "--group", "g", "--timeout", "1"),
    ],
    ids=" ".join,
)
def test_an_unknown_queue_exits_65_everywhere(
    shared_cluster3: LocalCluster, args: tuple[str, ...]
) -> None:
    code, message = quorumq(shared_cluster3, *args)
    assert code == 65, (code, message)
    assert "nowhere" in message


def test_ready_in_queue_info_and_list_counts_returned_messages_as_metrics_does(
    shared_cluster3: LocalCluster,
) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("waiting")
        client.publish("waiting", b"a")
        client.publish("waiting", b"b")
        consumer = client.consume("waiting", prefetch=1)
        message = consumer.get(timeout_s=10.0)
        assert message is not None
        consumer.cancel()  # (else the returned message comes straight back to it)
        message.nack(requeue=True)
        consumer.wait_settled()
        wait_until(lambda: client.overview("waiting").returned == 1 or None, 10.0, "a return")  # type: ignore[union-attr]
    info = json.loads(quorumq(shared_cluster3, "-o", "json", "queue", "info", "waiting")[1])
    assert (info["ready"], info["returned"], info["total"]) == (2, 1, 2)
    rows = json.loads(quorumq(shared_cluster3, "-o", "json", "queue", "list")[1])
    (row,) = [row for row in rows if row["name"] == "waiting"]
    assert (row["ready"], row["returned"]) == (2, 1)


def test_a_wrong_key_is_said_once_not_twice(shared_cluster3: LocalCluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_text("ab" * 32 + "\n")
    endpoints = ",".join(shared_cluster3.config.endpoints().values())
    result = CliRunner().invoke(
        cli, ["--endpoints", endpoints, "--credentials", str(wrong), "queue", "list"],
        standalone_mode=False,
    )  # fmt: skip
    assert isinstance(result.exception, CliError)
    assert result.exception.exit_code == 77
    assert str(result.exception).lower().count("authentication failed") == 1, result.exception


def test_queue_info_warns_when_the_dead_letter_queue_is_missing(
    shared_cluster3: LocalCluster,
) -> None:
    assert (
        quorumq(shared_cluster3, "queue", "declare", "src2", "--dead-letter-queue", "gone")[0] == 0
    )
    assert quorumq(shared_cluster3, "queue", "delete", "gone")[0] == 0
    result = CliRunner().invoke(
        cli, ["--data-dir", str(shared_cluster3.data_dir), "queue", "info", "src2"],
        standalone_mode=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "dead-letter queue gone does not exist" in result.stderr
