"""Acceptance: a known workload on a real 3-node cluster, exported, analysed with exact counts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.launcher import LocalCluster, start_cluster, wait_until
from cluster.rawclient import RawClient
from fifo.commands import (
    Cancel,
    Checkout,
    ConsumerId,
    DeclareQueue,
    Discard,
    Enqueue,
    QueueConfig,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver, Released
from fifo.replies import CheckoutOk, Ok

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(240)]


def invoke(*args: str) -> tuple[int, str]:
    """Run the CLI like `main()`; stdout only (progress goes to stderr)."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None:
        raise result.exception
    print(result.stderr)
    return 0, result.stdout


def delivered(client: RawClient, queue: str, tag: str, count: int) -> list[int]:
    """The msg ids delivered so far to consumer `tag` of `queue`, once there are `count`."""

    def ids() -> list[int] | None:
        found = [
            d.msg_id
            for e in client.read_effects(len(client.effects) + 1, 0.1)
            if isinstance(e, Deliver) and e.queue == queue and e.tag == tag
            for d in e.messages
        ]
        return found if len(found) >= count else None

    result: list[int] = wait_until(ids, 10, f"{count} deliveries to {tag}")
    return result


def checkout(client: RawClient, queue: str, tag: str, prefetch: int, **kw: Any) -> Any:
    reply = client.command(
        Checkout(queue, ConsumerId(tag, client.connection), SimplePrefetch(prefetch), **kw)
    )
    assert isinstance(reply, CheckoutOk), reply
    return reply.consumer_key


def record_workload(cluster: LocalCluster) -> None:
    """8 published on `work` (7 acked, 2 returned, 1 dead-lettered into `dlx`); 1 on `slow`
    (a consumer timeout, then acked by another consumer); 3 on the SAC queue `sac` (one SAC
    hand-over when the active consumer cancels)."""
    client = cluster.raw_client(cluster.leader())
    wait_until(lambda: client.query("machine")["effective_version"] >= 2, 15, "machine v2")
    for command in (
        DeclareQueue("dlx"),
        DeclareQueue("work", QueueConfig(dead_letter_queue="dlx")),
        DeclareQueue("slow"),
        DeclareQueue("sac", QueueConfig(single_active_consumer=True)),
    ):
        client.command(command)
    c1 = checkout(client, "work", "c1", 20)
    for i in range(8):
        assert client.command(Enqueue("work", b"w%d" % i)) == Ok()
    ids = delivered(client, "work", "c1", 8)
    assert client.command(Settle("work", c1, tuple(ids[:5]))) == Ok()
    assert client.command(Return("work", c1, tuple(ids[5:7]))) == Ok()
    assert client.command(Discard("work", c1, (ids[7],))) == Ok()
    again = delivered(client, "work", "c1", 10)[8:]
    assert client.command(Settle("work", c1, tuple(again))) == Ok()

    checkout(client, "slow", "c3", 1, timeout_ms=500)
    assert client.command(Enqueue("slow", b"s")) == Ok()
    delivered(client, "slow", "c3", 1)
    wait_until(
        lambda: any(isinstance(e, Released) for e in client.read_effects(999, 0.2)), 15, "timeout"
    )
    c4 = checkout(client, "slow", "c4", 1)
    [taken] = delivered(client, "slow", "c4", 1)
    assert client.command(Settle("slow", c4, (taken,))) == Ok()

    s1 = checkout(client, "sac", "s1", 5)
    s2 = checkout(client, "sac", "s2", 5)
    for i in range(2):
        assert client.command(Enqueue("sac", b"a%d" % i)) == Ok()
    assert client.command(Settle("sac", s1, tuple(delivered(client, "sac", "s1", 2)))) == Ok()
    client.command(Checkout("sac", ConsumerId("s1", client.connection), Cancel()))
    assert client.command(Enqueue("sac", b"a2")) == Ok()
    assert client.command(Settle("sac", s2, tuple(delivered(client, "sac", "s2", 1)))) == Ok()
    client.close()


def export_all(cluster: LocalCluster, out: Path) -> None:
    """Every node's export once the cluster is quiet (retried if an entry lands meanwhile)."""
    out.mkdir()
    for node in ("n1", "n2", "n3"):
        for _attempt in range(5):
            before = _applied(cluster)
            code, output = invoke(
                "log", "export", "--data-dir", str(cluster.data_dir), "--node", node,
                "--out", str(out / f"{node}.log"),
            )  # fmt: skip
            assert code == 0, output
            if _applied(cluster) == before:
                break
            time.sleep(0.5)


@pytest.mark.parametrize("version", [3, 4])
def test_analyze_reports_the_exact_counts_of_a_real_cluster_workload(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    """The same counts whatever the machine version: at v4 (issue 32) the export's messages
    keep their bodies in the log, and the analysis takes their sizes from the references."""
    cluster = start_cluster(tmp_path / "D", nodes=3, max_machine_version=version)
    try:
        client = cluster.raw_client(cluster.leader())
        wait_until(lambda: client.query("machine")["effective_version"] == version, 30,
                   f"machine v{version}")  # fmt: skip
        client.close()
        record_workload(cluster)
        export_all(cluster, tmp_path / "exports")
    finally:
        cluster.stop()
    out = tmp_path / "analytics"
    code, output = invoke(
        "-o", "json", "pipeline", "analyze", "--log", str(tmp_path / "exports"), "--out", str(out)
    )
    assert code == 0, output
    summary = json.loads(output)
    assert summary["replay_check"]["equal"], summary["replay_check"]
    assert summary["replay_check"]["resyncs"] == 0
    assert "not used" in summary["log_chosen"]  # three exports: one used, the others named
    assert summary["upgrades"][-1]["to"] == version

    messages = {(r["queue"], r["seq"]): r for r in _rows(spark, out / "messages.parquet")}
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for row in messages.values():
        by_queue.setdefault(row["queue"], []).append(row)
    work = by_queue["work"]
    assert len(work) == 8 and all(r["source"] == "publish" for r in work)
    assert sorted(str(r["outcome"]) for r in work) == ["acked"] * 7 + ["dead_lettered"]
    assert sum(r["returns"] for r in work) == 2
    assert sum(r["delivery_count"] for r in work) == 10
    assert sum(r["body_bytes"] for r in work) == 16  # b"w0" .. b"w7"
    [dead] = [r for r in work if r["outcome"] == "dead_lettered"]
    assert (dead["outcome_reason"], dead["dead_letter_target"]) == ("rejected", "dlx")
    [moved] = by_queue["dlx"]
    assert (moved["source"], moved["dead_lettered_from"], moved["outcome"]) == (
        "dead_letter", "work", None,
    )  # fmt: skip
    [slow] = by_queue["slow"]
    assert (slow["timeouts"], slow["delivery_count"], slow["outcome"]) == (1, 2, "acked")
    assert [d["consumer"].split("@")[0] for d in slow["deliveries"]] == ["c3", "c4"]
    assert sorted(str(r["outcome"]) for r in by_queue["sac"]) == ["acked"] * 3

    consumers = {
        (r["queue"], r["consumer"].split("@")[0]): r
        for r in _rows(spark, out / "consumers.parquet")
    }
    assert consumers[("work", "c1")]["deliveries"] == 10
    assert consumers[("work", "c1")]["acks"] == 7
    assert consumers[("work", "c1")]["returns"] == 2
    assert consumers[("slow", "c3")]["timeouts"] == 1
    assert consumers[("slow", "c4")]["acks"] == 1
    assert consumers[("sac", "s2")]["handovers_in"] == 1
    assert consumers[("sac", "s1")]["handovers_out"] == 1
    assert consumers[("sac", "s1")]["acks"] == 2 and consumers[("sac", "s2")]["acks"] == 1
    assert consumers[("sac", "s1")]["cancel_reason"] == "cancel"

    rates: dict[str, dict[str, int]] = {}
    for row in _rows(spark, out / "queue_rates.parquet"):
        sums = rates.setdefault(row["queue"], {})
        for column in ("published", "delivered", "acked", "returned", "dead_lettered"):
            sums[column] = sums.get(column, 0) + row[column]
    assert rates["work"] == {
        "published": 8, "delivered": 10, "acked": 7, "returned": 2, "dead_lettered": 1,
    }  # fmt: skip
    assert (rates["slow"]["published"], rates["slow"]["acked"], rates["slow"]["returned"]) == (
        1, 1, 1,
    )  # fmt: skip
    assert (rates["sac"]["published"], rates["sac"]["acked"]) == (3, 3)

    latency = {(r["queue"], r["measure"]): r for r in _rows(spark, out / "latency.parquet")}
    assert latency[("work", "ack")]["count"] == 7
    assert latency[("*", "ack")]["count"] == 11
    assert latency[("*", "first_delivery")]["count"] == 12
    report = (out / "report.md").read_text()
    assert "![rates](rates.png)" in report
    for plot in ("rates", "depth", "latency_histogram", "redelivery_causes"):
        assert (out / f"{plot}.png").stat().st_size > 1000


def _applied(cluster: LocalCluster) -> set[tuple[Any, Any]]:
    return {(s["last_applied"], s["digest"]) for s in cluster.converged().values() if s}


def _rows(spark: SparkSession, path: Path) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in spark.read.parquet(str(path)).collect()]
