"""`consumer.process` on a real 3-node cluster: per-key order with N workers, real parallelism,
failed handlers dead-lettered while their key goes on, and stopping loses nothing.

Keys come from the body (`key:number`): machine v3's message groups are not on this branch, so
the `key=` callable stands in for the default (the message's group).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from cluster.client import AsyncClient, AsyncMessage, Client, Message
from fifo.commands import QueueConfig

pytestmark = pytest.mark.cluster


def address(cluster: Any) -> tuple[list[str], bytes]:
    """The client endpoints and key of the `reused_cluster3` fixture's cluster (it names the key
    `client_key`; the launcher's LocalCluster, which it is being merged into, names it `key`)."""
    key = cluster.client_key if hasattr(cluster, "client_key") else cluster.key
    return [node.client_address for node in cluster.config.nodes], key


def connect(cluster: Any) -> Client:
    endpoints, key = address(cluster)
    return Client(endpoints, key)


def bodies(keys: int, count: int) -> list[bytes]:
    """`count` messages over `keys` keys, interleaved: b"k3:17" is the 17th message, key k3."""
    return [b"k%d:%d" % (number % keys, number) for number in range(count)]


def key_of(message: Message | AsyncMessage) -> bytes:
    return message.body.split(b":")[0]


def number_of(message: Message | AsyncMessage) -> int:
    return int(message.body.split(b":")[1])


class Seen:
    """Per key, the numbers handled in order; the most handlers of one key, and of all, at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[bytes, int] = defaultdict(int)
        self.order: dict[bytes, list[int]] = defaultdict(list)
        self.most_per_key = 0
        self.most = 0
        self.sequence: list[int] = []  # every number handled, in the order handling began

    def begin(self, message: Message | AsyncMessage) -> None:
        with self.lock:
            key = key_of(message)
            self.running[key] += 1
            self.most_per_key = max(self.most_per_key, self.running[key])
            self.most = max(self.most, sum(self.running.values()))
            self.order[key].append(number_of(message))
            self.sequence.append(number_of(message))

    def end(self, message: Message | AsyncMessage) -> None:
        with self.lock:
            self.running[key_of(message)] -= 1

    def total(self) -> int:
        with self.lock:
            return sum(map(len, self.order.values()))


def in_publish_order(sent: list[bytes]) -> dict[bytes, list[int]]:
    order: dict[bytes, list[int]] = defaultdict(list)
    for body in sent:
        key, number = body.split(b":")
        order[key].append(int(number))
    return order


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def publish(client: Client, queue: str, sent: list[bytes]) -> None:
    with client.publisher(queue, window=200) as publisher:
        publisher.publish_many(sent)
        publisher.wait_for_confirms(30)


def test_process_keeps_key_order_on_8_threads_and_dead_letters_failures(
    reused_cluster3: Any,
) -> None:
    """600 messages over 30 keys on 8 workers: each key in publish order, never two of a key at
    once, several keys at once; a handler (or key function) that raises dead-letters its
    message and its key goes on; draining acks everything."""
    sent = bodies(keys=30, count=600)
    failing = {number for number in range(600) if number % 97 == 5}
    unkeyable = 300  # the key function raises for this one: it never reaches a handler
    seen = Seen()

    def handle(message: Message) -> None:
        seen.begin(message)
        try:
            time.sleep(0.004)
            if number_of(message) in failing:
                raise RuntimeError("handler failed")
        finally:
            seen.end(message)

    def key(message: Message) -> bytes:
        if number_of(message) == unkeyable:
            raise ValueError("no key")
        return key_of(message)

    with connect(reused_cluster3) as client:
        client.declare_queue("jobs-dlx")
        client.declare_queue("jobs", QueueConfig(dead_letter_queue="jobs-dlx"))
        publish(client, "jobs", sent)
        consumer = client.consume("jobs", prefetch=64)
        processing = consumer.process(handle, workers=8, key=key, on_error="dead_letter")
        assert wait_for(lambda: processing.processed == len(sent) - 1), processing.processed
        assert processing.stop(drain=True, timeout_s=30)
        assert processing.failed == len(failing)
        expected = [body for number, body in enumerate(sent) if number != unkeyable]
        assert seen.order == in_publish_order(expected)  # every key in order, failures included
        assert seen.most_per_key == 1
        assert seen.most >= 4, f"at most {seen.most} handlers ran at once"
        dead_numbers = sorted(failing | {unkeyable})
        jobs, dead = client.overview("jobs"), client.overview("jobs-dlx")
        assert jobs is not None and dead is not None
        assert (jobs.total, dead.total) == (0, len(dead_numbers))
        dead_bodies = [message.body for message in take_all(client, "jobs-dlx", len(dead_numbers))]
        assert sorted(dead_bodies) == sorted(sent[number] for number in dead_numbers)


def take_all(client: Client, queue: str, count: int) -> list[Message]:
    consumer = client.consume(queue, prefetch=count + 1)
    got = [consumer.get(timeout_s=10) for _ in range(count)]
    messages = [message for message in got if message is not None]
    consumer.ack(messages)
    consumer.cancel()
    return messages


def test_stopping_without_drain_gives_back_what_did_not_run_in_order(
    reused_cluster3: Any,
) -> None:
    """stop(drain=False) mid-way: the running handlers finish and are acked, everything else
    goes back to the queue; a fresh consumer then finds exactly the rest, each key still in
    publish order after what was processed."""
    sent = bodies(keys=10, count=300)
    seen = Seen()

    def handle(message: Message) -> None:
        seen.begin(message)
        time.sleep(0.01)
        seen.end(message)

    with connect(reused_cluster3) as client:
        client.declare_queue("stops")
        publish(client, "stops", sent)
        consumer = client.consume("stops", prefetch=40)
        processing = consumer.process(handle, workers=4, key=key_of, backlog=3)
        assert wait_for(lambda: seen.total() >= 40)
        assert processing.stop(drain=False, timeout_s=30)
        handled = seen.total()
        assert processing.processed == handled < len(sent)
        overview = client.overview("stops")
        assert overview is not None and overview.checked_out == 0
        assert overview.total == len(sent) - handled
        rest = take_all(client, "stops", len(sent) - handled)
        assert len(rest) == len(sent) - handled
        after = {key: list(numbers) for key, numbers in seen.order.items()}
        for message in rest:
            after.setdefault(key_of(message), []).append(number_of(message))
        assert after == in_publish_order(sent)  # nothing lost, nothing twice, still in order


def test_a_full_key_backlog_stops_deliveries_at_the_prefetch(reused_cluster3: Any) -> None:
    """One key blocked in its handler, backlog 2, prefetch 30: the pool holds the running
    message and two waiting, the feeder stops, and the queue stops delivering at 30 unacked
    messages (the rest stay ready in the queue); released, everything runs in order."""
    release = threading.Event()
    seen = Seen()

    def handle(message: Message) -> None:
        seen.begin(message)
        release.wait(30)
        seen.end(message)

    sent = [b"hot:%d" % number for number in range(100)]
    with connect(reused_cluster3) as client, contextlib.ExitStack() as cleanup:
        cleanup.callback(release.set)  # a failed assertion must not leave the handler blocked
        client.declare_queue("hot")
        publish(client, "hot", sent)
        consumer = client.consume("hot", prefetch=30)
        processing = consumer.process(handle, workers=4, key=key_of, backlog=2)
        assert wait_for(lambda: processing.waiting() == 2 and processing.running() == 1)

        def checked_out() -> int:
            overview = client.overview("hot")
            assert overview is not None
            return overview.checked_out

        assert wait_for(lambda: checked_out() == 30)
        time.sleep(0.5)  # give a broken pool the time to take more
        overview = client.overview("hot")
        assert overview is not None
        assert (overview.checked_out, overview.ready) == (30, 70)  # credit spent: no more
        assert (processing.running(), processing.waiting()) == (1, 2)  # the rest is not taken
        assert seen.total() == 1
        release.set()
        assert wait_for(lambda: processing.processed == 100)
        assert processing.stop(drain=True, timeout_s=30)
    assert seen.order == in_publish_order(sent) and seen.most == 1


def test_asyncio_process_keeps_key_order_with_parallel_tasks(reused_cluster3: Any) -> None:
    """The asyncio consumer: 400 messages over 20 keys on 8 tasks, in order per key, several
    keys at once, all acked; with the default key (no group on this queue) the messages form
    one key and run one at a time."""
    sent = bodies(keys=20, count=400)
    seen, serial = Seen(), Seen()

    async def handle(message: AsyncMessage) -> None:
        seen.begin(message)
        await asyncio.sleep(0.004)
        seen.end(message)

    async def handle_serially(message: AsyncMessage) -> None:
        serial.begin(message)
        await asyncio.sleep(0.001)
        serial.end(message)

    async def main() -> None:
        endpoints, key = address(reused_cluster3)
        async with AsyncClient(endpoints, key) as client:
            await client.declare_queue("tasks")
            await client.declare_queue("ungrouped")
            async with client.publisher("tasks", window=200) as publisher:
                await publisher.publish_many(sent)
                await publisher.wait_for_confirms(30)
            async with client.publisher("ungrouped", window=200) as publisher:
                await publisher.publish_many(sent[:60])
                await publisher.wait_for_confirms(30)
            consumer = client.consume("tasks", prefetch=64)
            processing = await consumer.process(handle, workers=8, key=key_of)
            other = client.consume("ungrouped", prefetch=64)
            default_keyed = await other.process(handle_serially, workers=8)
            deadline = time.monotonic() + 60
            while (processing.processed, default_keyed.processed) != (400, 60):
                assert time.monotonic() < deadline, (processing.processed, serial.total())
                await asyncio.sleep(0.05)
            assert await processing.stop(drain=True, timeout_s=30)
            assert await default_keyed.stop(drain=True, timeout_s=30)
            for queue in ("tasks", "ungrouped"):
                overview = await client.overview(queue)
                assert overview is not None and overview.total == 0

    asyncio.run(main())
    assert seen.order == in_publish_order(sent)
    assert seen.most_per_key == 1 and seen.most >= 4, seen.most
    assert serial.most == 1 and serial.sequence == list(range(60))  # group None: one key


def test_asyncio_stop_without_drain_returns_the_rest(reused_cluster3: Any) -> None:
    """The asyncio consumer stopped mid-way: what ran is acked, everything else is back in the
    queue, nothing is checked out."""
    sent = bodies(keys=10, count=200)
    seen = Seen()

    async def handle(message: AsyncMessage) -> None:
        seen.begin(message)
        await asyncio.sleep(0.01)
        seen.end(message)

    async def main() -> tuple[int, int, int]:
        endpoints, key = address(reused_cluster3)
        async with AsyncClient(endpoints, key) as client:
            await client.declare_queue("halts")
            async with client.publisher("halts", window=200) as publisher:
                await publisher.publish_many(sent)
                await publisher.wait_for_confirms(30)
            consumer = client.consume("halts", prefetch=40)
            processing = await consumer.process(handle, workers=4, key=key_of, backlog=3)
            deadline = time.monotonic() + 60
            while seen.total() < 30:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert await processing.stop(drain=False, timeout_s=30)
            overview = await client.overview("halts")
            assert overview is not None
            return processing.processed, overview.total, overview.checked_out

    processed, left, checked_out = asyncio.run(main())
    assert processed == seen.total() < len(sent)
    assert (left, checked_out) == (len(sent) - processed, 0)
