"""pika's BlockingConnection, unchanged, against a real 3-node cluster's AMQP ports."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.launcher import wait_until
from tests.amqp.conftest import AmqpCluster
from tests.amqp.pika_collect import collecting

pika = pytest.importorskip("pika")
from pika.adapters.blocking_connection import BlockingChannel  # noqa: E402
from pika.exceptions import (  # noqa: E402
    ChannelClosedByBroker,
    ConnectionClosedByBroker,
    NackError,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
    UnroutableError,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def channel(amqp_cluster: AmqpCluster) -> Iterator[BlockingChannel]:
    """A channel with confirms on node n1, closed after the test."""
    connection = pika.BlockingConnection(amqp_cluster.params(0))
    opened = connection.channel()
    opened.confirm_delivery()
    try:
        yield opened
    finally:
        if connection.is_open:
            connection.close()


def _queue(channel: BlockingChannel, **arguments: Any) -> str:
    name = f"q-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", **arguments})
    return name


def _pump(connection: Any, done: Any, what: str, timeout_s: float = 10.0) -> None:
    """Let pika process what arrives until `done()` holds."""

    def check() -> bool | None:
        connection.process_data_events(time_limit=0.05)
        return done() or None

    wait_until(check, timeout_s, what)


def test_wrong_password_is_refused_with_403(amqp_cluster: AmqpCluster) -> None:
    """A wrong password gets RabbitMQ's ACCESS_REFUSED; guest is off unless amqp_guest."""
    wrong = pika.ConnectionParameters(
        "127.0.0.1", amqp_cluster.port(), credentials=pika.PlainCredentials("quorumq", "nope")
    )
    with pytest.raises((ProbableAuthenticationError, ProbableAccessDeniedError)):
        pika.BlockingConnection(wrong)
    guest = pika.ConnectionParameters("127.0.0.1", amqp_cluster.port())
    with pytest.raises((ProbableAuthenticationError, ProbableAccessDeniedError)):
        pika.BlockingConnection(guest)


def test_publish_with_confirms_keeps_properties_end_to_end(channel: BlockingChannel) -> None:
    """Properties and headers published on n1 come back as they were, the body untouched."""
    queue = _queue(channel)
    properties = pika.BasicProperties(
        content_type="application/json", correlation_id="c-1", message_id="m-1",
        headers={"k": "v", "n": 7, "nested": {"a": [1, 2]}}, delivery_mode=2, reply_to="r",
    )  # fmt: skip
    channel.basic_publish("", queue, b'{"x": 1}', properties)
    method, got, body = channel.basic_get(queue, auto_ack=True)
    assert body == b'{"x": 1}' and method.routing_key == queue
    assert (got.content_type, got.correlation_id, got.message_id) == (
        "application/json", "c-1", "m-1"
    )  # fmt: skip
    assert got.headers == {"k": "v", "n": 7, "nested": {"a": [1, 2]}}
    assert channel.basic_get(queue)[0] is None  # get-empty


def test_declare_passive_and_inequivalent_arguments(channel: BlockingChannel) -> None:
    """A passive declare counts messages; a differing declare fails 406 as RabbitMQ's does."""
    queue = _queue(channel, **{"x-max-length": 5})
    channel.basic_publish("", queue, b"one")
    declared = channel.queue_declare(queue, passive=True)
    assert declared.method.message_count == 1
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.queue_declare(
            queue, durable=True, arguments={"x-queue-type": "quorum", "x-max-length": 6}
        )
    assert info.value.reply_code == 406
    assert "inequivalent arg 'x-max-length'" in info.value.reply_text


def test_passive_declare_of_a_missing_queue_is_404(channel: BlockingChannel) -> None:
    """RabbitMQ's NOT_FOUND for a passive declare of a queue that does not exist."""
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.queue_declare("no-such-queue", passive=True)
    assert info.value.reply_code == 404 and "no queue 'no-such-queue'" in info.value.reply_text


def test_consume_with_prefetch_holds_back_past_the_window(channel: BlockingChannel) -> None:
    """With prefetch 2 only two messages are outstanding until one is acked."""
    queue = _queue(channel)
    for number in range(5):
        channel.basic_publish("", queue, f"m{number}".encode())
    channel.basic_qos(prefetch_count=2)
    received: list[tuple[int, bytes]] = []
    channel.basic_consume(queue, lambda _c, m, _p, b: received.append((m.delivery_tag, b)))
    _pump(channel.connection, lambda: len(received) == 2, "two deliveries")
    channel.connection.process_data_events(time_limit=0.3)
    assert len(received) == 2
    channel.basic_ack(received[1][0], multiple=True)
    _pump(channel.connection, lambda: len(received) == 4, "two more")
    assert [body for _tag, body in received] == [b"m0", b"m1", b"m2", b"m3"]


def test_nack_requeue_redelivers_with_delivery_count(channel: BlockingChannel) -> None:
    """nack with requeue redelivers (redelivered, x-delivery-count 1); reject without requeue
    dead-letters to the x-dead-letter-routing-key queue through the default exchange."""
    dead = _queue(channel)
    queue = _queue(channel, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", queue, b"job", pika.BasicProperties(app_id="app"))
    method, _props, _body = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    again, props, body = channel.basic_get(queue)
    assert again.redelivered and body == b"job" and props.app_id == "app"
    assert props.headers == {"x-delivery-count": 1}
    channel.basic_reject(again.delivery_tag, requeue=False)
    dead_method = wait_until(lambda: channel.basic_get(dead, auto_ack=True)[0], 10, "dead")
    assert dead_method.routing_key == dead


def test_dead_letters_carry_rabbitmqs_x_death_headers(channel: BlockingChannel) -> None:
    """A message dead-lettered (expired, then rejected) is delivered with RabbitMQ's x-death
    entry (reason, queue, exchange, routing keys) and x-first-death-* headers; an expired one's
    `expiration` property moves into `original-expiration` (aio-pika's own test reads it)."""
    dead = _queue(channel)
    queue = _queue(channel, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    properties = pika.BasicProperties(expiration="50", headers={"foo": "bar"})
    channel.basic_publish("", queue, b"short-lived", properties)
    deaths = channel.consume(dead, auto_ack=True, inactivity_timeout=10)
    _method, got, body = next(deaths)
    assert body == b"short-lived" and got.expiration is None
    [death] = got.headers["x-death"]
    assert death == {"count": 1, "reason": "expired", "queue": queue, "exchange": "",
                     "routing-keys": [queue], "original-expiration": "50"}  # fmt: skip
    assert got.headers["foo"] == "bar"
    assert (got.headers["x-first-death-reason"], got.headers["x-first-death-queue"]) == (
        "expired", queue,
    )  # fmt: skip
    channel.basic_publish("", queue, b"refused")
    refused, _props, _body = channel.basic_get(queue)
    channel.basic_reject(refused.delivery_tag, requeue=False)
    _method, got, body = next(deaths)
    assert body == b"refused" and got.headers["x-death"][0]["reason"] == "rejected"
    channel.cancel()


def test_mandatory_publish_to_no_queue_is_returned(channel: BlockingChannel) -> None:
    """RabbitMQ's NO_ROUTE: pika raises UnroutableError for a mandatory unroutable publish."""
    with pytest.raises(UnroutableError):
        channel.basic_publish("", "no-such-queue", b"x", mandatory=True)
    channel.basic_publish("", "no-such-queue", b"x")  # not mandatory: confirmed, dropped


def test_reject_publish_overflow_nacks(channel: BlockingChannel) -> None:
    """x-overflow reject-publish at x-max-length: the publish is nacked."""
    queue = _queue(channel, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.basic_publish("", queue, b"fits")
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"over")


def test_single_active_consumer_fails_over_to_the_waiting_one(
    amqp_cluster: AmqpCluster, channel: BlockingChannel
) -> None:
    """x-single-active-consumer: the second consumer (on n2) gets messages only once the first
    one's connection closed, the message the first held unacked included (pika cancels the
    consumer before closing: the waiting one is activated by the cancel, as in RabbitMQ)."""
    queue = _queue(channel, **{"x-single-active-consumer": True})
    for body in (b"a", b"b"):
        channel.basic_publish("", queue, body)
    first = pika.BlockingConnection(amqp_cluster.params(0))
    first_channel = first.channel()
    first_channel.basic_qos(prefetch_count=1)
    held = next(first_channel.consume(queue, inactivity_timeout=10))
    assert held[2] == b"a"
    second = pika.BlockingConnection(amqp_cluster.params(1))
    second_channel = second.channel()
    got: list[bytes] = []
    second_channel.basic_consume(queue, collecting(got))
    second.process_data_events(time_limit=0.5)
    assert got == []
    first.close()
    _pump(second, lambda: len(got) == 2, "failover", timeout_s=15)
    assert sorted(got) == [b"a", b"b"]
    second.close()


def test_queue_delete_if_empty_and_purge(channel: BlockingChannel) -> None:
    """delete if-empty refuses a queue holding messages (406); purge empties it."""
    queue = _queue(channel)
    channel.basic_publish("", queue, b"x")
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.queue_delete(queue, if_empty=True)
    assert info.value.reply_code == 406
    reopened = channel.connection.channel()
    assert reopened.queue_purge(queue).method.message_count == 1
    assert reopened.queue_delete(queue, if_empty=True).method.message_count == 0


@pytest.mark.parametrize(
    "refused",
    [
        lambda ch: ch.tx_select(),
        lambda ch: ch.queue_declare("p", durable=True, arguments={"x-max-priority": 5}),
    ],
    ids=["transactions", "x-max-priority"],
)  # (exchanges: 540 only before machine v4, test_amqp_exchanges.py; this cluster runs v4)
def test_what_is_not_implemented_is_refused_with_540(
    amqp_cluster: AmqpCluster, refused: Any
) -> None:
    """Never accepted and ignored: 540 NOT_IMPLEMENTED, closing the connection, naming it."""
    connection = pika.BlockingConnection(amqp_cluster.params(2))
    opened = connection.channel()
    opened.confirm_delivery()
    with pytest.raises(ConnectionClosedByBroker) as info:
        refused(opened)
    assert info.value.reply_code == 540
    assert "NOT_IMPLEMENTED" in info.value.reply_text


def test_consumer_timeout_closes_the_channel_with_406(channel: BlockingChannel) -> None:
    """x-consumer-timeout: a delivery held past it closes the channel with RabbitMQ's text,
    and the message goes back to the queue."""
    queue = _queue(channel, **{"x-consumer-timeout": 1000})
    channel.basic_publish("", queue, b"slow")
    consumer = channel.connection.channel()
    held: list[bytes] = []
    reasons: list[Any] = []
    consumer._impl.add_on_close_callback(lambda _channel, reason: reasons.append(reason))
    consumer.basic_consume(queue, lambda _c, _m, _p, body: held.append(body))
    _pump(channel.connection, lambda: bool(reasons), "the channel to be closed", timeout_s=15)
    assert held == [b"slow"]
    assert isinstance(reasons[0], ChannelClosedByBroker) and reasons[0].reply_code == 406
    assert "delivery acknowledgement on channel" in reasons[0].reply_text
    assert "timed out. Timeout value used: 1000 ms" in reasons[0].reply_text
    again = channel.basic_get(queue, auto_ack=True)
    assert again[2] == b"slow" and again[0].redelivered


def test_deleting_the_queue_cancels_its_consumers(channel: BlockingChannel) -> None:
    """consumer_cancel_notify: the client is sent basic.cancel when the queue is deleted."""
    queue = _queue(channel)
    consumer = channel.connection.channel()
    cancelled: list[Any] = []
    consumer.add_on_cancel_callback(cancelled.append)
    consumer.basic_consume(queue, lambda *_args: None)
    channel.queue_delete(queue)
    _pump(channel.connection, lambda: bool(cancelled), "basic.cancel from the node")


def test_the_native_client_reads_what_amqp_published(
    amqp_cluster: AmqpCluster, channel: BlockingChannel
) -> None:
    """A bare body for the native client; with properties, `envelope.split` gives both."""
    from cluster.amqp import envelope

    queue = _queue(channel)
    channel.basic_publish("", queue, b"plain", pika.BasicProperties(delivery_mode=2))
    channel.basic_publish("", queue, b"rich", pika.BasicProperties(message_id="id-7"))
    client = amqp_cluster.cluster.client()
    try:
        first = client.get(queue, settled=True)
        second = client.get(queue, settled=True)
    finally:
        client.close()
    assert first is not None and first.body == b"plain"
    assert second is not None
    properties, body = envelope.split(second.body)
    assert body == b"rich" and envelope.properties_of(properties).message_id == "id-7"


def test_an_exclusive_consumer_keeps_the_queue_to_itself(
    amqp_cluster: AmqpCluster, channel: BlockingChannel
) -> None:
    """basic.consume exclusive: another consumer (another connection) gets 403."""
    queue = _queue(channel)
    channel.basic_consume(queue, lambda *_args: None, exclusive=True)
    other = pika.BlockingConnection(amqp_cluster.params(0))
    try:
        with pytest.raises(ChannelClosedByBroker) as info:
            other.channel().basic_consume(queue, lambda *_args: None)
        assert info.value.reply_code == 403 and "in exclusive use" in info.value.reply_text
    finally:
        other.close()


def test_message_groups_through_x_quorumq_arguments(
    amqp_cluster: AmqpCluster, channel: BlockingChannel
) -> None:
    """x-quorumq-group-policy makes a grouped queue (machine v3); the x-group-id header of a
    publish names the message's group; redeclaring it ungrouped is 406."""
    queue = _queue(channel, **{"x-quorumq-group-policy": "sequenced"})
    for group in ("a", "a", "b"):
        channel.basic_publish("", queue, group.encode(), pika.BasicProperties(
            headers={"x-group-id": group}))  # fmt: skip
    client = amqp_cluster.cluster.client()
    try:
        waiting = {info.group: info.ready for info in client.groups(queue)}
    finally:
        client.close()
    assert waiting == {"a": 2, "b": 1}
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    assert info.value.reply_code == 406 and "x-quorumq-group" in info.value.reply_text
