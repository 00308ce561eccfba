"""Single active consumer failover when the active consumer's node is killed (SIGKILL): the
waiting consumer on another node gets every message, the held one included."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cluster.launcher import start_cluster, wait_until
from tests.amqp.conftest import AmqpCluster, upgrade_to_latest
from tests.amqp.pika_collect import collecting

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def killable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpCluster]:
    """A cluster of its own: the test kills one of its nodes."""
    cluster = start_cluster(tmp_path_factory.mktemp("amqp-kill") / "D", nodes=3)
    try:
        upgrade_to_latest(cluster)
        yield AmqpCluster(cluster, cluster.key.decode("ascii"))
    finally:
        cluster.stop()


def test_sac_fails_over_when_the_active_consumers_node_is_killed(killable: AmqpCluster) -> None:
    """x-quorumq-disconnected-timeout 1 s: after the kill the consumer on the survivor gets
    the message the dead one held, then the rest."""
    cluster = killable.cluster
    leader = cluster.leader()
    ids = [node.id for node in cluster.config.nodes]
    victim = next(node_id for node_id in ids if node_id != leader)
    survivor = ids.index(leader)
    publisher = pika.BlockingConnection(killable.params(survivor))
    channel = publisher.channel()
    channel.confirm_delivery()
    queue = f"sac-kill-{uuid.uuid4().hex[:6]}"
    channel.queue_declare(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-single-active-consumer": True,
        "x-quorumq-disconnected-timeout": 1000,
    })  # fmt: skip
    for body in (b"m1", b"m2"):
        channel.basic_publish("", queue, body)
    doomed = pika.BlockingConnection(killable.params(ids.index(victim)))
    doomed_channel = doomed.channel()
    doomed_channel.basic_qos(prefetch_count=1)
    assert next(doomed_channel.consume(queue, inactivity_timeout=10))[2] == b"m1"
    got: list[bytes] = []
    waiting = pika.BlockingConnection(killable.params(survivor))
    waiting.channel().basic_consume(queue, collecting(got))
    waiting.process_data_events(time_limit=0.5)
    assert got == []
    cluster.kill(victim)

    def both() -> bool | None:
        waiting.process_data_events(time_limit=0.1)
        return len(got) == 2 or None

    wait_until(both, 30, "the waiting consumer to get m1 and m2")
    assert sorted(got) == [b"m1", b"m2"]
    waiting.close()
    publisher.close()
