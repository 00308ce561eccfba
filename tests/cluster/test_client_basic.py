"""The client library against a real 3-node cluster: publish, consume, settle, dedup, queries.

Every test runs against both shells (threaded `Client`, `AsyncClient`; see `shells.py`), with
queue names suffixed by the shell so the two runs share the cluster without sharing queues.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.client import AuthError, Client, CommandRefused
from cluster.launcher import LocalCluster, local_cluster
from fifo.commands import QueueConfig
from fifo.queries import QueueOverview
from tests.cluster.client_cluster import on_latest_machine
from tests.cluster.shells import Shells

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("client-basic") / "D", 3) as running:
        yield on_latest_machine(running)


def drain(client: Any, queue: str, count: int, prefetch: int = 100) -> list[bytes]:
    """Consume and ack `count` messages (fails the test if they do not all come)."""
    consumer = client.consume(queue, prefetch=prefetch)
    bodies: list[bytes] = []
    while len(bodies) < count:
        message = consumer.get(timeout_s=10.0)
        assert message is not None, f"only {len(bodies)} of {count} messages arrived"
        bodies.append(message.body)
        message.ack()
    consumer.cancel()
    assert consumer.wait_settled()
    return bodies


def test_published_messages_are_consumed_once_each_through_any_node(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"basic-{shells.kind}"
    follower = cluster.followers()[0]
    with shells.client(cluster, follower, only=True) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=100) as publisher:
            publisher.publish_many(b"m%d" % i for i in range(500))
        assert publisher.confirmed == 500
    with shells.client(cluster, cluster.leader(), only=True) as client:
        bodies = drain(client, queue, 500)
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(500))
        overview = client.overview(queue)
        assert isinstance(overview, QueueOverview)
        assert (overview.total, overview.checked_out, overview.name) == (0, 0, queue)
        assert queue in [row.name for row in client.overview()]


def test_a_duplicate_publish_with_the_same_enqueuer_and_seq_is_not_stored(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"dedup-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        for _ in range(2):  # the second publisher resends seqs 1..3 of the same enqueuer
            with client.publisher(queue, window=10, enqueuer="producer-1") as publisher:
                publisher.publish_many([b"a", b"b", b"c"])
        assert client.overview(queue).total == 3


def test_nack_requeues_with_the_redelivered_flag(cluster: LocalCluster, shells: Shells) -> None:
    queue = f"nack-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        client.publish(queue, b"once")
        consumer = client.consume(queue, prefetch=1)
        first = consumer.get(timeout_s=10.0)
        assert first is not None and not first.redelivered
        first.nack(requeue=True)
        again = consumer.get(timeout_s=10.0)
        assert again is not None
        assert again.body == b"once" and again.redelivered
        again.ack()
        consumer.cancel()


def test_reject_dead_letters_into_the_target_queue(cluster: LocalCluster, shells: Shells) -> None:
    dlq, work = f"dlq-{shells.kind}", f"work-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(dlq)
        client.declare_queue(work, QueueConfig(dead_letter_queue=dlq))
        client.publish(work, b"poison")
        consumer = client.consume(work, prefetch=1)
        message = consumer.get(timeout_s=10.0)
        assert message is not None
        message.reject()
        consumer.cancel()
        assert consumer.wait_settled()
        assert drain(client, dlq, 1) == [b"poison"]


def test_a_credited_consumer_gets_only_what_it_was_granted(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"credit-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=50) as publisher:
            publisher.publish_many(b"c%d" % i for i in range(10))
        consumer = client.consume(queue, credited=True)
        assert consumer.get(timeout_s=0.5) is None
        consumer.grant(3)
        got = [consumer.get(timeout_s=10.0) for _ in range(3)]
        assert all(m is not None for m in got)
        assert consumer.get(timeout_s=0.5) is None
        consumer.ack([m for m in got if m is not None])
        consumer.cancel()


def test_errors_are_typed_and_the_state_is_unchanged(cluster: LocalCluster, shells: Shells) -> None:
    queue = f"typed-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue, QueueConfig(max_length=10))
        with pytest.raises(CommandRefused) as refused:
            client.declare_queue(queue, QueueConfig(max_length=20))
        assert refused.value.code == "queue_exists"
        with pytest.raises(CommandRefused) as unknown:
            client.purge_queue("no-such-queue")
        assert unknown.value.code == "unknown_queue"
        assert client.overview(queue).config == QueueConfig(max_length=10)
        assert client.overview("no-such-queue") is None


def test_wrong_credentials_are_refused_with_an_auth_error(
    cluster: LocalCluster, shells: Shells
) -> None:
    with pytest.raises(AuthError):
        shells.connect([cluster.endpoint("n1")], b"00" * 32, connect_timeout_s=2.0)


def test_cluster_status_lists_every_node_with_one_leader(cluster: LocalCluster) -> None:
    rows = cluster.status()
    assert [row["id"] for row in rows] == ["n1", "n2", "n3"]
    assert sum(1 for row in rows if row["role"] == "leader") == 1
    for row in rows:
        for field in ("term", "commit_index", "last_applied", "digest", "pid"):
            assert field in row


def test_data_dir_client_reads_the_endpoints_and_key(cluster: LocalCluster) -> None:
    with cluster.client() as declaring:
        declaring.declare_queue("data-dir-visible")
    with Client.from_data_dir(Path(cluster.data_dir)) as client:
        assert client.node in {"n1", "n2", "n3"}
        assert "data-dir-visible" in client.queues()


def test_callback_style_consumer_gets_every_message_on_its_thread(cluster: LocalCluster) -> None:
    """Threaded shell only: asyncio code iterates with `async for` instead of callbacks."""
    import threading

    with cluster.client() as client:
        client.declare_queue("callbacks")
        got: list[bytes] = []
        done = threading.Event()

        def on_message(message: object) -> None:
            from cluster.client import Message

            assert isinstance(message, Message)
            got.append(message.body)
            message.ack()
            if len(got) == 50:
                done.set()

        consumer = client.consume("callbacks", prefetch=10, on_message=on_message)
        with client.publisher("callbacks", window=50) as publisher:
            publisher.publish_many(b"cb%d" % i for i in range(50))
        assert done.wait(10.0)
        assert sorted(got) == sorted(b"cb%d" % i for i in range(50))
        consumer.cancel()
        assert consumer.wait_settled()


def test_get_takes_one_message_and_its_ack_settles_it(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"dequeue-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        assert client.get(queue) is None
        client.publish(queue, b"one")
        message = client.get(queue)
        assert message is not None and message.body == b"one"
        assert client.overview(queue).checked_out == 1
        message.ack()
        assert client.overview(queue).total == 0


def test_renew_and_modify_are_accepted_for_held_messages(
    cluster: LocalCluster, shells: Shells
) -> None:
    queue = f"modify-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue)
        client.publish(queue, b"m")
        consumer = client.consume(queue, prefetch=1, timeout_ms=60_000)
        message = consumer.get(timeout_s=10.0)
        assert message is not None
        consumer.renew([message])
        consumer.modify([message], delivery_failed=True, annotations=(("x-reason", "retry"),))
        again = consumer.get(timeout_s=10.0)
        assert again is not None and again.body == b"m"
        assert again.delivery_count == 1
        assert again.annotations == (("x-reason", "retry"),)
        again.ack()
        assert consumer.wait_settled()
        assert consumer.settle_errors == 0
        consumer.cancel()


def test_a_publisher_blocked_by_reject_publish_resumes_when_the_queue_drains(
    cluster: LocalCluster, shells: Shells
) -> None:
    import threading

    queue = f"bounded-{shells.kind}"
    with shells.client(cluster) as client:
        client.declare_queue(queue, QueueConfig(max_length=5, overflow="reject_publish"))
        publisher = client.publisher(queue, window=1)
        done = threading.Event()

        def publish_ten() -> None:
            for i in range(10):
                publisher.publish(b"b%d" % i, timeout_s=30.0)
            publisher.wait_for_confirms(timeout_s=30.0)
            done.set()

        producer = threading.Thread(target=publish_ten)
        producer.start()
        deadline = time.monotonic() + 10.0
        while not publisher.blocked and time.monotonic() < deadline:
            time.sleep(0.02)
        assert publisher.blocked, "crossing max_length with reject_publish must block"
        assert not done.is_set()
        drained = drain(client, queue, 10)
        producer.join(30.0)
        assert done.is_set()
        assert sorted(drained) == sorted(b"b%d" % i for i in range(10))


def test_the_asyncio_idioms_publish_consume_and_ack_in_one_coroutine(cluster: LocalCluster) -> None:
    """`async with`, `await publisher.publish`, `async for ... in client.consume`, `await ack()`."""
    import asyncio

    from cluster.client import AsyncClient

    async def scenario() -> tuple[list[bytes], int]:
        endpoints = list(cluster.config.endpoints().values())
        async with AsyncClient(endpoints, cluster.key) as client:
            await client.declare_queue("idioms")
            async with client.publisher("idioms", window=20) as publisher:
                for i in range(30):
                    await publisher.publish(b"i%d" % i)
            got: list[bytes] = []
            consumer = client.consume("idioms", prefetch=10)
            async for message in consumer:
                got.append(message.body)
                await message.ack()
                if len(got) == 30:
                    break
            assert await consumer.wait_settled()
            overview = await client.overview("idioms")
            return got, overview.total if overview else -1

    got, left = asyncio.run(asyncio.wait_for(scenario(), 30.0))
    assert got == [b"i%d" % i for i in range(30)]
    assert left == 0
