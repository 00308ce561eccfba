"""aio-pika (aiormq underneath), unchanged, against a real 3-node cluster's AMQP ports."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tests.amqp.conftest import AmqpCluster

aio_pika = pytest.importorskip("aio_pika")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def test_publish_consume_nack_and_get_with_aio_pika(amqp_cluster: AmqpCluster) -> None:
    """Confirmed publishes on n3, a prefetch-limited iterator consumer, a nack with requeue
    that comes back redelivered, and a basic.get, all with headers kept."""
    asyncio.run(_round_trip(amqp_cluster.url(2)))


async def _round_trip(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=5)
        name = f"aio-{uuid.uuid4().hex[:8]}"
        queue = await channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"}
        )
        for number in range(10):
            message = aio_pika.Message(f"m{number}".encode(), headers={"n": number})
            await channel.default_exchange.publish(message, routing_key=name)
        bodies: list[bytes] = []
        nacked = False
        async with queue.iterator() as messages:
            async for incoming in messages:
                if incoming.body == b"m3" and not nacked:
                    nacked = True
                    await incoming.nack(requeue=True)
                    continue
                assert incoming.headers["n"] == int(incoming.body[1:])
                assert incoming.redelivered == (incoming.body == b"m3")
                bodies.append(incoming.body)
                await incoming.ack()
                if len(bodies) == 10:
                    break
        assert sorted(bodies) == sorted(f"m{number}".encode() for number in range(10))
        await channel.default_exchange.publish(aio_pika.Message(b"last"), routing_key=name)
        got = await queue.get(timeout=5)
        assert got is not None and got.body == b"last"
        await got.ack()
        assert await queue.get(fail=False) is None
        await queue.delete(if_unused=False, if_empty=True)


def test_aio_pika_prefetch_holds_back_past_the_window(amqp_cluster: AmqpCluster) -> None:
    """set_qos(prefetch_count=2): an unacking consumer gets 2 of 5 messages until it acks."""
    asyncio.run(_prefetch_window(amqp_cluster.url(1)))


async def _prefetch_window(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=2)
        queue = await channel.declare_queue(f"aio-{uuid.uuid4().hex[:8]}", durable=True)
        for number in range(5):
            await channel.default_exchange.publish(
                aio_pika.Message(f"m{number}".encode()), routing_key=queue.name
            )
        held: asyncio.Queue[Any] = asyncio.Queue()
        await queue.consume(held.put)
        first = [await asyncio.wait_for(held.get(), 10) for _ in range(2)]
        with pytest.raises(asyncio.TimeoutError):  # the window is full: nothing more comes
            await asyncio.wait_for(held.get(), 0.5)
        await first[0].ack()
        third = await asyncio.wait_for(held.get(), 10)
        assert [m.body for m in (*first, third)] == [b"m0", b"m1", b"m2"]
