"""Single active consumer failover when the active consumer's node is killed, through aio-pika,
kombu/py-amqp and pika's SelectConnection (pika's BlockingConnection is test_failover.py): the
waiting consumer on another node gets every
message, the one the dead consumer held included. One cluster; each test kills a follower and
starts it again."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.launcher import start_cluster, wait_until
from tests.amqp.conftest import AmqpCluster, upgrade_to_latest
from tests.amqp.pika_select import SelectSession

aio_pika = pytest.importorskip("aio_pika")
kombu = pytest.importorskip("kombu")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

ARGUMENTS = {
    "x-queue-type": "quorum",
    "x-single-active-consumer": True,
    "x-quorumq-disconnected-timeout": 1000,  # the dead node's consumer loses m1 after 1 s
}
BODIES = (b"m1", b"m2")
SCENARIO_TIMEOUT_S = 90.0  # a hang fails the test with its stack, not pytest-timeout's


@pytest.fixture(scope="module")
def killable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpCluster]:
    """A cluster of its own: the tests kill (and restart) its followers."""
    cluster = start_cluster(tmp_path_factory.mktemp("amqp-kill-clients") / "D", nodes=3)
    try:
        upgrade_to_latest(cluster)
        yield AmqpCluster(cluster, cluster.key.decode("ascii"))
    finally:
        cluster.stop()


def _roles(killable: AmqpCluster) -> tuple[str, int, int]:
    """(the follower to kill, its node index, the leader's node index)."""
    cluster = killable.cluster
    leader = cluster.leader()
    ids = [node.id for node in cluster.config.nodes]
    victim = next(node_id for node_id in ids if node_id != leader)
    return victim, ids.index(victim), ids.index(leader)


def test_aio_pika_sac_fails_over_when_the_active_consumers_node_is_killed(
    killable: AmqpCluster,
) -> None:
    victim, doomed_at, survivor_at = _roles(killable)
    try:
        scenario = _aio_failover(killable, victim, doomed_at, survivor_at)
        got = asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_S))
    finally:
        killable.cluster.restart(victim)
    assert sorted(got) == list(BODIES)


async def _aio_failover(
    killable: AmqpCluster, victim: str, doomed_at: int, survivor_at: int
) -> list[bytes]:
    name = f"sac-aio-{uuid.uuid4().hex[:6]}"
    publisher = await aio_pika.connect(killable.url(survivor_at))
    channel = await publisher.channel(publisher_confirms=True)
    await channel.declare_queue(name, durable=True, arguments=ARGUMENTS)
    for body in BODIES:
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=name)
    doomed = await aio_pika.connect(killable.url(doomed_at))
    doomed_channel = await doomed.channel()
    await doomed_channel.set_qos(prefetch_count=1)
    held: asyncio.Queue[bytes] = asyncio.Queue()

    async def hold(message: Any) -> None:
        await held.put(message.body)  # never acked: the kill takes it back

    await (await doomed_channel.get_queue(name, ensure=False)).consume(hold)
    assert await asyncio.wait_for(held.get(), 10) == b"m1"
    got: list[bytes] = []

    async def take(message: Any) -> None:
        got.append(message.body)
        await message.ack()

    waiting = await aio_pika.connect(killable.url(survivor_at))
    waiting_channel = await waiting.channel()
    await (await waiting_channel.get_queue(name, ensure=False)).consume(take)
    await asyncio.sleep(0.5)
    assert got == []  # the dead-to-be consumer is the active one
    killable.cluster.kill(victim)
    for _ in range(300):
        if len(got) == len(BODIES):
            break
        await asyncio.sleep(0.1)
    for connection in (waiting, publisher, doomed):
        with contextlib.suppress(Exception):  # the doomed one's node is gone
            await asyncio.wait_for(connection.close(), 5)
    return got


def test_kombu_sac_fails_over_when_the_active_consumers_node_is_killed(
    killable: AmqpCluster,
) -> None:
    victim, doomed_at, survivor_at = _roles(killable)
    name = f"sac-kombu-{uuid.uuid4().hex[:6]}"
    queue = kombu.Queue(name, kombu.Exchange(""), routing_key=name, durable=True,
                        queue_arguments=ARGUMENTS)  # fmt: skip
    options = {"confirm_publish": True}
    try:
        with kombu.Connection(killable.url(survivor_at), transport_options=options) as survivor:
            producer = survivor.Producer()
            for body in BODIES:
                producer.publish(body, routing_key=name, declare=[queue])
            doomed = kombu.Connection(killable.url(doomed_at))
            held: list[bytes] = []
            doomed_consumer = doomed.Consumer(
                queue, callbacks=[lambda body, _message: held.append(body)], prefetch_count=1
            )
            doomed_consumer.consume()
            doomed.drain_events(timeout=10)
            assert held == [b"m1"]  # held, never acked: the kill takes it back
            got = _survive_the_kill(killable, victim, survivor, queue)
            with contextlib.suppress(Exception):  # its node is gone
                doomed.release()
    finally:
        killable.cluster.restart(victim)
    assert sorted(got) == list(BODIES)


def _survive_the_kill(killable: AmqpCluster, victim: str, survivor: Any, queue: Any) -> list[bytes]:
    """The waiting consumer on `survivor`: nothing before the kill, every message after it."""
    got: list[bytes] = []

    def take(body: bytes, message: Any) -> None:
        got.append(body)
        message.ack()

    with survivor.Consumer(queue, callbacks=[take], prefetch_count=1):
        with contextlib.suppress(TimeoutError, OSError):
            survivor.drain_events(timeout=0.5)
        assert got == []  # the dead-to-be consumer is the active one
        killable.cluster.kill(victim)

        def both() -> bool | None:
            with contextlib.suppress(TimeoutError, OSError):
                survivor.drain_events(timeout=0.2)
            return len(got) == len(BODIES) or None

        wait_until(both, 30, "the waiting consumer to get m1 and m2")
    return got


def test_pika_select_sac_fails_over_when_the_active_consumers_node_is_killed(
    killable: AmqpCluster,
) -> None:
    """SelectConnection: the active consumer (prefetch 1, holding m1) is on the killed node;
    the waiting one on the leader's node then gets m1 and m2."""
    victim, doomed_at, survivor_at = _roles(killable)
    name = f"sac-select-{uuid.uuid4().hex[:6]}"
    publisher = SelectSession(killable.params(survivor_at))
    doomed = SelectSession(killable.params(doomed_at), confirms_on=False)
    waiting = SelectSession(killable.params(survivor_at), confirms_on=False)
    try:
        publisher.call(publisher.channel.queue_declare, name, durable=True, arguments=ARGUMENTS)
        assert [publisher.publish("", name, body) for body in BODIES] == ["ack", "ack"]
        doomed.call(doomed.channel.basic_qos, prefetch_count=1)
        doomed.consume(name)
        assert [d.body for d in doomed.wait_for_deliveries(1)] == [b"m1"]  # held, never acked
        waiting.consume(name, auto_ack=True)
        with pytest.raises(AssertionError, match="1 deliveries"):
            waiting.run_until(lambda: waiting.deliveries, "1 deliveries", timeout_s=0.5)
        killable.cluster.kill(victim)
        got = waiting.wait_for_deliveries(len(BODIES))
    finally:
        killable.cluster.restart(victim)
        for session in (waiting, publisher):
            session.close()
    assert sorted(d.body for d in got) == list(BODIES)
