"""Log export from a real cluster (running and stopped, with a snapshot) and the dry-run on it."""

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
from cluster.client.errors import ClusterError
from cluster.launcher import LocalCluster, local_cluster
from raft.logfile import EndRecord, EntryRecord, SnapshotRecord, read_log

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def invoke(*args: str) -> tuple[int, str]:
    """Run the CLI like `main()`: a CliError becomes its exit code and message."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None:
        raise result.exception
    return 0, result.output


def wait_until(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (ClusterError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def traffic(client: Client, queue: str, count: int) -> None:
    """Publish `count`, take half with acks and a few nacks, leave the rest ready."""
    with client.publisher(queue, window=100) as publisher:
        publisher.publish_many(b"%s-%d" % (queue.encode(), i) for i in range(count))
    consumer = client.consume(queue, prefetch=10)
    for taken in range(count // 2):
        message = consumer.get(timeout_s=10.0)
        assert message is not None
        if taken % 7 == 0:
            message.nack()
        else:
            message.ack()
    consumer.cancel()
    consumer.wait_settled()


def quiet_status(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """Every node's status once they all applied the same index (traffic has stopped)."""

    def same() -> dict[str, dict[str, Any]] | None:
        rows = cluster.status()
        pairs = {(row.get("last_applied"), row.get("digest")) for row in rows}
        return {row["id"]: row for row in rows} if len(pairs) == 1 else None

    result: dict[str, dict[str, Any]] = wait_until(same, 20, "a quiet cluster")
    return result


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path / "D", 3, max_machine_version=1) as running:
        yield running


def test_export_of_a_real_cluster_matches_its_state_and_the_dry_run_finds_v2_safe(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    data_dir = str(cluster.data_dir)
    with cluster.client("n1") as client:
        client.declare_queue("early")
        traffic(client, "early", 300)
        client.admin("snapshot")  # n1 compacts: its export starts from the dump
        wait_until(lambda: (cluster.data_dir / "n1" / "raft.dump").exists(), 10, "a dump")
        client.declare_queue("late")
        traffic(client, "late", 200)
    out = tmp_path / "n1.log"
    for _attempt in range(5):  # a closing client's ConnectionDown may land meanwhile: retry
        before = quiet_status(cluster)["n1"]
        code, output = invoke(
            "-o", "json", "log", "export", "--data-dir", data_dir, "--node", "n1", "--out", str(out)
        )
        assert code == 0, output
        status = quiet_status(cluster)["n1"]
        if before["last_applied"] == status["last_applied"]:
            break
    summary = json.loads(output)
    assert (summary["last_index"], summary["digest"]) == (status["last_applied"], status["digest"])
    records = list(read_log(out))
    assert isinstance(records[1], SnapshotRecord) and records[1].index > 1
    assert summary["first_index"] == records[1].index + 1
    end = records[-1]
    assert isinstance(end, EndRecord) and end.digest == status["digest"]
    kinds = {r.kind for r in records if isinstance(r, EntryRecord)}
    assert "cmds" in kinds

    code, output = invoke(
        "machine", "upgrade", "--dry-run", "--log", str(out), "--to", "2", "--every", "2"
    )
    assert code == 0, output
    assert "SAFE: upgrade to v2" in output

    # a stopped node's journal exports the same way, and the replay still reproduces it
    cluster.stop()
    stopped = tmp_path / "n2-stopped.log"
    code, output = invoke(
        "-o", "json", "log", "export", "--data-dir", data_dir, "--node", "n2", "--out", str(stopped)
    )
    assert code == 0, output
    assert json.loads(output)["last_index"] >= status["last_applied"]
    code, output = invoke("-o", "json", "machine", "upgrade", "--dry-run", "--log", str(stopped))
    assert code == 0, output
    report = json.loads(output)
    assert report["safe"] and not report["baseline_errors"]
    assert report["commands"] > 500 and report["to_version"] == fifo.LATEST_VERSION
    assert all(split["conserved"] for split in report["splits"])
