"""The quorumq client library: connect, declare queues, publish with confirms, consume and settle.

Two shells share one sans-IO core (`cluster.client.sansio.ClientProtocol`): the threaded
`Client` and the asyncio `AsyncClient`, with the same features.

Example:
    with Client.from_data_dir(Path("D")) as client:
        client.declare_queue("jobs")
        with client.publisher("jobs", window=100) as publisher:
            publisher.publish_many(b"job %d" % i for i in range(1000))
        for message in client.consume("jobs", prefetch=100):
            message.ack()

    async with AsyncClient.from_data_dir(Path("D")) as client:
        async with client.publisher("jobs", window=1000) as publisher:
            await publisher.publish_many(b"job %d" % i for i in range(1000))
        async for message in client.consume("jobs", prefetch=100):
            await message.ack()

    # a cluster with tls = true: verify the nodes with its CA (from_data_dir finds it itself)
    client = Client(["10.0.0.1:5701"], key, tls="/etc/quorumq/ca.crt")

    # in order per key, in parallel across keys (docs/workpool.md)
    processing = client.consume("jobs", prefetch=200).process(handle, workers=16)
"""

from cluster.client.aio import AsyncClient
from cluster.client.aio_consumer import AsyncConsumer, AsyncMessage
from cluster.client.aio_publisher import AsyncPublisher
from cluster.client.balancer import LeaderlessBalancer
from cluster.client.client import Client
from cluster.client.consumer import Consumer, Message
from cluster.client.errors import (
    AuthError,
    ClientClosed,
    ClusterError,
    CommandRefused,
    ConfigError,
    NoQuorum,
    ProtocolError,
    RequestTimeout,
    TlsError,
    Unavailable,
)
from cluster.client.publisher import Publisher
from cluster.client.sansio import ClientProtocol
from cluster.client.workpool import OrderedWorkPool, PoolClosed
from cluster.client.workpool_aio import AsyncOrderedWorkPool
from cluster.client.workpool_consumer import AsyncProcessing, Processing

__all__ = [
    "AsyncClient",
    "AsyncConsumer",
    "AsyncMessage",
    "AsyncOrderedWorkPool",
    "AsyncProcessing",
    "AsyncPublisher",
    "AuthError",
    "Client",
    "ClientClosed",
    "ClientProtocol",
    "ClusterError",
    "CommandRefused",
    "ConfigError",
    "Consumer",
    "LeaderlessBalancer",
    "Message",
    "NoQuorum",
    "OrderedWorkPool",
    "PoolClosed",
    "Processing",
    "ProtocolError",
    "Publisher",
    "RequestTimeout",
    "TlsError",
    "Unavailable",
]
