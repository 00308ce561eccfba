"""Consumer semantics through real nodes: SAC failover, consumer timeouts, a lost consumer node.

Every test runs against both shells (threaded `Client`, `AsyncClient`; see `shells.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import LocalCluster, local_cluster
from fifo.commands import QueueConfig
from fifo.queries import ConsumerInfo
from tests.cluster.client_cluster import on_latest_machine
from tests.cluster.shells import Shells

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Shared by the tests that kill no node (consumer timeouts are machine v2)."""
    with local_cluster(tmp_path_factory.mktemp("consumers") / "D", 3) as running:
        yield on_latest_machine(running)


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A fresh cluster for a test that kills a node.

    `restart` returns once the node answers, before the leader has committed NodeUp for it; a
    node killed again before that is still listed down, so no NodeDown is proposed and its
    consumers are never suspected. On the shared cluster the second shell's run of the test
    killed the node the first run had just restarted."""
    with local_cluster(tmp_path / "D", 3) as running:
        yield on_latest_machine(running)


def take(consumer: Any, count: int, timeout_s: float = 10.0) -> list[Any]:
    got: list[Any] = []
    for _ in range(count):
        message = consumer.get(timeout_s=timeout_s)
        assert message is not None, f"got {len(got)} of {count} messages"
        got.append(message)
    return got


def wait_until(predicate: object, timeout_s: float = 10.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def test_sac_fails_over_when_the_active_consumers_connection_closes(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"sac-{shells.kind}"
    with shells.client(cluster) as admin:
        admin.declare_queue(queue, QueueConfig(single_active_consumer=True))
        first = shells.client(cluster)
        active = first.consume(queue, prefetch=10)
        with shells.client(cluster) as second_client:
            waiting = second_client.consume(queue, prefetch=10)
            assert (active.active, waiting.active) == (True, False)
            with admin.publisher(queue, window=10) as publisher:
                publisher.publish_many([b"s1", b"s2", b"s3"])
            assert [m.body for m in take(active, 3)] == [b"s1", b"s2", b"s3"]
            assert waiting.get(timeout_s=0.5) is None
            first.close()  # unacked: the messages go to the next consumer
            redelivered = take(waiting, 3)
            assert sorted(m.body for m in redelivered) == [b"s1", b"s2", b"s3"]
            assert all(m.redelivered for m in redelivered)
            assert waiting.active is True  # activated by the ConsumerUpdate push
            waiting.ack(redelivered)
            waiting.cancel()


def test_a_timed_out_consumer_loses_its_messages_and_gets_nothing_new(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"timeouts-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=10) as publisher:
            publisher.publish_many([b"t1", b"t2", b"t3", b"t4"])
        consumer = client.consume(queue, prefetch=2, timeout_ms=300)
        held = take(consumer, 2)
        assert wait_until(lambda: consumer.released >= {m.msg_id for m in held})
        assert consumer.status == "timeout"
        overview = client.overview(queue)
        assert overview.checked_out == 0
        assert overview.ready + overview.returned == 4
        assert consumer.get(timeout_s=1.0) is None, "a timed-out consumer must get nothing new"
        (info,) = client.consumers(queue)[queue]
        assert isinstance(info, ConsumerInfo)
        assert (info.status, info.tag, info.key) == ("timeout", consumer.tag, consumer.consumer_key)
        consumer.ack(held)  # naming the timed-out ids clears the timeout
        assert consumer.wait_settled()
        assert consumer.settle_errors == 0
        assert wait_until(lambda: client.consumers(queue)[queue][0].status == "up")
        consumer.remove()


def test_a_consumer_that_settles_its_timed_out_ids_gets_messages_again(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"timeouts-2-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=10) as publisher:
            publisher.publish_many([b"t1", b"t2", b"t3", b"t4"])
        consumer = client.consume(queue, prefetch=2, timeout_ms=300)
        held = take(consumer, 2)
        assert wait_until(lambda: consumer.released >= {m.msg_id for m in held})
        consumer.ack(held)
        assert consumer.wait_settled()
        again = take(consumer, 2, timeout_s=3.0)
        assert {m.body for m in again} <= {b"t1", b"t2", b"t3", b"t4"}
        consumer.ack(again)
        consumer.remove()


def test_killing_the_consumers_node_suspects_it_and_returns_only_after_the_disconnected_timeout(
    own_cluster: LocalCluster, shells: Shells
) -> None:
    cluster = own_cluster
    queue = f"suspects-{shells.kind}"
    leader = cluster.leader()
    victim = next(n for n in cluster.config.node_ids() if n != leader)
    disconnected_timeout_ms = 3000
    with shells.client(cluster, leader, only=True) as client:
        client.declare_queue(queue, QueueConfig(disconnected_timeout_ms=disconnected_timeout_ms))
        remote = shells.client(cluster, victim, only=True)
        held = take(remote.consume(queue, prefetch=5), 0)
        with client.publisher(queue, window=10) as publisher:
            publisher.publish_many([b"x1", b"x2", b"x3"])
        assert wait_until(lambda: client.overview(queue).checked_out == 3)
        assert held == []
        killed_at = time.monotonic()
        cluster.kill(victim)
        assert wait_until(
            lambda: any(c.status == "suspected_down" for c in client.consumers(queue)[queue]),
            timeout_s=10.0,
        )
        assert client.overview(queue).checked_out == 3, "suspected: messages stay"
        survivor = client.consume(queue, prefetch=5)
        back = take(survivor, 3, timeout_s=20.0)
        assert time.monotonic() - killed_at >= disconnected_timeout_ms / 1000
        assert sorted(m.body for m in back) == [b"x1", b"x2", b"x3"]
        survivor.ack(back)
        survivor.cancel()
        remote.close()
