"""kombu over py-amqp (`amqp://`, Celery's default transport), unchanged, against the cluster."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.amqp.conftest import AmqpCluster

kombu = pytest.importorskip("kombu")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def test_kombu_publishes_with_confirms_and_consumes_with_prefetch(
    amqp_cluster: AmqpCluster,
) -> None:
    """A queue on the default exchange: confirmed publishes (py-amqp's confirm_publish) and a
    consumer with prefetch 5 that gets and acks every message."""
    name = f"kombu-{uuid.uuid4().hex[:8]}"
    url = amqp_cluster.url(1)
    queue = kombu.Queue(name, kombu.Exchange(""), routing_key=name, durable=True,
                        queue_arguments={"x-queue-type": "quorum"})  # fmt: skip
    with kombu.Connection(url, transport_options={"confirm_publish": True}) as connection:
        producer = connection.Producer()
        for number in range(20):
            producer.publish({"n": number}, routing_key=name, declare=[queue], serializer="json")
        received: list[int] = []

        def on_message(body: dict[str, Any], message: Any) -> None:
            received.append(body["n"])
            message.ack()

        with connection.Consumer(queue, callbacks=[on_message], prefetch_count=5):
            while len(received) < 20:
                connection.drain_events(timeout=10)
        assert sorted(received) == list(range(20))
