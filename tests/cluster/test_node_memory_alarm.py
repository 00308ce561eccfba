"""The memory watermark on real node processes: publishes held past it, a backlog drained
meanwhile, publishing resumed below it, nothing lost.

The nodes read their resident set from the test hook (`QUORUMQ_TEST_RSS_FILE`, relative to
each node's dir) so that the test decides when they cross a low `memory_high_watermark`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.client import Consumer, Message
from cluster.launcher import LocalCluster, wait_until
from tests.cluster.conftest import quorumq_cli
from tests.cluster.memory_alarm import WATERMARK_MIB, set_resident, start_alarmable_cluster

BACKLOG = 200
HELD = 300


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """3 nodes with memory_high_watermark = 64 MiB, reading their RSS from RSS_FILE."""
    running = start_alarmable_cluster(tmp_path, monkeypatch)
    try:
        yield running
    finally:
        running.stop()


def _alarms(cluster: LocalCluster) -> list[object]:
    return [s and s.get("memory_alarm") for s in cluster.statuses().values()]


@pytest.mark.cluster
def test_publishes_are_held_past_the_watermark_while_consumers_drain_then_resume(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quorumq")
    set_resident(cluster, 10)
    with cluster.client() as client:
        client.declare_queue("held")
        with client.publisher("held", window=100) as publisher:
            publisher.publish_many(b"old%d" % i for i in range(BACKLOG))
            publisher.wait_for_confirms(timeout_s=30.0)
    status = next(s for s in cluster.statuses().values() if s is not None)
    assert status["memory_high_watermark_bytes"] == WATERMARK_MIB * 1024 * 1024
    assert status["memory_alarm"] is False and "loop_stall_max_ms" in status

    set_resident(cluster, WATERMARK_MIB + 1)
    wait_until(lambda: _alarms(cluster) == [True] * 3, 10.0, "the alarm on every node")
    table = quorumq_cli("--data-dir", str(cluster.data_dir), "cluster", "status")
    assert table.returncode == 0, table.stderr
    assert "MEMORY_ALARM" in table.stdout.splitlines()[0]  # a column while a node has it
    with cluster.client() as publishing, cluster.client() as consuming:
        held = publishing.publisher("held", window=50)
        sender = threading.Thread(
            target=held.publish_many, args=([b"new%d" % i for i in range(HELD)],)
        )
        sender.start()
        consumer = consuming.consume("held", prefetch=20)
        drained = [m.body for m in _take(consumer, BACKLOG)]  # the backlog drains
        assert drained == [b"old%d" % i for i in range(BACKLOG)]
        assert held.confirmed == 0 and sender.is_alive()  # the window is full, held
        warnings = [r for r in caplog.records if r.name == "quorumq.client"]
        assert [r.__dict__["quorumq_event"] for r in warnings] == ["publishes_held_memory_alarm"]
        assert "past its memory high watermark" in warnings[0].getMessage()

        set_resident(cluster, 10)  # below the resume share: publishing goes on
        sender.join(timeout=30.0)
        held.wait_for_confirms(timeout_s=30.0)
        assert held.confirmed == HELD
        later = [m.body for m in _take(consumer, HELD)]
        assert sorted(later) == sorted(b"new%d" % i for i in range(HELD))

        def emptied() -> bool:  # acks go out in batches
            overview = consuming.overview("held")
            return overview is not None and overview.total == 0

        wait_until(emptied, 30.0, "every message acked")
        held.close()
    # each node clears its own alarm at its next sample (every 0.2 s): the one that took the
    # publishes may clear before the others, and the rest can run in less (CI: 180 ms)
    wait_until(lambda: _alarms(cluster) == [False] * 3, 10.0, "the alarm cleared on every node")


def _take(consumer: Consumer, count: int) -> list[Message]:
    """`count` messages of `consumer`, each acked (AssertionError if they stop coming)."""
    taken: list[Message] = []
    for _ in range(count):
        message = consumer.get(timeout_s=30.0)
        assert message is not None, f"only {len(taken)} of {count} messages came"
        message.ack()
        taken.append(message)
    return taken
