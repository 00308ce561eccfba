"""The memory alarm over AMQP 0-9-1: a publishing connection is blocked, as RabbitMQ does it.

Past `memory_high_watermark` a node refuses native publishes with `memory_alarm`; an AMQP
publisher cannot be told "retry", so the node does what RabbitMQ does: it sends
`connection.blocked` (to clients that announce the capability) and stops reading the
connection's socket until the alarm clears, then sends `connection.unblocked`. Nothing read
is lost. The nodes read their resident set from the test hook (`QUORUMQ_TEST_RSS_FILE`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster, wait_until
from tests.amqp.conftest import SLOW_MACHINE
from tests.cluster.memory_alarm import WATERMARK_MIB, set_resident, start_alarmable_cluster

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """3 nodes with memory_high_watermark = 64 MiB, reading their RSS from RSS_FILE."""
    running = start_alarmable_cluster(tmp_path, monkeypatch)
    set_resident(running, 10)
    try:
        yield running
    finally:
        running.stop()


def _alarm_on_every_node(cluster: LocalCluster, alarm: bool) -> bool:
    return all(s and s.get("memory_alarm") is alarm for s in cluster.statuses().values())


def test_a_publishing_connection_is_blocked_past_the_watermark_and_unblocked_below(
    cluster: LocalCluster,
) -> None:
    node = cluster.config.nodes[0]
    assert node.amqp_port is not None
    credentials = pika.PlainCredentials("quorumq", cluster.key.decode("ascii"))
    params = pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, credentials=credentials, **SLOW_MACHINE
    )
    connection = pika.BlockingConnection(params)
    events: list[str] = []
    connection.add_on_connection_blocked_callback(lambda _c, frame: events.append("blocked"))
    connection.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("alarmed", durable=True, arguments={"x-queue-type": "quorum"})
    channel.basic_publish("", "alarmed", b"before")

    set_resident(cluster, WATERMARK_MIB + 1)
    wait_until(lambda: _alarm_on_every_node(cluster, True), 10.0, "the alarm on every node")
    channel.basic_publish("", "alarmed", b"read-then-blocked")  # read: taken, then blocked
    connection.process_data_events(time_limit=1.0)
    assert events == ["blocked"]

    lowered_at: list[float] = []

    def lower_later() -> None:
        time.sleep(2.0)
        lowered_at.append(time.monotonic())
        set_resident(cluster, 10)

    lowering = threading.Thread(target=lower_later)
    lowering.start()
    channel.basic_publish("", "alarmed", b"waited")  # not read until the alarm clears
    confirmed_at = time.monotonic()
    lowering.join()
    assert lowered_at and confirmed_at > lowered_at[0]
    connection.process_data_events(time_limit=0.5)
    assert events == ["blocked", "unblocked"]

    bodies = []
    while (got := channel.basic_get("alarmed", auto_ack=True))[0] is not None:
        bodies.append(got[2])
    assert bodies == [b"before", b"read-then-blocked", b"waited"]
    connection.close()
