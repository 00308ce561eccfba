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


def test_kombu_requeue_redelivers_with_delivery_count(amqp_cluster: AmqpCluster) -> None:
    """message.requeue() (basic.reject with requeue) gives the message back: it comes again,
    redelivered, with RabbitMQ's x-delivery-count header; the second time it is acked."""
    name = f"kombu-{uuid.uuid4().hex[:8]}"
    queue = kombu.Queue(name, kombu.Exchange(""), routing_key=name, durable=True,
                        queue_arguments={"x-queue-type": "quorum"})  # fmt: skip
    with kombu.Connection(amqp_cluster.url(2), transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish({"job": 1}, routing_key=name, declare=[queue], serializer="json")
        seen: list[tuple[bool, Any]] = []

        def on_message(body: dict[str, Any], message: Any) -> None:
            seen.append((message.delivery_info["redelivered"], message.headers))
            message.ack() if len(seen) == 2 else message.requeue()

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=1):
            while len(seen) < 2:
                conn.drain_events(timeout=10)
        assert seen[0][0] is False and "x-delivery-count" not in (seen[0][1] or {})
        assert seen[1][0] is True and seen[1][1]["x-delivery-count"] == 1
        assert queue(conn.default_channel).get() is None


def test_kombu_prefetch_holds_back_past_the_window(amqp_cluster: AmqpCluster) -> None:
    """prefetch_count=2: a consumer that has not acked gets 2 of 5 messages, a third once it
    acks one."""
    name = f"kombu-{uuid.uuid4().hex[:8]}"
    queue = kombu.Queue(name, kombu.Exchange(""), routing_key=name, durable=True,
                        queue_arguments={"x-queue-type": "quorum"})  # fmt: skip
    with kombu.Connection(amqp_cluster.url(0), transport_options={"confirm_publish": True}) as conn:
        for number in range(5):
            conn.Producer().publish({"n": number}, routing_key=name, declare=[queue],
                                    serializer="json")  # fmt: skip
        held: list[Any] = []
        with conn.Consumer(queue, callbacks=[lambda _b, m: held.append(m)], prefetch_count=2):
            while len(held) < 2:
                conn.drain_events(timeout=10)
            with pytest.raises(TimeoutError):  # the window is full: nothing more comes
                conn.drain_events(timeout=0.5)
            held[0].ack()
            conn.drain_events(timeout=10)
        assert [message.payload["n"] for message in held] == [0, 1, 2]
