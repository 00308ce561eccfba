"""Damaged storage on a real node (issue 12): refused with a clear message, or healed from peers.

Each damage is made on a stopped node's real files; the node is started as `cluster start`
starts it. Refused: it exits 65 with the file, the offset and `quorumq node recover ID` on
stderr, and never answers (never serves, votes or leads from a state it could not load).
`quorumq node recover ID` then rebuilds it from its peers. A torn tail is cut and the node
catches up on its own. Every time: equal digests at the same applied index, nothing confirmed
lost.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from cluster import config as cluster_config
from cluster import protocol
from cluster.config import NodeConfig
from cluster.errors import ProtocolError
from cluster.launcher import (
    LocalCluster,
    client_key,
    init_cluster,
    node_pid,
    node_status,
    spawn_node,
    start_cluster,
    stop_node,
    wait_until,
)
from cluster.rawclient import RawClient
from fifo.commands import Enqueue
from raft import durability, storage

pytestmark = pytest.mark.cluster

QUORUMQ = [sys.executable, "-m", "cluster.cli"]
MESSAGES = 120
BIG_MESSAGES = 128


def quorumq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QUORUMQ, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "D")


@pytest.fixture
def cluster_v3(tmp_path: Path) -> Iterator[LocalCluster]:
    """`cluster` capped at machine v3, where a message's body is part of the state."""
    yield from _cluster(tmp_path / "D", max_machine_version=3)


def _cluster(data_dir: Path, max_machine_version: int | None = None) -> Iterator[LocalCluster]:
    """A started 3-node cluster, stopped after the test."""
    init_cluster(data_dir, 3, max_machine_version=max_machine_version)
    start_cluster(data_dir, 3)
    local = LocalCluster(data_dir)
    try:
        yield local
    finally:
        local.stop()


def _raw(cluster: LocalCluster, node_id: str) -> RawClient:
    return RawClient(cluster.endpoint(node_id), cluster.key, "storage-test")


def _publish(cluster: LocalCluster, queue: str, count: int) -> None:
    with cluster.client() as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=50) as publisher:
            for i in range(count):
                publisher.publish(b"%s-%d" % (queue.encode(), i))
            publisher.wait_for_confirms(60)


def _converged(cluster: LocalCluster, totals: dict[str, int]) -> None:
    """Every node answers with the same digest at the same index, and holds every message."""

    def same() -> bool:
        rows = cluster.status()
        pairs = {(r.get("last_applied"), r.get("digest")) for r in rows}
        serving = all(r.get("read_refusal") is None for r in rows)  # caught up, as a read
        return (
            len(pairs) == 1
            and serving
            and all(r.get("role") in ("leader", "follower") for r in rows)
        )

    wait_until(same, 60, "equal digests on every node")
    for node_id in cluster.config.node_ids():
        client = _raw(cluster, node_id)
        try:
            for queue, total in totals.items():
                assert client.query("overview", queue=queue)["total"] == total, node_id
        finally:
            client.close()


def _start_refused(cluster: LocalCluster, node_id: str, expect: Path) -> str:
    """Start the node; it must exit 65 without ever answering; returns its stderr message."""
    node = cluster.config.node(node_id)
    err_log = node.data_dir / "stderr.log"
    before = err_log.stat().st_size if err_log.exists() else 0
    process = spawn_node(cluster.data_dir, node_id)
    assert process.wait(60) == 65
    assert node_status(node, cluster.key, timeout_s=0.5) is None
    message = err_log.read_bytes()[before:].decode()
    assert str(expect) in message and "offset" in message, message
    assert f"quorumq node recover {node_id}" in message, message
    return message


def _recover(cluster: LocalCluster, node_id: str) -> dict[str, object]:
    result = quorumq("--data-dir", str(cluster.data_dir), "node", "recover", node_id, "-o", "json")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert isinstance(row, dict)
    moved = Path(str(row["moved_to"]))
    assert (moved / "raft.journal").exists()
    return row


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


def test_damage_is_refused_then_rebuilt_from_peers(cluster: LocalCluster) -> None:
    """A flipped byte in a journal record, a cut snapshot and a corrupt meta: each node refuses
    to start, naming the file; `node recover` rebuilds it; nothing confirmed is lost."""
    _publish(cluster, "a", MESSAGES)
    leader = cluster.leader()
    first, second = cluster.followers()

    # 1. a byte flipped in a journal record in the middle of the journal
    node = cluster.config.node(first)
    stop_node(node, grace_s=5)
    journal = node.data_dir / "raft.journal"
    offsets = storage.scan_journal(journal, journal.read_bytes()).offsets
    assert len(offsets) > 3
    _flip(journal, offsets[len(offsets) // 2] + 30)
    _start_refused(cluster, first, journal)
    _publish(cluster, "b", 40)  # the cluster goes on with two nodes meanwhile
    row = _recover(cluster, first)
    assert sorted(cast(list[str], row["healthy_peers"])) == sorted([leader, second])  # (JSON: ids)
    _converged(cluster, {"a": MESSAGES, "b": 40})

    # 2. a snapshot cut short (before, the node ran empty at index 0, voting and acking)
    client = _raw(cluster, second)
    client.admin("snapshot")
    client.close()
    node = cluster.config.node(second)
    dump = node.data_dir / "raft.dump"
    wait_until(dump.exists, 30, "the snapshot")
    assert stat.S_IMODE(os.stat(dump).st_mode) == 0o600  # the snapshot is private too
    stop_node(node, grace_s=5)
    dump.write_bytes(dump.read_bytes()[: dump.stat().st_size // 2])
    _start_refused(cluster, second, dump)
    _recover(cluster, second)
    _converged(cluster, {"a": MESSAGES, "b": 40})

    # 2b. one byte changed in the middle of a whole snapshot
    client = _raw(cluster, second)
    client.admin("snapshot")
    client.close()
    wait_until(dump.exists, 30, "the snapshot")
    stop_node(node, grace_s=5)
    _flip(dump, dump.stat().st_size // 2)
    _start_refused(cluster, second, dump)
    _recover(cluster, second)
    _converged(cluster, {"a": MESSAGES, "b": 40})

    # 3. a corrupt meta on the (old) leader: its term and vote are never reset silently
    node = cluster.config.node(leader)
    stop_node(node, grace_s=5)
    meta = node.data_dir / "raft.journal.meta"
    _flip(meta, meta.stat().st_size - 2)
    _start_refused(cluster, leader, meta)
    _recover(cluster, leader)
    _publish(cluster, "c", 20)
    _converged(cluster, {"a": MESSAGES, "b": 40, "c": 20})

    # the data dir is private, its files too
    for node_id in cluster.config.node_ids():
        node_dir = cluster.config.node(node_id).data_dir
        assert stat.S_IMODE(os.stat(node_dir).st_mode) == 0o700
        for name in ("raft.journal", "raft.journal.meta", "node.log", "stdout.log", "stderr.log"):
            assert stat.S_IMODE(os.stat(node_dir / name).st_mode) == 0o600, (node_id, name)


def test_damage_found_while_running_stops_the_leader_with_65(tmp_path: Path) -> None:
    """A journal record that goes bad under a running leader is found when a lagging follower
    needs it read back: the leader stops at once with exit 65, naming the file and the recovery
    command (before, it logged a failed tick 50 times a second and stayed leader, the follower
    never caught up); another node leads, nothing confirmed is lost, `node recover` rebuilds it."""
    cluster = start_cluster(tmp_path / "D", 3)  # keeps the node processes: their exit codes
    try:
        leader = cluster.leader()
        lagging, other = cluster.followers()
        stop_node(cluster.config.node(lagging), grace_s=5)
        journal = cluster.config.node(leader).data_dir / "raft.journal"
        missed_from = len(storage.scan_journal(journal, journal.read_bytes()).offsets)
        # 8 MiB of entries: more than the leader keeps in memory (durability.TAIL_CACHE_BYTES),
        # so the first ones the lagging follower misses are read back from the file
        body = b"x" * (64 * 1024)
        with cluster.client(leader) as client:
            client.declare_queue("big")
            with client.publisher("big", window=20) as publisher:
                for _ in range(BIG_MESSAGES):
                    publisher.publish(body)
                publisher.wait_for_confirms(60)
        offsets = storage.scan_journal(journal, journal.read_bytes()).offsets
        assert len(offsets) - missed_from > 4
        with open(journal, "r+b") as f:  # in place: the running leader's file, one byte
            f.seek(offsets[missed_from + 1] + 40)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x20]))

        cluster.start_node(lagging)  # the leader reads the damaged record to send it
        assert cluster.procs[leader].wait(30) == 65
        message = (cluster.config.node(leader).data_dir / "stderr.log").read_text()
        assert str(journal) in message and "offset" in message, message
        assert f"quorumq node recover {leader}" in message, message
        node_log = (cluster.config.node(leader).data_dir / "node.log").read_text()
        assert node_log.count('"journal_damaged"') == 1, node_log[-2000:]

        new_leader = cluster.leader()
        assert new_leader in (lagging, other)
        _recover(cluster, leader)
        _converged(cluster, {"big": BIG_MESSAGES})
    finally:
        cluster.stop()


def _answers(node: NodeConfig, key: bytes) -> bool:
    """Whether the node answers a status query."""
    return node_status(node, key) is not None


def test_a_torn_tail_heals_by_itself_and_recover_needs_a_healthy_majority(
    cluster: LocalCluster,
) -> None:
    """A journal cut mid-record, or whose last record is zeroed, starts (the tail cut and
    logged) and catches up from the leader. `node recover` refuses (exit 69) while a majority
    of the cluster is not healthy without the node, and then moves nothing."""
    _publish(cluster, "a", MESSAGES)
    first, second = cluster.followers()
    for node_id, damage in ((first, "cut"), (second, "zero")):
        node = cluster.config.node(node_id)
        stop_node(node, grace_s=5)
        journal = node.data_dir / "raft.journal"
        data = journal.read_bytes()
        last = storage.scan_journal(journal, data).offsets[-1]
        if damage == "cut":
            journal.write_bytes(data[: last + (len(data) - last) // 2])
        else:
            journal.write_bytes(data[:last] + b"\0" * (len(data) - last))
        spawn_node(cluster.data_dir, node_id)
        wait_until(functools.partial(_answers, node, cluster.key), 30, "the node")
        log_text = (node.data_dir / "node.log").read_text()
        assert "journal_torn_tail_truncated" in log_text
    _publish(cluster, "b", 30)
    _converged(cluster, {"a": MESSAGES, "b": 30})

    # no healthy majority without the node: refused, nothing moved
    stop_node(cluster.config.node(second), grace_s=5)
    time.sleep(0.5)
    result = quorumq("--data-dir", str(cluster.data_dir), "node", "recover", first)
    assert result.returncode == 69, result.stderr
    assert "refusing to recover" in result.stderr and second in result.stderr
    assert (cluster.config.node(first).data_dir / "raft.journal").exists()
    assert not list(cluster.config.node(first).data_dir.glob("recovered-*"))
    assert node_status(cluster.config.node(first), client_key(cluster.data_dir)) is not None
    spawn_node(cluster.data_dir, second)
    _converged(cluster, {"a": MESSAGES, "b": 30})

    # `node restart` (and `recover`) check the node could start again before stopping it
    secret = cluster.data_dir / "secret"
    secret.rename(cluster.data_dir / "secret.away")
    try:
        result = quorumq("--data-dir", str(cluster.data_dir), "node", "restart", first)
        assert result.returncode == 78 and "nothing was stopped" in result.stderr, result.stderr
        assert node_status(cluster.config.node(first), cluster.key) is not None
    finally:
        (cluster.data_dir / "secret.away").rename(secret)
    assert cluster_config.load(cluster.data_dir).node_ids() == cluster.config.node_ids()


def test_a_full_disk_answers_disk_full_and_resumes_when_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on the leader's journal (injected: the test-only hook fails every journal write
    while `enospc.flag` exists in the node's dir): logged, no SIGBUS, leadership moves to a
    node that can write, the full node answers `disk_full` at once, and when space returns it
    catches up. Nothing confirmed is lost."""
    monkeypatch.setenv(durability.FAULT_ENOSPC_ENV, "enospc.flag")  # relative: the node's dir
    data_dir = tmp_path / "D"
    init_cluster(data_dir, 3)
    start_cluster(data_dir, 3)
    cluster = LocalCluster(data_dir)
    try:
        _publish(cluster, "a", 50)
        full = cluster.leader()
        node = cluster.config.node(full)
        pid = node_pid(node)
        (node.data_dir / "enospc.flag").touch()
        # the submitter of the write that failed inside raft waits for the batch timeout (10 s)
        client = RawClient(cluster.endpoint(full), cluster.key, "disk-full", timeout_s=30)
        codes: list[str] = []
        try:
            # the first write fails inside raft (its submitter times out); then disk_full
            for i in range(30):
                try:
                    client.command(Enqueue("x", b"attempt-%d" % i))
                except ProtocolError as err:
                    codes.append(err.code)
                    if err.code == protocol.DISK_FULL:
                        break
        finally:
            client.close()
        assert codes[-1] == protocol.DISK_FULL, codes
        new_leader = cluster.leader(exclude=full)
        assert new_leader != full
        _publish(cluster, "b", 30)  # the others go on
        assert node_pid(node) == pid  # still alive: no SIGBUS
        (node.data_dir / "enospc.flag").unlink()
        log_text = wait_until(
            lambda: (lambda t: t if "disk_space_returned" in t else None)(
                (node.data_dir / "node.log").read_text()
            ),
            20,
            "space noticed",
        )
        assert '"disk_full"' in log_text
        _converged(cluster, {"a": 50, "b": 30})
        client = _raw(cluster, full)
        try:
            assert client.command(Enqueue("b", b"after")) is not None
        finally:
            client.close()
    finally:
        cluster.stop()


def test_cluster_status_names_the_node_whose_digest_differs_at_the_same_index() -> None:
    from cluster.cli.cluster_cmd import digest_divergence

    rows: list[dict[str, object]] = [
        {"id": "n1", "last_applied": 90, "digest": "aaaa"},
        {"id": "n2", "last_applied": 90, "digest": "bbbb"},
        {"id": "n3", "last_applied": 90, "digest": "aaaa"},
        {"id": "n4", "last_applied": 91, "digest": "cccc"},  # further on: not comparable
        {"id": "n5", "role": "down"},
    ]
    message = digest_divergence(rows)
    assert message is not None and "index 90: n2 differ" in message
    assert digest_divergence([rows[0], rows[2], rows[3], rows[4]]) is None


def test_cluster_status_exits_1_naming_a_replica_that_diverged(cluster_v3: LocalCluster) -> None:
    """A follower whose journal holds a different body under valid checksums (what a bug or a
    tampering would leave) applies the same index to a different digest: `cluster status` exits
    1 naming it; `node recover` rebuilds it, and status exits 0 again. At machine v3: from v4 on
    a body stays in the journal (the state holds a reference), so a body-only divergence no
    longer changes the digest."""
    cluster = cluster_v3
    probe = b"divergence-probe-0001"
    with cluster.client() as client:
        client.declare_queue("d")
        with client.publisher("d", window=10) as publisher:
            publisher.publish(probe)
            publisher.wait_for_confirms(60)
    # a confirm needs a majority only: wait until the follower to damage holds the probe too
    cluster.converged(timeout_s=60)
    odd = cluster.followers()[0]
    node = cluster.config.node(odd)
    stop_node(node, grace_s=5)
    journal = node.data_dir / "raft.journal"
    data = bytearray(journal.read_bytes())
    scan = storage.scan_journal(journal, bytes(data))
    found = [i for i, (payload, _, _) in enumerate(scan.entries) if probe in payload]
    assert len(found) == 1
    payload, index, term = scan.entries[found[0]]
    offset = scan.offsets[found[0]]
    record = storage.encode_record(
        offset, payload.replace(probe, b"divergence-probe-9999"), index, term
    )
    data[offset : offset + len(record)] = record
    journal.write_bytes(bytes(data))
    spawn_node(cluster.data_dir, odd)

    def diverged() -> subprocess.CompletedProcess[str] | None:
        result = quorumq("cluster", "status", "--data-dir", str(cluster.data_dir))
        return result if result.returncode == 1 else None

    result = wait_until(diverged, 60, "cluster status seeing the divergence")
    assert f"{odd} differ" in result.stderr and "replicas disagree" in result.stderr, result.stderr
    assert "quorumq node recover ID" in result.stderr
    _recover(cluster, odd)
    _converged(cluster, {"d": 1})
    result = quorumq("cluster", "status", "--data-dir", str(cluster.data_dir))
    assert result.returncode == 0, result.stderr
