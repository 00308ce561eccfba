"""Real node processes running machine v4 (issue 31, item 3): a connection cannot settle,
return, discard, modify or renew the deliveries of another connection's consumer.

Connection A consumes on the leader; connection B, authenticated too, on another node, names
A's consumer key and message ids in every settling command (keys and ids are small integers,
easy to guess). Each is refused with `not_owner`; A still holds every message, and A's own
acks afterwards are `ok` and remove them: nothing was dropped unprocessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.client.errors import CommandRefused
from cluster.launcher import LocalCluster, init_cluster, wait_until
from fifo.commands import BoundDiscard, Command, Discard, Modify, RenewLocks, Return, Settle
from fifo.replies import Ok
from tests.management.helpers import admin_auth, base_url, http

pytestmark = pytest.mark.cluster

QUEUE = "owned"
MESSAGES = 5


def test_another_connection_cannot_settle_a_consumers_deliveries(tmp_path: Path) -> None:
    """B's discard, settle, return, modify and renew of A's deliveries are refused with
    not_owner and change nothing (also a bound discard naming A's connection); A's later ack
    of the same ids is ok."""
    cfg = init_cluster(tmp_path / "D", nodes=3, http_base_port=0)
    cluster = LocalCluster(tmp_path / "D", cfg)
    try:
        for node in cfg.nodes:
            cluster.start_node(node.id)
        leader = cluster.leader()
        other = next(node.id for node in cfg.nodes if node.id != leader)
        raw = cluster.raw_client(leader)
        wait_until(lambda: raw.query("machine")["effective_version"] == 4, 30, "machine v4")
        raw.close()
        with cluster.client(leader, only=True) as owner, \
                cluster.client(other, only=True) as attacker:  # fmt: skip
            owner.declare_queue(QUEUE)
            for number in range(MESSAGES):
                owner.publish(QUEUE, b"job %d" % number)
            consumer = owner.consume(QUEUE, prefetch=MESSAGES)
            held = []
            for message in consumer.messages(idle_timeout_s=10):
                held.append(message)
                if len(held) == MESSAGES:
                    break
            key = held[0].consumer_key
            ids = tuple(message.msg_id for message in held)
            foreign: list[Command] = [
                Discard(QUEUE, key, ids), Settle(QUEUE, key, ids), Return(QUEUE, key, ids),
                Modify(QUEUE, key, ids, True, True), RenewLocks(QUEUE, key, ids),
            ]  # fmt: skip
            # the consumer list shows whose it is; naming that connection in a bound form is
            # no way round: the node puts the sender's own connection in its place
            listed = wait_until(  # the attacker's node (a follower) may apply the checkout later
                lambda: attacker.consumers(QUEUE)[QUEUE], 10, "the consumer on the other node"
            )
            owner_connection = listed[0].connection
            foreign.append(BoundDiscard(QUEUE, key, ids, owner_connection))
            for command in foreign:
                with pytest.raises(CommandRefused) as refused:
                    attacker.command(command)
                assert refused.value.code == "not_owner", (type(command).__name__, refused.value)
                overview = attacker.overview(QUEUE)
                assert overview is not None and overview.checked_out == MESSAGES
            assert isinstance(owner.command(Settle(QUEUE, key, ids)), Ok)
            wait_until(lambda: _total(attacker) == 0, 30, "the owner's acks to apply everywhere")
            consumer.close()
            _amqp_acks_are_bound_and_accepted(cluster, other, attacker)
            _management_get_requeues_its_own(cluster, other, attacker)
    finally:
        cluster.stop()


def _amqp_acks_are_bound_and_accepted(cluster: LocalCluster, node_id: str, reader: Any) -> None:
    """Through AMQP 0-9-1 the node binds its connection into acks and rejects too (a delivery
    tag means something on its channel only): the owner's basic.ack and basic.nack apply, so
    the queue empties."""
    pika = pytest.importorskip("pika")
    credentials = pika.PlainCredentials("quorumq", cluster.key.decode("ascii"))
    port = cluster.config.node(node_id).amqp_port
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=credentials,
                                       socket_timeout=30, stack_timeout=60)  # fmt: skip
    with pika.BlockingConnection(params) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("amqp-owned", durable=True, arguments={"x-queue-type": "quorum"})
        for number in range(2 * MESSAGES):
            channel.basic_publish("", "amqp-owned", b"amqp %d" % number)
        deliveries = channel.consume("amqp-owned", inactivity_timeout=10)
        for taken, (method, _properties, _body) in enumerate(deliveries, start=1):
            assert method is not None, "the AMQP deliveries did not arrive"
            if taken % 2:
                channel.basic_ack(method.delivery_tag)
            else:
                channel.basic_nack(method.delivery_tag, requeue=False)
            if taken == 2 * MESSAGES:
                break
        wait_until(lambda: _total(reader, "amqp-owned") == 0, 30, "the AMQP acks and nacks")
        channel.cancel()


def _management_get_requeues_its_own(cluster: LocalCluster, node_id: str, reader: Any) -> None:
    """A management get with requeue gives back what it took, bound to its own connection:
    accepted, so every message is waiting again (none left checked out)."""
    url, auth = base_url(cluster, node_id) + "/api/queues/mgmt-owned", admin_auth(cluster)
    assert http(url, "PUT", auth=auth, body={"config": {}})[0] == 200
    for number in range(MESSAGES):
        assert http(url + "/publish", "POST", auth=auth, body={"body": f"m{number}"})[0] == 200
    status, got, _ = http(url + "/get", "POST", auth=auth, body={"count": MESSAGES})
    assert status == 200 and len(got["messages"]) == MESSAGES, got
    overview = reader.overview("mgmt-owned")
    assert overview is not None and (overview.total, overview.checked_out) == (MESSAGES, 0)


def _total(client: Any, queue: str = QUEUE) -> int:
    overview = client.overview(queue)
    assert overview is not None
    return int(overview.total)
