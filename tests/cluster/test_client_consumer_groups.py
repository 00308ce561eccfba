"""The consumer-group client (machine v3) on a real 3-node cluster: handler and hooks, hand-over,
routing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from cluster.client import Client
from cluster.client.consumer import Message
from cluster.client.groups import declare_partitioned_queue, join_group, partition_of
from cluster.launcher import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(cluster3: LocalCluster) -> Iterator[Client]:
    with Client.from_data_dir(cluster3.data_dir, name="groups-test") as opened:
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
    client: Client, cluster3: LocalCluster
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
    with Client.from_data_dir(cluster3.data_dir, name="second") as other:
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
