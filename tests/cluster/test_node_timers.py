"""Leader timers: consumer timeouts are submitted only when a lock expired."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from cluster.launcher import LocalCluster, wait_until
from cluster.rawclient import RawClient
from fifo.commands import Checkout, ConsumerId, DeclareQueue, Enqueue, Settle, SimplePrefetch
from fifo.effects import Deliver, Released
from fifo.replies import CheckoutOk, Ok

pytestmark = pytest.mark.cluster

LOCK_MS = 1500  # room for a delivery held a while (issue 24) before it is settled
CLOCK_SLACK_S = 0.05  # log timestamps and this process read the same clock, rounded


def timer_commands(cluster: LocalCluster, node_id: str, name: str) -> int:
    """How many timer commands called `name` the node submitted (from its node.log)."""
    return len(timer_times(cluster, node_id, name))


def timer_times(cluster: LocalCluster, node_id: str, name: str) -> list[float]:
    """When (epoch seconds) the node submitted each timer command called `name`."""
    times: list[float] = []
    for line in (cluster.data_dir / node_id / "node.log").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "timer_command" and event.get("command") == name:
            stamp = str(event["timestamp"]).replace("Z", "+00:00")
            times.append(datetime.fromisoformat(stamp).timestamp())
    return times


def await_deliveries(client: RawClient) -> None:
    """Wait until the node delivers at once: a node holds deliveries until its state is current
    (after an election, a majority answering steadily for a second: issue 24), and a lock's
    clock runs from the checkout, so the timings below hold only from then on."""
    client.command(DeclareQueue("warm-up"))
    client.command(Checkout("warm-up", ConsumerId("w", client.connection), SimplePrefetch(1)))
    client.command(Enqueue("warm-up", b"x"))
    wait_until(
        lambda: any(isinstance(e, Deliver) for e in client.read_effects(1, 0.2)), 10, "delivery"
    )
    client.effects.clear()  # the test below counts its own effects from the first


def test_consumer_timeouts_are_submitted_only_when_a_lock_expired(cluster3: LocalCluster) -> None:
    """A settled delivery causes no EvalConsumerTimeouts; an unsettled one does, once expired,
    and never before its lock could have expired (read from the leader's log: a delivery the
    node held a while, or a slow client, must not make the test read too late)."""
    leader = cluster3.leader()
    client = cluster3.raw_client(leader)
    wait_until(lambda: client.query("machine")["effective_version"] >= 2, 10, "machine v2")
    await_deliveries(client)
    client.command(DeclareQueue("locks"))
    consumer = ConsumerId("c", client.connection)
    reply = client.command(Checkout("locks", consumer, SimplePrefetch(5), timeout_ms=LOCK_MS))
    assert isinstance(reply, CheckoutOk)
    key = reply.consumer_key
    enqueued_at = time.time()
    client.command(Enqueue("locks", b"settled-in-time"))
    [delivery] = [e for e in client.read_effects(1) if isinstance(e, Deliver)]
    assert client.command(Settle("locks", key, (delivery.messages[0].msg_id,))) == Ok()
    settled_at = time.time()
    time.sleep(LOCK_MS / 1000 + 0.7)  # well past the lock's expiry had it not been settled
    # none, unless the lock expired before the settle came (a host too slow to answer within
    # LOCK_MS): then only before the settle, and only after the lock could expire
    for at in timer_times(cluster3, leader, "EvalConsumerTimeouts"):
        assert enqueued_at + LOCK_MS / 1000 - CLOCK_SLACK_S <= at < settled_at + CLOCK_SLACK_S

    before = len(timer_times(cluster3, leader, "EvalConsumerTimeouts"))
    enqueued_at = time.time()  # the lock of the next message starts after this
    client.command(Enqueue("locks", b"left-unsettled"))
    wait_until(lambda: len(client.read_effects(2, 0.2)) >= 2, 5, "the second delivery")
    released = wait_until(
        lambda: [e for e in client.read_effects(3, 0.2) if isinstance(e, Released)], 10, "Released"
    )
    assert released[0].reason == "timeout" and released[0].consumer_key == key
    submitted = timer_times(cluster3, leader, "EvalConsumerTimeouts")[before:]
    assert submitted and min(submitted) >= enqueued_at + LOCK_MS / 1000 - CLOCK_SLACK_S
    client.close()


def test_a_lost_peer_gets_one_node_down_and_one_node_up(cluster3: LocalCluster) -> None:
    """The leader commits NodeDown once for a killed follower and NodeUp once when it is back."""
    leader = cluster3.leader()
    follower = next(n for n in ("n1", "n2", "n3") if n != leader)
    cluster3.kill(follower)
    wait_until(lambda: timer_commands(cluster3, leader, "NodeDown") >= 1, 10, "NodeDown")
    time.sleep(3.0)  # longer than the resubmit interval: it must not be sent again
    assert timer_commands(cluster3, leader, "NodeDown") == 1
    cluster3.start_node(follower)
    wait_until(lambda: timer_commands(cluster3, leader, "NodeUp") >= 1, 15, "NodeUp")
    cluster3.converged()
    time.sleep(1.0)
    assert timer_commands(cluster3, leader, "NodeUp") == 1
    assert timer_commands(cluster3, leader, "NodeDown") == 1
