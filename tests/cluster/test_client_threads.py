"""The threaded client's I/O: the thread that waits for an answer reads it from the socket itself.

A publish and its confirm cross only the caller's thread on the client (docs/architecture.md);
the reader thread reads only while no caller waits. Each test runs real node processes; the
thread that processed a confirm is recorded around `ClientProtocol._confirm`, which still runs
unchanged (every confirm passes there, the `Ok` fast path and the general one alike).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cluster.client import ClientClosed, ClientProtocol
from cluster.launcher import LocalCluster
from fifo.commands import QueueConfig
from tests.must import must

pytestmark = pytest.mark.cluster


@pytest.fixture
def confirm_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, float]]]:
    """(thread ident, monotonic time) of every publish answer processed, in order."""
    seen: list[tuple[int, float]] = []
    original: Callable[..., None] = ClientProtocol._confirm

    def recording(self: ClientProtocol, *args: Any) -> None:
        seen.append((threading.get_ident(), time.monotonic()))
        original(self, *args)

    monkeypatch.setattr(ClientProtocol, "_confirm", recording)
    yield seen


def test_client_publish_processes_every_confirm_on_the_calling_thread(
    shared_cluster3: LocalCluster, confirm_threads: list[tuple[int, float]]
) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("threads-publish")
        for number in range(50):
            client.publish("threads-publish", b"p%d" % number)
        assert must(client.overview("threads-publish")).total == 50
    assert len(confirm_threads) == 50
    assert {ident for ident, _ in confirm_threads} == {threading.get_ident()}


def test_a_full_window_is_refilled_by_confirms_read_on_the_publishing_thread(
    shared_cluster3: LocalCluster, confirm_threads: list[tuple[int, float]]
) -> None:
    """While `publish_many` runs, no other thread reads the socket: every confirm that frees
    room in the window (all but the last window's worth) is processed by the publishing
    thread. (The last ones may come while the test is between its two calls.)"""
    with shared_cluster3.client() as client:
        client.declare_queue("threads-window")
        publisher = client.publisher("threads-window", window=20)
        publisher.publish_many(b"w%d" % number for number in range(500))
        publisher.wait_for_confirms()
        publisher.close()
    assert len(confirm_threads) == 500
    by_caller = [ident for ident, _ in confirm_threads if ident == threading.get_ident()]
    assert len(by_caller) >= 480


def test_publishing_threads_and_a_consumer_share_one_connection(
    shared_cluster3: LocalCluster,
) -> None:
    """Two threads publish and wait while a third consumes: whoever reads hands the others
    their answers and deliveries."""
    with shared_cluster3.client() as client:
        client.declare_queue("threads-shared")
        consumer = client.consume("threads-shared", prefetch=50)
        errors: list[BaseException] = []

        def produce(prefix: bytes) -> None:
            try:
                with client.publisher("threads-shared", window=10) as publisher:
                    publisher.publish_many(prefix + b"%d" % number for number in range(300))
            except BaseException as err:  # reported by the main thread
                errors.append(err)

        producers = [threading.Thread(target=produce, args=(p,)) for p in (b"a", b"b")]
        for producer in producers:
            producer.start()
        got: list[bytes] = []
        while len(got) < 600:
            message = consumer.get(timeout_s=20.0)
            assert message is not None, f"only {len(got)} of 600 messages arrived"
            got.append(message.body)
            message.ack()
        for producer in producers:
            producer.join(20.0)
        assert errors == []
        assert sorted(got) == sorted(p + b"%d" % n for p in (b"a", b"b") for n in range(300))
        consumer.cancel()
        assert consumer.wait_settled()


def test_close_from_another_thread_ends_a_caller_that_is_reading(
    shared_cluster3: LocalCluster,
) -> None:
    """A publisher waiting for room (it reads the socket meanwhile) gets ClientClosed at once."""
    client = shared_cluster3.client()
    outcome: list[BaseException] = []
    waiting = threading.Event()

    def publish_blocked() -> None:
        waiting.set()
        try:
            for number in range(10):  # the queue blocks the publisher: it waits for room
                publisher.publish(b"b%d" % number, timeout_s=60.0)
        except BaseException as err:
            outcome.append(err)

    caller = threading.Thread(target=publish_blocked, name="publish-blocked")
    try:
        client.declare_queue("threads-close", QueueConfig(max_length=1, overflow="reject_publish"))
        publisher = client.publisher("threads-close", window=1)
        caller.start()
        waiting.wait(10.0)
        deadline = time.monotonic() + 10.0
        while not publisher.blocked and time.monotonic() < deadline:
            time.sleep(0.02)
        assert publisher.blocked
        client.close()
        caller.join(10.0)
        assert not caller.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], ClientClosed)
    finally:  # a failed assertion must not leave the caller blocked for 10 x 60 s
        client.close()
        if caller.ident is not None:
            caller.join(10.0)
