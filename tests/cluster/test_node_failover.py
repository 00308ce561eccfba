"""Crashes and restarts of real node processes: elections, catch-up, replayed effects."""

from __future__ import annotations

import pytest

from cluster.testing import LocalCluster, wait_until
from fifo.commands import Checkout, ConsumerId, DeclareQueue, Enqueue, SimplePrefetch
from fifo.effects import Deliver
from fifo.replies import CheckoutOk, Ok

pytestmark = pytest.mark.cluster


def others(node_id: str) -> list[str]:
    return [n for n in ("n1", "n2", "n3") if n != node_id]


def test_killing_the_leader_elects_a_new_one_and_commands_keep_working(
    cluster3: LocalCluster,
) -> None:
    """kill -9 of the leader: a survivor leads, publishes succeed, the restarted node catches up."""
    old = cluster3.leader()
    client = cluster3.client(others(old)[0])
    client.command(DeclareQueue("fail"))
    for i in range(20):
        assert client.command(Enqueue("fail", b"before%d" % i)) == Ok()
    cluster3.kill(old)

    def publish() -> bool:
        try:
            return bool(client.command(Enqueue("fail", b"after")) == Ok())
        except Exception:
            return False

    wait_until(publish, 15, "a publish after the leader was killed")
    new = cluster3.leader()
    assert new != old
    cluster3.start_node(old)
    statuses = cluster3.converged()
    assert statuses[old]["role"] == "follower"
    overview = client.query("overview", queue="fail")
    assert overview["total"] >= 21
    client.close()


def test_a_restarted_follower_catches_up_from_journal_and_dump(cluster3: LocalCluster) -> None:
    """A follower killed, missing writes, then restarted (after a snapshot) has an equal digest."""
    leader = cluster3.leader()
    follower = others(leader)[0]
    client = cluster3.client(leader)
    client.command(DeclareQueue("catch"))
    for i in range(30):
        client.command(Enqueue("catch", b"a%d" % i))
    cluster3.converged()
    client.admin("snapshot")  # the leader's journal is compacted into its dump
    cluster3.kill(follower)
    for i in range(30):
        client.command(Enqueue("catch", b"b%d" % i))
    cluster3.start_node(follower)
    statuses = cluster3.converged()
    assert {s["digest"] for s in statuses.values() if s} == {statuses[leader]["digest"]}
    client.close()
    assert cluster3.terminate(follower) == 0  # SIGTERM: a clean exit, the pid file removed
    assert not (cluster3.data_dir / follower / "node.pid").exists()


def test_effects_replayed_after_a_restart_are_not_resent_and_messages_return(
    cluster3: LocalCluster,
) -> None:
    """A consumer's node crashes: replayed deliveries go nowhere, its messages come back once."""
    leader = cluster3.leader()
    owner = others(leader)[0]
    consumer_client = cluster3.client(owner)
    consumer_client.command(DeclareQueue("replay"))
    for i in range(3):
        consumer_client.command(Enqueue("replay", b"m%d" % i))
    reply = consumer_client.command(
        Checkout("replay", ConsumerId("c", consumer_client.connection), SimplePrefetch(10))
    )
    assert isinstance(reply, CheckoutOk)
    first = [e for e in consumer_client.read_effects(1) if isinstance(e, Deliver)]
    assert sum(len(d.messages) for d in first) == 3
    old_number = consumer_client.connection.number
    cluster3.kill(owner)
    consumer_client.close()
    cluster3.start_node(owner)
    cluster3.converged()
    # connection numbers restart at 1: open connections until the old number is reused
    clients = []
    while True:
        fresh = cluster3.client(owner)
        clients.append(fresh)
        if fresh.connection.number >= old_number:
            break
    reused = clients[-1]
    assert reused.connection.number == old_number
    assert reused.read_effects(1, timeout_s=1.0) == []  # nothing replayed to the new connection
    reply = reused.command(
        Checkout("replay", ConsumerId("c2", reused.connection), SimplePrefetch(10))
    )
    assert isinstance(reply, CheckoutOk)
    again = [e for e in reused.read_effects(1) if isinstance(e, Deliver)]
    bodies = sorted(m.body for d in again for m in d.messages)
    assert bodies == [b"m0", b"m1", b"m2"]
    assert all(m.redelivered for d in again for m in d.messages)
    for c in clients:
        c.close()
