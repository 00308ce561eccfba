"""Replies over the frame limit (issue 12): a delivery is split across frames, a query is
refused with a clear error; before, both were dropped with only a log line (the consumer stalled
with its messages checked out, the caller waited for its timeout)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import protocol
from cluster.errors import ProtocolError
from cluster.launcher import LocalCluster, init_cluster, start_cluster
from cluster.node.effects import split_delivery
from cluster.node.session import PUBLISH_BODY_BYTES_MAX
from cluster.rawclient import RawClient
from fifo import limits
from fifo.commands import (
    Checkout,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    Modify,
    SimplePrefetch,
)
from fifo.effects import Deliver, Delivery
from fifo.replies import CheckoutOk, Ok

pytestmark = pytest.mark.cluster

BODY = 300 * 1024
COUNT = 100  # 30 MB in one delivery: nearly twice the 16 MiB frame limit


def test_split_delivery_keeps_order_and_fits() -> None:
    messages = tuple(Delivery(i, b"x" * 1000, False, 0) for i in range(50))
    effect = Deliver(None, "q", "t", 1, messages)  # type: ignore[arg-type]
    parts = split_delivery(effect, limit=10_000)
    assert [m.msg_id for p in parts for m in p.messages] == list(range(50))
    assert all(sum(len(m.body) + 256 for m in p.messages) <= 10_000 for p in parts)


def test_a_prefetch_of_large_messages_arrives_whole(tmp_path: Path) -> None:
    cfg = init_cluster(tmp_path / "D", nodes=1)
    cluster = LocalCluster(tmp_path / "D", cfg)
    try:
        cluster.start_node("n1")
        publisher = cluster.raw_client("n1", name="publisher")
        publisher.command(DeclareQueue("big"))
        for i in range(COUNT):
            publisher.command(Enqueue("big", bytes([i]) * BODY))
        with pytest.raises(ProtocolError) as caught:
            publisher.query("messages", queue="big", limit=COUNT)
        assert caught.value.code == protocol.REPLY_TOO_LARGE
        consumer = cluster.raw_client("n1", name="consumer")
        reply = consumer.command(
            Checkout("big", ConsumerId("c", consumer.connection), SimplePrefetch(COUNT))
        )
        assert isinstance(reply, CheckoutOk)
        received: list[Delivery] = []
        for _ in range(200):
            effects = consumer.read_effects(1, timeout_s=10)
            consumer.effects.clear()
            received += [m for e in effects if isinstance(e, Deliver) for m in e.messages]
            if len(received) >= COUNT or not effects:
                break
        assert sorted(m.body[0] for m in received) == list(range(COUNT))
        assert all(len(m.body) == BODY for m in received)
        publisher.close()
        consumer.close()
    finally:
        cluster.stop()


def test_the_cli_consumer_on_a_follower_gets_a_prefetch_of_large_messages(tmp_path: Path) -> None:
    """Acceptance 4 on a 3-node cluster: `quorumq consume --prefetch 100` attached to a follower
    (whose effect router splits the 30 MB delivery) prints all 100 messages of 300 KB."""
    data_dir = tmp_path / "D"
    init_cluster(data_dir, 3)
    cluster = start_cluster(data_dir, 3)
    try:
        follower = cluster.followers()[0]
        with cluster.client() as client:
            client.declare_queue("big")
            with client.publisher("big", window=10) as publisher:
                for i in range(COUNT):
                    publisher.publish(b"%05d" % i + b"x" * (BODY - 5))
                publisher.wait_for_confirms(120)
        command = [
            *(sys.executable, "-m", "cluster.cli", "--endpoints", cluster.endpoint(follower)),
            *("--credentials", str(data_dir / "client.key"), "-o", "jsonl", "consume", "big"),
            *("--prefetch", str(COUNT), "--count", str(COUNT), "--timeout", "60"),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        assert sorted(int(row["body"][:5]) for row in rows) == list(range(COUNT))
        assert all(len(row["body"]) == BODY for row in rows)
        with cluster.client() as client:
            overview = client.overview("big")
            assert overview is not None and overview.total == 0  # every one acked
    finally:
        cluster.stop()


def test_a_body_that_fits_a_publish_frame_but_not_its_delivery_is_refused(tmp_path: Path) -> None:
    """A publish whose body leaves no room for the annotations a delivery may carry is refused
    (before, 16 MiB - 1 KiB was stored, and once modify added annotations its delivery frame was
    over the limit and dropped, again on every redelivery); the largest body accepted, with the
    most annotations a message can get, is delivered whole."""
    cfg = init_cluster(tmp_path / "D", nodes=1)
    cluster = LocalCluster(tmp_path / "D", cfg)
    try:
        cluster.start_node("n1")
        client = cluster.raw_client("n1", name="big-body")
        client.command(DeclareQueue("huge"))
        with pytest.raises(ProtocolError) as caught:
            client.command(Enqueue("huge", b"x" * (protocol.FRAME_BYTES_MAX_DEFAULT - 1024)))
        assert caught.value.code == protocol.BAD_COMMAND
        assert f"at most {PUBLISH_BODY_BYTES_MAX}" in caught.value.message
        assert client.command(Enqueue("huge", b"y" * PUBLISH_BODY_BYTES_MAX)) == Ok()
        reply = client.command(
            Checkout("huge", ConsumerId("c", client.connection), SimplePrefetch(1))
        )
        assert isinstance(reply, CheckoutOk)
        first = _one_delivery(client)
        annotations = tuple(
            (
                f"{i:02d}" + "k" * (limits.annotation_bytes_max - 2),
                "v" * limits.annotation_bytes_max,
            )
            for i in range(limits.annotations_per_message_max)
        )
        modify = Modify("huge", reply.consumer_key, (first.msg_id,), False, False, annotations)
        assert client.command(modify) == Ok()
        again = _one_delivery(client)
        assert again.msg_id != first.msg_id or again.redelivered
        assert len(again.body) == PUBLISH_BODY_BYTES_MAX
        assert len(again.annotations) == limits.annotations_per_message_max
        client.close()
    finally:
        cluster.stop()


def _one_delivery(client: RawClient) -> Delivery:
    effects = client.read_effects(1, timeout_s=20)
    client.effects.clear()
    messages = [m for e in effects if isinstance(e, Deliver) for m in e.messages]
    assert len(messages) == 1, effects
    return messages[0]
