"""The consumer-group client (machine v3) on a real 3-node cluster: handler and hooks, hand-over,
routing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fifo
from cluster.client import Client
from cluster.client.aio_groups import AsyncHook
from cluster.client.consumer import Message
from cluster.client.groups import declare_partitioned_queue, join_group, partition_of
from cluster.launcher import LocalCluster
from fifo.commands import AnnotatedEnqueue, DeclarePartitionedQueue, QueueConfig
from fifo.meta import Meta
from tests.cluster.kill_midway import kill_when_confirmed

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(reused_cluster3: LocalCluster) -> Iterator[Client]:
    with Client.from_data_dir(reused_cluster3.data_dir, name="groups-test") as opened:
        deadline = time.monotonic() + 30  # a new cluster upgrades to machine v3 by itself
        while int(str(opened.machine()["effective_version"])) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield opened


def wait_for(predicate: object, timeout_s: float = 15.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_handler_member_gets_every_partition_then_shares_them_with_a_second(
    client: Client, reused_cluster3: LocalCluster
) -> None:
    """One member (handler thread) is assigned both partitions; a second joins: one partition
    is revoked from the first (hook) and assigned to the second; messages routed by key
    (CRC-32) arrive at whoever owns their partition, each exactly once."""
    declare_partitioned_queue(client, "jobs", 2)
    got: list[tuple[str, Message]] = []
    lock = threading.Lock()
    events: list[tuple[str, str, list[str]]] = []

    def handler(name: str) -> object:
        def handle(message: Message) -> None:
            with lock:
                got.append((name, message))
            message.ack()

        return handle

    first = join_group(
        client, "workers", "jobs", member="first", handler=handler("first"),  # type: ignore[arg-type]
        on_assign=lambda p: events.append(("first", "assigned", p)),
        on_revoke=lambda p: events.append(("first", "revoked", p)),
    )  # fmt: skip
    wait_for(lambda: ("first", "assigned", ["jobs.0", "jobs.1"]) in events)
    with Client.from_data_dir(reused_cluster3.data_dir, name="second") as other:
        second = join_group(other, "workers", "jobs", member="second",
                            handler=handler("second"))  # type: ignore[arg-type]  # fmt: skip
        wait_for(lambda: ("first", "revoked", ["jobs.1"]) in events)
        wait_for(lambda: second.assigned == ["jobs.1"])
        keys = [f"customer-{i}".encode() for i in range(20)]
        for key in keys:
            client.publish(f"jobs.{partition_of(key, 2)}", key)
        wait_for(lambda: len(got) == len(keys))
        owner = {"jobs.0": "first", "jobs.1": "second"}
        assert all(owner[message.queue] == name for name, message in got)
        assert sorted(message.body for _, message in got) == sorted(keys)
        assert {message.queue for _, message in got} == {"jobs.0", "jobs.1"}
        second.leave()
    wait_for(lambda: first.assigned == ["jobs.0", "jobs.1"])
    first.leave()


@given(st.text(max_size=30) | st.integers(-(10**9), 10**9), st.integers(1, 16))
def test_partition_of_agrees_with_the_machine_routing(key: str | int, partitions: int) -> None:
    """A publish to the base name with group `key` lands where `partition_of(key)` says (str,
    int and UTF-8 bytes of the same key agree), as the machine routes it."""
    state = fifo.init_state(3)
    fifo.apply(Meta(1, 1, 1, 3), DeclarePartitionedQueue("q", QueueConfig(True), partitions), state)
    fifo.apply(Meta(2, 1, 1, 3), AnnotatedEnqueue("q", b"x", annotations=(("x-group-id", key),)),
               state)  # fmt: skip
    landed = [i for i in range(partitions) if state.queues[f"q.{i}"].messages_total]
    assert landed == [partition_of(key, partitions)]
    assert partition_of(str(key).encode("utf-8", "surrogatepass"), partitions) == landed[0]


def test_publishes_to_the_base_name_are_routed_by_group_and_round_robin(
    client: Client, reused_cluster3: LocalCluster
) -> None:
    """On a real cluster: messages published to the base name with a group go to
    partition_of(group); without one they spread round robin; a member of the group gets all."""
    declare_partitioned_queue(client, "routed", 3)
    got: list[Message] = []
    lock = threading.Lock()

    def handle(message: Message) -> None:
        with lock:
            got.append(message)
        message.ack()

    member = join_group(client, "readers", "routed", member="only", handler=handle)
    keys = [f"customer-{i}" for i in range(12)]
    with client.publisher("routed", window=50) as publisher:
        for key in keys:
            publisher.publish(key.encode(), group=key)
        publisher.publish_many([b"plain-%d" % i for i in range(6)])
    wait_for(lambda: len(got) == len(keys) + 6)
    for message in got:
        if message.body.startswith(b"customer-"):
            assert message.queue == f"routed.{partition_of(message.body, 3)}"
    plain = sorted(message.queue for message in got if message.body.startswith(b"plain-"))
    assert plain == ["routed.0", "routed.0", "routed.1", "routed.1", "routed.2", "routed.2"]
    member.leave()


def test_asyncio_members_iterate_and_handle_with_hooks_across_a_rebalance(
    client: Client, reused_cluster3: LocalCluster
) -> None:
    """asyncio: one member iterates (`async for`) and is assigned all 4 partitions; a second
    joins with a coroutine handler and takes 2 of them (the first's on_revoke hook says which);
    every message published to the base name arrives once, at the owner of its partition."""
    import asyncio

    from cluster.client import AsyncClient

    async def scenario() -> None:
        data_dir = reused_cluster3.data_dir
        async with AsyncClient.from_data_dir(data_dir, name="aio-a") as first_client, \
                AsyncClient.from_data_dir(data_dir, name="aio-b") as second_client:  # fmt: skip
            await first_client.declare_partitioned_queue("aio-jobs", 4)
            events: list[tuple[str, str, tuple[str, ...]]] = []
            got: list[tuple[str, str, bytes]] = []

            def hook(member: str, kind: str) -> AsyncHook:
                async def record(partitions: list[str]) -> None:
                    events.append((member, kind, tuple(partitions)))

                return record

            first = await first_client.join_group(
                "aio-workers", "aio-jobs", member="first", on_assign=hook("first", "assigned"),
                on_revoke=hook("first", "revoked"),
            )  # fmt: skip

            async def iterate() -> None:
                async for message in first:
                    got.append(("first", message.queue, message.body))
                    await message.ack()

            iterating = asyncio.ensure_future(iterate())
            parts = ("aio-jobs.0", "aio-jobs.1", "aio-jobs.2", "aio-jobs.3")
            while ("first", "assigned", parts) not in events:
                await asyncio.sleep(0.05)

            async def handle(message: object) -> None:
                assert hasattr(message, "ack")
                got.append(("second", message.queue, message.body))  # type: ignore[attr-defined]
                await message.ack()

            second = await second_client.join_group(
                "aio-workers", "aio-jobs", member="second", handler=handle,
                on_assign=hook("second", "assigned"),
            )  # fmt: skip
            while len(second.assigned) != 2 or not any(
                    e[:2] == ("first", "revoked") for e in events):  # fmt: skip
                await asyncio.sleep(0.05)
            revoked = next(e[2] for e in events if e[:2] == ("first", "revoked"))
            assert sorted(revoked) == second.assigned
            owner = {p: "second" if p in revoked else "first" for p in parts}
            async with first_client.publisher("aio-jobs", window=50) as publisher:
                for i in range(40):
                    await publisher.publish(b"k%d" % i, group=f"k{i}")
                await publisher.wait_for_confirms(10.0)
            while len(got) < 40:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            assert len(got) == 40 and sorted(b for _, _, b in got) == sorted(
                b"k%d" % i for i in range(40))  # fmt: skip
            for name, queue, body in got:
                assert queue == f"aio-jobs.{partition_of(body.decode(), 4)}"
                assert owner[queue] == name
            await second.leave()
            assert second.task is None
            while first.assigned != list(parts):
                await asyncio.sleep(0.05)
            await first.leave()
            await asyncio.wait_for(iterating, 5.0)  # the iterator ends once left

    asyncio.run(asyncio.wait_for(scenario(), 60.0))


def test_a_leader_kill_mid_stream_to_the_base_name_stores_each_message_once(
    reused_cluster3: LocalCluster,
) -> None:
    """Publishing keyless messages to a partitioned queue's name through a leader kill: the
    resends after the reconnect are deduplicated over the whole partitioned queue (round robin
    would have put them on another partition), so the partitions hold exactly what was
    confirmed, spread evenly."""
    leader = reused_cluster3.leader()
    total, partitions = 1500, 3
    with Client(list(reused_cluster3.config.endpoints().values()), reused_cluster3.key, name="rr",
                reconnect_timeout_s=20.0) as client:  # fmt: skip
        deadline = time.monotonic() + 30
        while int(str(client.machine()["effective_version"])) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        declare_partitioned_queue(client, "rr", partitions)
        publisher = client.publisher("rr", window=200)
        with kill_when_confirmed(reused_cluster3, leader, publisher, total // 3) as killed:
            publisher.publish_many((b"m-%05d" % i for i in range(total)), timeout_s=30.0)
            publisher.wait_for_confirms(timeout_s=30.0)
            assert killed.wait(10.0)
        assert publisher.confirmed == total
        assert client.reconnects >= 1, "the client was on the killed leader and must reconnect"
        totals = []
        for index in range(partitions):
            overview = client.overview(f"rr.{index}")
            totals.append(overview.total if overview is not None else -1)
    assert sum(totals) == total, totals
    assert max(totals) - min(totals) <= 1, totals


def test_deleting_the_partitioned_queue_ends_its_members_iteration(
    client: Client, reused_cluster3: LocalCluster
) -> None:
    """`queue delete` of the partitioned queue cancels every partition's consumer: a threaded
    and an asyncio member stop iterating (get answers None, closed) instead of waiting forever."""
    import asyncio

    from cluster.client import AsyncClient

    declare_partitioned_queue(client, "doomed", 2)
    client.publish("doomed", b"one")
    member = join_group(client, "doomers", "doomed", member="t")
    first = member.get(timeout_s=15.0)
    assert first is not None and first.body == b"one"  # held, not acked: deleted with the rest

    async def scenario() -> None:
        async with AsyncClient.from_data_dir(reused_cluster3.data_dir, name="aio-doomed") as aio:
            await aio.declare_partitioned_queue("doomed-aio", 2)
            aio_member = await aio.join_group("doomers-aio", "doomed-aio", member="a")
            while len(aio_member.assigned) != 2:
                await asyncio.sleep(0.05)
            await aio.delete_queue("doomed-aio")
            assert [m async for m in aio_member] == []
            assert aio_member.closed

    asyncio.run(asyncio.wait_for(scenario(), 30.0))
    deleted = client.delete_queue("doomed")
    assert deleted.messages == 1
    assert member.get(timeout_s=15.0) is None
    assert member.closed and member.assigned == []
