"""The analyze replay without Spark: split by queue group, it reproduces the machine exactly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import cbor2
import pytest
from click.testing import CliRunner

import fifo
from cluster.cli.exits import USAGE, CliError
from cluster.cli.main import cli
from fifo.commands import (
    ConnectionDown,
    ConnectionId,
    DeclarePartitionedQueue,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    NodeDown,
    QueueConfig,
    UpdateConfig,
)
from fifo.fuzz.runner import Upgrade as FuzzUpgrade
from fifo.fuzz.runner import run_with_log
from pipeline.logscan import (
    PARTITIONED_ANCHOR,
    Groups,
    LogScanError,
    links_of,
    parse_chunk,
    pick_log,
    place,
    route,
    scan_log,
)
from pipeline.replay import GroupReplay, Upgrade, merged_digest
from pipeline.workload import write_log


def replay_groups(
    entries: list[tuple[str, Any]], members: dict[str, list[str]], version: int
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """Replay `entries` ("cmd", (index, term, ms, version, blob)) / ("up", Upgrade) per group."""
    parts: list[dict[str, Any]] = []
    rows: list[tuple[str, dict[str, Any]]] = []
    stats = Counter[str]()
    for names in members.values():
        group = GroupReplay(names, version)
        for kind, item in entries:
            if kind == "up":
                group.upgrade(item)
                continue
            queue, _, _ = route(item[4])
            if queue is None or queue in names:
                group.command(*item)
            rows += group.drain()
        for table, row in group.finish():
            (parts.append(row) if table == "state" else rows.append((table, row)))
        stats.update(group.stats)
    return {"parts": parts, "stats": stats}, rows


@pytest.mark.parametrize("seed", range(12))
def test_fuzz_logs_replayed_per_group_reproduce_the_machine(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random fuzz logs (every command type of v1-v3, upgrades, downs, timers): the merged group
    states equal the machine's final state, no resync, and every message still queued has a
    row. The fuzzer upgrades to v3 here: at v4 it draws exchange commands, which the per-group
    replay does not merge yet (`test_v4_fuzz_logs_with_exchanges_replay_per_group`)."""
    monkeypatch.setattr(fifo, "LATEST_VERSION", 3)  # where `run_with_log` upgrades to
    check_grouped_replay(seed)


@pytest.mark.parametrize("seed", [2, 7])
def test_v4_fuzz_logs_without_exchanges_replay_per_group(seed: int) -> None:
    """v1 logs upgraded to v4 (bodies by reference) whose v4 part drew no exchange command."""
    check_grouped_replay(seed)


@pytest.mark.xfail(strict=True, reason="pipeline/replay.py groups commands by queue: v4's "
                   "exchanges (bindings per group, auto-delete, one publish stored in queues "
                   "of several groups) are not merged per group yet")  # fmt: skip
def test_v4_fuzz_logs_with_exchanges_replay_per_group() -> None:
    """Known gap, pinned: a v4 log with exchange commands (seed 0) does not merge to the
    machine's digest."""
    check_grouped_replay(0)


def check_grouped_replay(seed: int) -> None:
    """Replay the fuzz log of `seed` (v1, upgraded at a random split) per group and check it."""
    log, result = run_with_log(seed, 300, 1, upgrade_at="random")
    entries, groups = _grouped_entries(log)
    out, rows = replay_groups(entries, groups.members(), 1)
    assert merged_digest(out["parts"], 2) == result.digest
    assert out["stats"]["resyncs"] == 0
    queued = sum(1 for t, r in rows if t == "messages" and r["outcome"] is None)
    final = fifo.restore(out["parts"][0]["snapshot"]) if len(out["parts"]) == 1 else None
    if final is not None:
        assert queued == sum(q.messages_total for q in final.queues.values())
    seqs = Counter((r["queue"], r["seq"]) for t, r in rows if t == "messages")
    assert all(count == 1 for count in seqs.values())


def test_route_names_the_queue_the_dead_letter_link_and_cluster_wide_commands() -> None:
    conn = ConnectionId("n1", 1, 1)
    assert route(fifo.encode(Enqueue("q", b"x"))) == ("q", None, False)
    declare = DeclareQueue("q", QueueConfig(dead_letter_queue="dlq"))
    assert route(fifo.encode(declare)) == ("q", "dlq", True)
    assert route(fifo.encode(UpdateConfig("q", QueueConfig()))) == ("q", None, True)
    assert route(fifo.encode(ConnectionDown(conn, "normal")))[0] is None
    assert route(fifo.encode(NodeDown("n1")))[0] is None
    assert route(b"\xff garbage")[0] is None


def test_groups_join_dead_letter_chains_and_placement_is_largest_first() -> None:
    groups = Groups()
    for a, b in (("a", "dlq"), ("b", "dlq"), ("c", "c2"), ("c2", "c3")):
        groups.link(a, b)
    groups.find("alone")
    assert sorted(map(sorted, groups.members().values())) == [
        ["a", "b", "dlq"], ["alone"], ["c", "c2", "c3"],
    ]  # fmt: skip
    placed = place({"a": 10, "b": 6, "c": 5, "d": 1}, 2)
    assert placed == {"a": 0, "b": 1, "c": 1, "d": 0}


def test_a_generated_log_scans_in_chunks_and_replays_to_its_end_digest(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    stats = write_log(log, 300_000, seed=5, services=3)
    plan = scan_log(log, chunk_bytes=64 * 1024)
    assert len(plan.chunks) > 2 and plan.commands == stats.commands
    assert plan.upgrades and plan.upgrades[0].to_version == fifo.LATEST_VERSION
    rows = [row for start, end in plan.chunks for row in parse_chunk(str(log), start, end)]
    assert sum(1 for r in rows if r[0] == "cmd") == stats.commands
    groups = Groups()
    for kind, queue, target, *_ in rows:
        if queue is not None:
            groups.find(queue)
            if kind == "link" and target is not None:
                groups.link(queue, target)
    members = groups.members()
    assert len(members) == 3
    entries = [("cmd", tuple(r[3:])) for r in rows if r[0] == "cmd"]
    merged: list[tuple[str, Any]] = [("up", u) for u in plan.upgrades]
    merged += entries
    merged.sort(key=lambda e: e[1].index if e[0] == "up" else e[1][0])
    out, table_rows = replay_groups(merged, members, plan.initial_version)
    assert plan.end is not None
    assert merged_digest(out["parts"], 2) == plan.end["fifo_digest"] == stats.fifo_digest
    outcomes = Counter(r["outcome"] for t, r in table_rows if t == "messages")
    assert outcomes["acked"] > 0 and outcomes["dead_lettered"] > 0
    assert out["stats"]["resyncs"] == 0


def test_pick_log_prefers_the_highest_commit_index_and_refuses_non_exports(tmp_path: Path) -> None:
    write_log(tmp_path / "a.log", 20_000, seed=1, services=1)
    (tmp_path / "junk.log").write_bytes(b"not cbor at all")
    with pytest.raises(LogScanError):
        pick_log([tmp_path / "junk.log"])
    chosen, because = pick_log([tmp_path / "a.log"])
    assert chosen == tmp_path / "a.log" and "node n1" in because


def test_analyze_cli_refuses_bad_input_before_starting_spark(tmp_path: Path) -> None:
    (tmp_path / "junk.log").write_bytes(b"\x00\x01")

    def code(*args: str) -> int:
        result = CliRunner().invoke(cli, ["pipeline", "analyze", *args], standalone_mode=False)
        assert isinstance(result.exception, CliError), result.output
        assert "starting spark" not in result.output
        return result.exception.exit_code

    out = str(tmp_path / "out")
    assert code("--log", str(tmp_path / "missing.log"), "--out", out) == USAGE
    assert code("--log", str(tmp_path / "junk.log"), "--out", out) == USAGE
    assert code("--log", str(tmp_path), "--out", out, "--from", "2026-01-02",
                "--to", "2026-01-01") == USAGE  # fmt: skip


def test_links_of_a_partitioned_declare_and_of_a_malformed_one() -> None:
    """A partitioned declare (v3) links its partitions, its dead-letter target and the anchor that
    keeps every partitioned queue in one replay group; a malformed one links nothing more (the
    machine refuses it everywhere) instead of failing the parse task."""
    blob = fifo.encode(
        DeclarePartitionedQueue("orders", QueueConfig(dead_letter_queue="dlx"), partitions=2)
    )
    assert links_of(blob) == [
        ("orders", "dlx"),
        ("orders", PARTITIONED_ANCHOR),
        ("orders", "orders.0"),
        ("orders", "orders.1"),
    ]
    tag = cbor2.loads(blob)
    broken = cbor2.dumps(cbor2.CBORTag(tag.tag, [*tag.value[:-1], "two"]))
    assert links_of(broken) == [("orders", "dlx")]


def _grouped_entries(log: list[Any]) -> tuple[list[tuple[str, Any]], Groups]:
    entries: list[tuple[str, Any]] = []
    groups = Groups()
    for entry in log:
        if isinstance(entry, FuzzUpgrade):
            m = entry.meta
            entries.append(("up", Upgrade(m.index, m.term, m.system_time_ms, m.machine_version)))
            continue
        meta, command = entry
        blob = fifo.encode(command)
        entries.append(("cmd", (meta.index, meta.term, meta.system_time_ms, meta.machine_version,
                                blob)))  # fmt: skip
        queue, _, _ = route(blob)
        if queue is not None:
            groups.find(queue)
            for source, target in links_of(blob):
                groups.link(source, target)
    return entries, groups


@pytest.mark.parametrize("seed", range(300, 306))
def test_v3_fuzz_logs_with_routed_publishes_replay_per_group_to_the_machine(seed: int) -> None:
    """v3 fuzz logs publishing to a partitioned queue's base name (and deleting it as a whole)
    replay per group to the machine's final digest without a resync; the base name is in the
    group of its partitions."""
    log, result = run_with_log(seed, 400, 3)
    routed = [e for e in log if not isinstance(e, FuzzUpgrade)
              and isinstance(e[1], Enqueue) and e[1].queue == "parts"]  # fmt: skip
    assert routed, "the seed publishes to the base name"
    entries, groups = _grouped_entries(log)
    members = groups.members()
    (with_base,) = [names for names in members.values() if "parts" in names]
    assert {"parts.0", PARTITIONED_ANCHOR} <= set(with_base)
    out, _ = replay_groups(entries, members, 3)
    assert merged_digest(out["parts"], 3) == result.digest
    assert out["stats"]["resyncs"] == 0


def test_a_publish_to_the_base_is_a_publish_of_its_partition_and_delete_drops_all() -> None:
    """Message rows of routed publishes name their partition with source "publish"; deleting the
    base drops every partition's messages (outcome dropped, queue_deleted)."""
    conn = ConnectionId("n1", 1, 1)
    sac = QueueConfig(single_active_consumer=True)
    commands: list[Any] = [DeclarePartitionedQueue("orders", sac, 3)]
    commands += [Enqueue("orders", b"m%d" % i, "p", i + 1, conn) for i in range(5)]
    commands += [Enqueue("orders", b"m4", "p", 5, conn), DeleteQueue("orders")]  # + a resend
    entries = [("cmd", (i + 1, 1, 1000 + i, 3, fifo.encode(c))) for i, c in enumerate(commands)]
    groups = Groups()
    for _, item in entries:
        groups.find(str(route(item[4])[0]))
        for source, target in links_of(item[4]):
            groups.link(source, target)
    assert len(groups.members()) == 1
    out, rows = replay_groups(entries, groups.members(), 3)
    messages = [r for t, r in rows if t == "messages"]
    assert sorted(r["queue"] for r in messages) == [
        "orders.0", "orders.0", "orders.1", "orders.1", "orders.2"]  # fmt: skip
    assert {r["source"] for r in messages} == {"publish"}
    assert {(r["outcome"], r["outcome_reason"]) for r in messages} == {("dropped", "queue_deleted")}
    assert out["stats"]["resyncs"] == 0
