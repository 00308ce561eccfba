"""Rolling machine upgrade v1 -> v2 under traffic, on real node processes.

Three nodes start capped at version 1 (emulating old code); a producer and a consumer run the
whole time; the nodes are restarted one at a time with version 2. The switch must happen only
after the last restart, nothing confirmed may be lost, a message is delivered twice only when
flagged redelivered, and every replica ends with the same digest at the same index.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.client import Client
from cluster.client.errors import ClusterError
from cluster.launcher import LocalCluster, local_cluster
from tests.background import Background

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]
QUEUE = "rolling"


def machine(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    """The `machine` query answered by one node."""
    with cluster.client(node_id, only=True, request_timeout_s=5.0) as client:
        return dict(client.machine())


def wait_until(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (ClusterError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


class Traffic(Background):
    """A producer (confirmed publishes) and a consumer (acks) on their own clients and threads,
    from the start of the `with` block; `finish` (or the end of the block, however the test
    ends) stops the producer and lets the consumer drain until the queue stays quiet. An
    exception that ends either loop is in `errors`."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__("upgrade-traffic")
        self.cluster = cluster
        self.confirmed: list[bytes] = []
        self.delivered: list[tuple[bytes, bool]] = []
        self.ids: list[tuple[int, int]] = []  # each delivery's (msg_id, connection number)

    def __enter__(self) -> Traffic:
        self.start(self._produce, "produce")
        self.start(self._consume, "consume")
        return self

    def _client(self, node_id: str) -> Client:
        return self.cluster.client(node_id, reconnect_timeout_s=30.0, request_timeout_s=30.0)

    def _produce(self) -> None:
        with self._client("n1") as client, client.publisher(QUEUE, window=50) as publisher:
            batch = 0
            while not self.stop.is_set():
                bodies = [b"m-%04d-%02d" % (batch, i) for i in range(20)]
                publisher.publish_many(bodies, timeout_s=30.0)
                publisher.wait_for_confirms(timeout_s=30.0)
                self.confirmed.extend(bodies)
                batch += 1
                time.sleep(0.05)

    def _consume(self) -> None:
        with self._client("n2") as client:
            consumer = client.consume(QUEUE, prefetch=20)
            quiet_since: float | None = None
            while True:
                message = consumer.get(timeout_s=0.5)
                if message is not None:
                    self.delivered.append((message.body, message.redelivered))
                    self.ids.append((message.msg_id, client.connection_id.number))
                    message.ack()
                    quiet_since = None
                    continue
                time.sleep(0.05)  # `get` answers None at once when the client gave up
                if not self.stop.is_set():
                    continue
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3.0:
                    break
            consumer.wait_settled()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path / "D", 3, max_machine_version=1) as running:
        yield running


def test_rolling_upgrade_under_traffic_switches_after_the_last_restart_and_loses_nothing(
    cluster: LocalCluster,
) -> None:
    assert machine(cluster, "n1")["effective_version"] == 1
    with cluster.client("n1") as client:
        client.declare_queue(QUEUE)
    with Traffic(cluster) as traffic:
        time.sleep(1.0)
        nodes = cluster.config.node_ids()
        for position, node_id in enumerate(nodes):
            commit_before = max(row.get("commit_index") or 0 for row in cluster.status())
            cluster.restart(node_id, max_machine_version=2)
            wait_until(
                lambda n=node_id: machine(cluster, n)["supported"].get(n) == 2, 20, "hello v2"
            )
            if position < len(nodes) - 1:
                time.sleep(1.0)  # the leader's timers had every chance to upgrade too early
                status = machine(cluster, node_id)
                assert status["effective_version"] == 1, f"switched too early: {status}"
                assert status["switches"] == []
        switched = wait_until(
            lambda: all(machine(cluster, n)["effective_version"] == 2 for n in nodes), 20, "v2"
        )
        assert switched
        switches = machine(cluster, "n1")["switches"]
        assert len(switches) == 1 and switches[0]["version"] == 2
        assert switches[0]["index"] > commit_before, "the switch predates the last restart"
        time.sleep(1.5)  # traffic runs on v2 for a while
    assert not traffic.errors, traffic.errors
    check_delivery(traffic)
    check_replicas(cluster)


def check_delivery(traffic: Traffic) -> None:
    """No confirmed message lost; a second delivery of a body is always flagged redelivered."""
    assert len(traffic.confirmed) > 100, "too little traffic to prove anything"
    delivered = Counter(body for body, _ in traffic.delivered)
    lost = set(traffic.confirmed) - set(delivered)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:3]}"
    seen: set[bytes] = set()
    for body, redelivered in traffic.delivered:
        assert body not in seen or redelivered, f"{body!r} delivered twice, not flagged"
        seen.add(body)


def check_replicas(cluster: LocalCluster) -> None:
    """Every node applied the same index with the same digest, on machine v2."""

    def same() -> list[dict[str, Any]] | None:
        rows = cluster.status()
        pairs = {(row.get("last_applied"), row.get("digest")) for row in rows}
        return rows if len(pairs) == 1 and None not in next(iter(pairs)) else None

    rows = wait_until(same, 20, "equal digests at the same applied index")
    assert {row["effective_machine_version"] for row in rows} == {2}
