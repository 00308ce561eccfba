"""A cluster left on machine v1 (what `cluster start` creates until `machine upgrade`): the
listener uses v1's commands (Return instead of Modify and Remove) and pika's SelectConnection
publishes with confirms and consumes as on v3."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.launcher import start_cluster
from tests.amqp.conftest import AmqpCluster

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def v1_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpCluster]:
    """3 nodes on machine v1."""
    cluster = start_cluster(tmp_path_factory.mktemp("amqp-v1") / "D", nodes=3)
    try:
        yield AmqpCluster(cluster, cluster.key.decode("ascii"))
    finally:
        cluster.stop()


def test_nack_and_channel_close_give_messages_back_on_v1(v1_cluster: AmqpCluster) -> None:
    """nack with requeue redelivers; a channel closed with an unacked delivery returns it."""
    connection = pika.BlockingConnection(v1_cluster.params(1))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = f"v1-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, b"one", pika.BasicProperties(correlation_id="c"))
    method, _props, _body = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    holder = connection.channel()
    again, props, body = holder.basic_get(queue)
    assert again.redelivered and body == b"one" and props.correlation_id == "c"
    holder.close()  # unacked: back to the queue
    last = channel.basic_get(queue, auto_ack=True)
    assert last[2] == b"one"
    connection.close()


def test_select_connection_publishes_with_confirms_and_consumes(v1_cluster: AmqpCluster) -> None:
    """pika's asynchronous adapter: 200 confirmed publishes, then a prefetch-20 consumer."""
    queue = f"select-{uuid.uuid4().hex[:8]}"
    state: dict[str, Any] = {"acked": 0, "received": 0, "error": None}

    def on_open(connection: Any) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel: Any) -> None:
        state["channel"] = channel
        channel.queue_declare(queue, durable=True, callback=lambda _frame: confirm(channel))

    def confirm(channel: Any) -> None:
        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: publish(channel))

    def publish(channel: Any) -> None:
        for number in range(200):
            channel.basic_publish("", queue, str(number).encode())

    def on_confirm(frame: Any) -> None:
        if isinstance(frame.method, pika.spec.Basic.Nack):
            state["error"] = "nacked"
        state["acked"] = frame.method.delivery_tag if frame.method.multiple else state["acked"] + 1
        if state["acked"] == 200:
            channel = state["channel"]
            channel.basic_qos(prefetch_count=20, callback=lambda _f: consume(channel))

    def consume(channel: Any) -> None:
        channel.basic_consume(queue, on_message)

    def on_message(channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        channel.basic_ack(method.delivery_tag)
        state["received"] += 1
        if state["received"] == 200:
            channel.connection.close()

    connection = pika.SelectConnection(
        v1_cluster.params(0), on_open_callback=on_open,
        on_close_callback=lambda conn, _reason: conn.ioloop.stop(),
    )  # fmt: skip
    connection.ioloop.call_later(60, connection.ioloop.stop)
    connection.ioloop.start()
    assert state["error"] is None
    assert (state["acked"], state["received"]) == (200, 200)
