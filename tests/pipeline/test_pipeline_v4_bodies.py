"""Machine v4 logs (bodies stay in the log, issue 32) through the pipeline: the same workload
at v3 and at v4 replays to the same facts (counts, body bytes, deliveries), without Spark and on
real Spark local mode through `quorumq pipeline analyze`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

import fifo
from cluster.cli.exits import USAGE, CliError
from cluster.cli.main import cli
from cluster.node.server import UNRELEASED_FLAG
from fifo.bodies import referenced_bodies
from fifo.commands import (
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    Settle,
    SimplePrefetch,
)
from fifo.fuzz import generator
from fifo.fuzz.runner import run_with_log
from fifo.meta import Meta
from pipeline.logscan import Groups, parse_chunk, scan_log
from pipeline.replay import GroupReplay, merged_digest
from pipeline.workload import write_log
from raft import SUB_INDEX_SPAN
from tests.fifo.unreleased_machine import register as register_unreleased
from tests.pipeline.test_pipeline_replay import _grouped_entries, replay_groups

LOG_BYTES = 120_000  # ~1,000 commands: a second of replay, a few of Spark


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same seeded workload written at machine v3 and at v4 (the same commands: the
    workload's consumers see v4's deliveries by reference as v3's)."""
    root = tmp_path_factory.mktemp("v4logs")
    out, counts = {}, {}
    for version in (3, 4):
        out[version] = root / f"v{version}.log"
        stats = write_log(out[version], LOG_BYTES, seed=7, services=3, machine_version=version)
        counts[version] = stats.counts
    assert counts[3] == counts[4] and counts[4]["Settle"] > 0
    return out


def replay_log(log: Path) -> tuple[str, Counter[str], list[dict[str, Any]]]:
    """Replay a whole log per queue group, in process: (merged digest, stats, message rows)."""
    plan = scan_log(log, chunk_bytes=32 * 1024)
    rows = [row for start, end in plan.chunks for row in parse_chunk(str(log), start, end)]
    groups = Groups()
    for kind, queue, target, *_ in rows:
        if queue is not None:
            groups.find(queue)
            if kind == "link" and target is not None:
                groups.link(queue, target)
    entries: list[tuple[str, Any]] = [("cmd", tuple(r[3:])) for r in rows if r[0] == "cmd"]
    entries += [("up", u) for u in plan.upgrades]
    entries.sort(key=lambda e: e[1].index if e[0] == "up" else e[1][0])
    out, table_rows = replay_groups(entries, groups.members(), plan.initial_version)
    assert plan.end is not None and plan.end["fifo_digest"]
    assert merged_digest(out["parts"], plan.upgrades[-1].to_version) == plan.end["fifo_digest"]
    messages = [row for table, row in table_rows if table == "messages"]
    return plan.end["fifo_digest"], out["stats"], messages


def facts(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What must not depend on where the bodies are kept."""
    return {
        "messages": len(messages),
        "body_bytes": sum(r["body_bytes"] for r in messages),
        "deliveries": sum(r["delivery_count"] for r in messages),
        "outcomes": Counter(str(r["outcome"]) for r in messages),
        "returns": sum(r["returns"] + r["timeouts"] + r["consumer_gone"] for r in messages),
    }


def test_the_workload_at_v4_gives_the_same_commands_as_at_v3(logs: dict[int, Path]) -> None:
    plans = {version: scan_log(path) for version, path in logs.items()}
    assert [u.to_version for u in plans[4].upgrades] == [4]
    assert plans[3].commands == plans[4].commands > 500


def test_a_v4_log_replays_to_the_same_facts_and_bytes_as_v3(logs: dict[int, Path]) -> None:
    digest3, stats3, rows3 = replay_log(logs[3])
    digest4, stats4, rows4 = replay_log(logs[4])
    assert digest3 != digest4  # the states differ (references), the facts must not
    assert stats3["resyncs"] == stats4["resyncs"] == 0
    assert stats4["errors"] == stats3["errors"]
    v3, v4 = facts(rows3), facts(rows4)
    assert v3 == v4
    assert v4["deliveries"] > 0 and v4["outcomes"]["acked"] > 0
    assert v4["body_bytes"] > 16 * v4["messages"]  # bodies are 16..160 bytes
    by_seq3 = {(r["queue"], r["seq"]): r["body_bytes"] for r in rows3}
    assert by_seq3 == {(r["queue"], r["seq"]): r["body_bytes"] for r in rows4}


@pytest.mark.parametrize("seed", range(6))
def test_a_v4_fuzz_log_gives_the_facts_of_the_same_commands_applied_at_v3(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fuzz logs at v4 (every command type, dequeues, dead-lettering, groups): replayed per
    group they reproduce the machine, and their rows equal those of the same commands applied
    at v3. Counting only v3's `Deliver` / `DequeueOk` broke this (rows differ, resyncs). The
    settles stay plain: v4 refuses another connection's bound settle, which v3 cannot express
    (v4's owner rule is tested in tests/fifo/test_v4_owners.py), and no exchange command is
    drawn: v3 has none, and the per-group replay does not merge them yet
    (tests/pipeline/test_pipeline_replay.py pins that)."""
    monkeypatch.setattr(generator, "BOUND_SETTLES_SINCE_VERSION", 5)
    monkeypatch.setattr(generator, "EXCHANGES_SINCE_VERSION", 5)
    log, result = run_with_log(seed, 300, 4)
    entries, groups = _grouped_entries(log)
    out4, rows4 = replay_groups(entries, groups.members(), 4)
    assert merged_digest(out4["parts"], 4) == result.digest
    at_v3 = [(kind, (*item[:3], 3, item[4]) if kind == "cmd" else item) for kind, item in entries]
    out3, rows3 = replay_groups(at_v3, groups.members(), 3)
    assert out4["stats"]["resyncs"] == out3["stats"]["resyncs"] == 0
    facts4 = sorted(repr(sorted(row.items())) for table, row in rows4 if table != "state")
    assert facts4 == sorted(repr(sorted(row.items())) for table, row in rows3 if table != "state")
    assert any(table == "messages" and row["delivery_count"] for table, row in rows4)


def _analyze(log: Path, out: Path) -> dict[str, Any]:
    result = CliRunner().invoke(
        cli,
        ["-o", "json", "pipeline", "analyze", "--log", str(log), "--out", str(out),
         "--master", "local[2]"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output + str(result.exception)
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def _parquet_totals(spark: SparkSession, out: Path) -> dict[str, Any]:
    messages = spark.read.parquet(str(out / "messages.parquet"))
    rates = spark.read.parquet(str(out / "queue_rates.parquet"))
    consumers = spark.read.parquet(str(out / "consumers.parquet"))
    m = messages.agg({"body_bytes": "sum", "delivery_count": "sum", "seq": "count"}).first()
    r = rates.agg({"published": "sum", "delivered": "sum", "acked": "sum"}).first()
    c = consumers.agg({"deliveries": "sum", "acks": "sum"}).first()
    assert m is not None and r is not None and c is not None
    return {**m.asDict(), **r.asDict(), **c.asDict()}


def test_pipeline_analyze_on_a_v4_export_counts_what_the_v3_workload_did(
    spark: SparkSession, logs: dict[int, Path], tmp_path: Path
) -> None:
    """`quorumq pipeline analyze` (real Spark, local[2]) on the v4 export: its summary and
    tables hold the counts and body bytes of the same workload at v3 (replayed in process
    here: the same replay Spark runs, whose v3 results the other pipeline tests pin)."""
    _, _, rows3 = replay_log(logs[3])
    v3 = facts(rows3)
    summary = _analyze(logs[4], tmp_path / "out")
    assert summary["replay_check"]["equal"], summary["replay_check"]
    assert summary["replay_check"]["resyncs"] == 0
    assert summary["upgrades"][-1]["to"] == 4
    assert summary["totals"]["messages"] == v3["messages"]
    assert summary["totals"]["deliveries"] == v3["deliveries"]
    assert {k: v for k, v in summary["outcomes"].items() if v} == {
        "queued" if k == "None" else k: v for k, v in v3["outcomes"].items()
    }
    totals = _parquet_totals(spark, tmp_path / "out")
    assert totals["count(seq)"] == v3["messages"]
    assert totals["sum(body_bytes)"] == v3["body_bytes"] > 0
    assert totals["sum(delivery_count)"] == totals["sum(delivered)"] == v3["deliveries"]
    assert totals["sum(deliveries)"] == v3["deliveries"]
    assert totals["sum(acked)"] == totals["sum(acks)"] == v3["outcomes"]["acked"]


def test_the_upgrade_dry_run_of_a_v4_export_replays_it_to_its_digest(
    logs: dict[int, Path],
) -> None:
    """The dry run of a v4 export to v4, the newest released version: nothing to upgrade, but
    the whole v4 log is replayed."""
    result = CliRunner().invoke(
        cli,
        ["-o", "json", "machine", "upgrade", "--dry-run", "--log", str(logs[4]), "--to",
         str(fifo.LATEST_VERSION)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output + str(result.exception)
    report = json.loads(result.stdout)
    plan = scan_log(logs[4])
    assert report["safe"] and report["from_version"] == 4
    assert report["commands"] == plan.commands and not report["baseline_errors"]
    assert plan.end is not None and report["baseline_digest"] == plan.end["fifo_digest"]


def test_the_upgrade_dry_run_of_a_v3_export_to_v4_is_safe(
    logs: dict[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """v4 is released: `--to 4` needs no flag, and every split point of the v3 log upgraded to
    v4 answers as v3 did. An unreleased version (a test-only machine past v4) is a usage error
    naming the flag, as for a node, and is dry-run with it."""
    args = ["-o", "json", "machine", "upgrade", "--dry-run", "--log", str(logs[3]), "--to", "4"]
    monkeypatch.delenv(UNRELEASED_FLAG, raising=False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output + str(result.exception)
    report = json.loads(result.stdout)
    assert report["safe"] and (report["from_version"], report["to_version"]) == (3, 4)
    statuses = Counter(split["status"] for split in report["splits"])
    assert statuses["ok"] > 10 and set(statuses) == {"ok"}
    assert sum(split["replies_compared"] for split in report["splits"]) > 0
    unreleased = register_unreleased(monkeypatch)
    args[-1] = str(unreleased)
    refused = CliRunner().invoke(cli, args)
    assert isinstance(refused.exception, CliError) and refused.exception.exit_code == USAGE
    assert UNRELEASED_FLAG in str(refused.exception)
    monkeypatch.setenv(UNRELEASED_FLAG, "1")
    result = CliRunner().invoke(cli, [*args, "--every", "200"])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert json.loads(result.stdout)["to_version"] == unreleased


def test_an_export_starting_from_a_v4_snapshot_sizes_its_messages_from_the_references() -> None:
    """A trimmed log's export starts from a snapshot; at v4 its messages are references (the
    snapshot writes [ref, size] in the body's place): their rows carry the recorded sizes,
    ready and checked out alike, and the replay goes on from there."""
    state = fifo.init_state(4)
    conn = ConnectionId("n1", 1, 1)
    commands: list[Command] = [DeclareQueue("q", QueueConfig())]
    commands += [Enqueue("q", b"b" * size) for size in (5, 70, 300)]
    commands += [Checkout("q", ConsumerId("c", conn), SimplePrefetch(1))]
    for position, command in enumerate(commands, start=1):
        fifo.apply(Meta(position * SUB_INDEX_SPAN, 1, 1_000, 4), command, state)
    assert referenced_bodies(state) == (3, 375)
    replay = GroupReplay(["q"], 4, fifo.snapshot(state))
    key = next(iter(replay.state.queues["q"].consumers))
    settle = fifo.encode(Settle("q", key, (0,)))
    replay.command(9 * SUB_INDEX_SPAN, 1, 2_000, 4, settle)
    rows = [row for table, row in replay.finish() if table == "messages"]
    assert sorted((r["body_bytes"], r["source"], r["outcome"]) for r in rows) == [
        (5, "snapshot", "acked"), (70, "snapshot", None), (300, "snapshot", None),
    ]  # fmt: skip
    assert replay.stats["resyncs"] == 0 and replay.stats["errors"] == 0
