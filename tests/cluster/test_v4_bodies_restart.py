"""Real node processes running machine v4 (issue 32): messages keep only a reference to their
body in the state, so a node reads every body back from its journal to send it. Publish, restart
the node the consumer will use (its body cache is empty then), and take the exact bodies back
there, in order, by basic.get, by peek and by a consumer, natively and through AMQP 0-9-1.

Snapshots are taken every 20 entries, so the log is compacted many times over the publishes:
the entries that hold live bodies are retained (`raft.retention`, named by
`fifo.live_entry_indexes`) and the restarted node loads its snapshot, then reads the bodies
back from the retained entries."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from cluster import config
from cluster.launcher import LocalCluster, init_cluster, wait_until
from raft import storage
from raft.errors import StorageError

pytestmark = pytest.mark.cluster

MESSAGES = 300
QUEUE = "backlog"


def _bodies() -> list[bytes]:
    rng = random.Random(32)
    return [rng.randbytes(rng.randrange(1, 3000)) for _ in range(MESSAGES)]


def _sums(bodies: list[bytes]) -> list[str]:
    return [hashlib.sha256(body).hexdigest() for body in bodies]


def test_a_restarted_node_sends_the_exact_bodies_in_order(tmp_path: Path) -> None:
    """Every body comes back byte for byte (checksums), in publish order, from a node that was
    restarted after the publishes: read back from its journal, never from the state."""
    cfg = dataclasses.replace(init_cluster(tmp_path / "D", nodes=3), snapshot_every_entries=20)
    config.write(tmp_path / "D", cfg)
    cluster = LocalCluster(tmp_path / "D", cfg)
    try:
        for node in cfg.nodes:
            cluster.start_node(node.id)
        leader = cluster.leader()
        raw = cluster.raw_client(leader)
        wait_until(lambda: raw.query("machine")["effective_version"] == 4, 30, "machine v4")
        raw.close()
        bodies = _bodies()
        with cluster.client(leader) as client:
            client.declare_queue(QUEUE)
            before = _commit_index(cluster, leader)
            with client.publisher(QUEUE, window=5) as publisher:  # many entries: snapshots
                for body in bodies:
                    publisher.publish(body)
                publisher.wait_for_confirms(60)
        restarted = next(node.id for node in cluster.config.nodes if node.id != leader)
        # its log compacted past some publishes: their bodies are in retained entries only
        wait_until(lambda: _snapshot_index(tmp_path / "D" / restarted, restarted) > before + 10,
                   30, "a snapshot of the node to restart past the first publishes")  # fmt: skip
        cluster.restart(restarted)
        node_log = tmp_path / "D" / restarted / "node.log"
        with cluster.client(restarted, only=True) as client:
            wait_until(lambda: _ready(client) == MESSAGES, 30, "the restarted node to catch up")
            peeked = [info.body for info in client.messages(QUEUE, limit=3)]
            assert _sums(peeked) == _sums(bodies[:3])
            first = client.get(QUEUE, settled=True)
            assert first is not None and _sums([first.body]) == _sums(bodies[:1])
            consumer = client.consume(QUEUE, prefetch=50)
            got: list[bytes] = []
            for message in consumer.messages(idle_timeout_s=10):
                got.append(message.body)
                message.ack()
                if len(got) == MESSAGES - 1:
                    break
            assert _sums(got) == _sums(bodies[1:])
        _amqp_round_trip(cluster, leader, restarted, bodies[:20])
        assert "body_missing" not in node_log.read_text()
    finally:
        cluster.stop()


def _amqp_round_trip(cluster: LocalCluster, publish_on: str, take_on: str,
                     bodies: list[bytes]) -> None:  # fmt: skip
    """The same through AMQP 0-9-1: published on one node, basic.get and basic.consume on the
    other, which reads the bodies back from its journal."""
    pika = pytest.importorskip("pika")
    credentials = pika.PlainCredentials("quorumq", cluster.key.decode("ascii"))

    def params(node_id: str) -> Any:
        port = cluster.config.node(node_id).amqp_port
        return pika.ConnectionParameters("127.0.0.1", port, credentials=credentials,
                                         socket_timeout=30, stack_timeout=60)  # fmt: skip

    with pika.BlockingConnection(params(publish_on)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("amqp-bodies", durable=True, arguments={"x-queue-type": "quorum"})
        for body in bodies:
            channel.basic_publish("", "amqp-bodies", body)
    with pika.BlockingConnection(params(take_on)) as connection:
        channel = connection.channel()
        wait_until(lambda: channel.queue_declare("amqp-bodies", passive=True).method.message_count
                   == len(bodies), 30, "the AMQP publishes on the other node")  # fmt: skip
        _method, _properties, first = channel.basic_get("amqp-bodies", auto_ack=True)
        got = [first]
        for method, _properties, body in channel.consume("amqp-bodies", inactivity_timeout=10):
            if method is None:
                break
            got.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(got) == len(bodies):
                break
        channel.cancel()
    assert _sums(got) == _sums(bodies)


def _commit_index(cluster: LocalCluster, node_id: str) -> int:
    status = cluster.statuses()[node_id]
    assert status is not None
    return int(status["commit_index"])


def _snapshot_index(node_dir: Path, node_id: str) -> int:
    """The index a node's last snapshot covers (its log was compacted below it); 0 if none."""
    try:
        return int(storage.read_dump_body(node_dir / "raft.dump", node_id)["raft"]["prev"][1])
    except (OSError, StorageError):
        return 0


def _ready(client: object) -> int:
    overview = client.overview(QUEUE)  # type: ignore[attr-defined]
    return 0 if overview is None else int(overview.ready)
