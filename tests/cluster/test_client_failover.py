"""Failover: kill -9 the leader mid-stream; nothing confirmed is lost, resends are deduplicated.

Every test runs against both shells (threaded `Client`, `AsyncClient`; see `shells.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.launcher import LocalCluster, local_cluster
from tests.cluster.kill_midway import kill_when_confirmed
from tests.cluster.shells import Shells

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("failover") / "D", 3) as running:
        yield running


def consume_all(client: Any, queue: str, expected: int) -> list[bytes]:
    """Consume and ack until `expected` messages came, then until the queue stays quiet."""
    consumer = client.consume(queue, prefetch=200)
    bodies: list[bytes] = []
    while True:
        message = consumer.get(timeout_s=3.0 if len(bodies) >= expected else 15.0)
        if message is None:
            break
        bodies.append(message.body)
        message.ack()
    consumer.cancel()
    consumer.wait_settled()
    return bodies


def test_leader_kill_mid_stream_loses_no_confirmed_message_and_stores_no_duplicate(
    cluster: LocalCluster, shells: Shells
) -> None:
    leader = cluster.leader()
    total = 3000
    with shells.client(cluster, leader, reconnect_timeout_s=20.0) as client:
        client.declare_queue("failover")
        publisher = client.publisher("failover", window=200)
        with kill_when_confirmed(cluster, leader, publisher, total // 3) as killed:
            publisher.publish_many((b"msg-%05d" % i for i in range(total)), timeout_s=30.0)
            publisher.wait_for_confirms(timeout_s=30.0)
            assert killed.wait(10.0)
        assert publisher.confirmed == total
        assert client.reconnects >= 1, "the client was on the killed leader and must reconnect"
        assert client.node != leader
        bodies = consume_all(client, "failover", total)
    counts = Counter(bodies)
    lost = {b"msg-%05d" % i for i in range(total)} - set(counts)
    duplicated = [body for body, n in counts.items() if n > 1]
    assert not lost, f"{len(lost)} confirmed messages lost"
    assert not duplicated, f"{len(duplicated)} resent messages were stored twice"
    assert len(bodies) == total


def test_a_client_on_a_follower_keeps_publishing_through_a_leader_change(
    cluster: LocalCluster, shells: Shells
) -> None:
    leader = cluster.leader()
    follower = next(n for n in cluster.config.node_ids() if n != leader)
    with shells.client(cluster, follower) as client:
        client.declare_queue("follower-side")
        with client.publisher("follower-side", window=100) as publisher:
            publisher.publish_many(b"a%d" % i for i in range(500))
            cluster.kill(leader)
            publisher.publish_many((b"b%d" % i for i in range(500)), timeout_s=30.0)
            publisher.wait_for_confirms(timeout_s=30.0)
        assert publisher.confirmed == 1000
        assert cluster.leader(exclude=leader) != leader
        bodies = consume_all(client, "follower-side", 1000)
    assert len(bodies) == 1000
    assert len(set(bodies)) == 1000


def test_a_client_on_a_paused_node_moves_to_another_and_its_publishes_complete(
    cluster: LocalCluster, shells: Shells
) -> None:
    import signal

    leader = cluster.leader()
    follower = next(n for n in cluster.config.node_ids() if n != leader)
    with shells.client(cluster, follower, silence_timeout_s=1.5) as client:
        client.declare_queue("paused")
        cluster.kill(follower, signal.SIGSTOP)
        try:
            with client.publisher("paused", window=50) as publisher:
                publisher.publish_many((b"p%d" % i for i in range(200)), timeout_s=30.0)
                publisher.wait_for_confirms(timeout_s=30.0)
            assert publisher.confirmed == 200
            assert client.node != follower
        finally:
            cluster.kill(follower, signal.SIGCONT)
        assert len(set(consume_all(client, "paused", 200))) == 200
