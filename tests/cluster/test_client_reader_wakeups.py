"""The threaded client's reader thread is not woken for nothing (issue 29): between each
publish and its confirm, which the caller reads itself, the reader thread was woken only to go
back to sleep (a third of the publishing thread's CPU). It is woken when deliveries may come (a
consumer is attached); confirms are read by the callers that wait for them."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cluster.client.sansio import SCAN_S
from cluster.launcher import LocalCluster

pytestmark = pytest.mark.cluster


def counting_reader_wakes(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the notifications of `client`'s parked reader thread."""
    wakes = [0]
    condition = client._reader_wake
    notify_all = condition.notify_all

    def counted() -> None:
        wakes[0] += 1
        notify_all()

    monkeypatch.setattr(condition, "notify_all", counted)
    return wakes


def test_one_at_a_time_publishes_do_not_wake_the_reader_thread(
    shared_cluster3: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("reader-wakes")
        wakes = counting_reader_wakes(client, monkeypatch)
        with client.publisher("reader-wakes", window=1) as publisher:
            for number in range(200):
                publisher.publish(b"m%d" % number)
                publisher.wait_for_confirms(timeout_s=30.0)
        assert wakes[0] <= 2, wakes[0]


def test_the_reader_thread_is_woken_for_a_consumer_once_its_caller_stops_reading(
    shared_cluster3: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer attached: after a caller's wait, the reader takes the socket at once (its
    deliveries must not wait for the end of the reader's parked wait)."""
    with shared_cluster3.client() as client:
        client.declare_queue("reader-wakes-consumer")
        consumer = client.consume("reader-wakes-consumer", prefetch=10)
        wakes = counting_reader_wakes(client, monkeypatch)
        for number in range(20):
            client.publish("reader-wakes-consumer", b"c%d" % number)
        assert wakes[0] >= 10, wakes[0]
        got = 0
        while got < 20 and (message := consumer.get(timeout_s=10.0)) is not None:
            message.ack()
            got += 1
        assert got == 20


def test_an_idle_client_s_ticker_wakes_twice_a_second(
    shared_cluster3: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer attached and nothing to do: the ticker's work (deadlines, the silence check)
    waits SCAN_S, not TICK_S (it woke 20 times a second, 0.002 cores per idle client)."""
    with shared_cluster3.client() as client:
        client.declare_queue("ticker-idle")
        client.consume("ticker-idle", prefetch=10)
        ticks = [0]
        tick = client.core.tick

        def counted(now: float) -> Any:
            ticks[0] += 1
            return tick(now)

        monkeypatch.setattr(client.core, "tick", counted)
        time.sleep(2.0)
        assert 2 <= ticks[0] <= 2.0 / SCAN_S + 2, ticks[0]
