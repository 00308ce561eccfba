"""Listener bugs that aio-pika's own test suite found (scripts/run_aiopika_suite.py), each
pinned here with pika against a real 3-node cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.amqp.conftest import AmqpCluster

pika = pytest.importorskip("pika")
from pika.adapters.blocking_connection import BlockingChannel  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def channel(amqp_cluster: AmqpCluster) -> Iterator[BlockingChannel]:
    """A channel on node n1, closed after the test."""
    connection = pika.BlockingConnection(amqp_cluster.params(0))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


@pytest.mark.parametrize("arguments", [{}, {"x-queue-type": "quorum"}])
def test_a_server_named_queue_is_declared(
    channel: BlockingChannel, arguments: dict[str, str]
) -> None:
    """queue.declare with an empty name gets an `amq.gen-` queue (aio-pika's RPC and many of its
    tests declare one): the reserved `amq.` prefix is refused only in names a client chose."""
    declared = channel.queue_declare("", durable=True, arguments=arguments)
    name = declared.method.queue
    assert name.startswith("amq.gen-") and len(name) > len("amq.gen-")
    channel.basic_publish("", name, b"to the server-named queue")
    method, _properties, body = channel.basic_get(name, auto_ack=True)
    assert method is not None and body == b"to the server-named queue"
    assert channel.queue_declare(name, passive=True).method.queue == name
