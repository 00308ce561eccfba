"""The quorumq client library: connect, declare queues, publish with confirms, consume and settle.

Example:
    with Client.from_data_dir(Path("D")) as client:
        client.declare_queue("jobs")
        with client.publisher("jobs", window=100) as publisher:
            publisher.publish_many(b"job %d" % i for i in range(1000))
        for message in client.consume("jobs", prefetch=100):
            message.ack()
"""

from cluster.client.balancer import LeaderlessBalancer
from cluster.client.client import Client
from cluster.client.consumer import Consumer, Message
from cluster.client.errors import (
    AuthError,
    ClientClosed,
    ClusterError,
    CommandRefused,
    ConfigError,
    ProtocolError,
    RequestTimeout,
    Unavailable,
)
from cluster.client.publisher import Publisher

__all__ = [
    "AuthError",
    "Client",
    "ClientClosed",
    "ClusterError",
    "CommandRefused",
    "ConfigError",
    "Consumer",
    "LeaderlessBalancer",
    "Message",
    "ProtocolError",
    "Publisher",
    "RequestTimeout",
    "Unavailable",
]
