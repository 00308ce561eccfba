"""A node killed, restarted and killed again at once (a flap): the consumer that attached
through it while it was back is suspected, like any consumer of a lost node.

`LocalCluster.restart` returns once the node answers, which can be before the leader has
committed NodeUp for it: the node is then still listed down when it is lost again, and the
leader timers must propose NodeDown again (the TimerPlan side is in test_timers_unit.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster, local_cluster, wait_until
from fifo.commands import QueueConfig
from tests.cluster.client_cluster import on_latest_machine

pytestmark = pytest.mark.cluster


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A fresh 3-node cluster on the latest machine (the test kills a node)."""
    with local_cluster(tmp_path / "D", 3) as running:
        yield on_latest_machine(running)


def test_a_consumer_attached_through_a_flapping_node_is_suspected(
    own_cluster: LocalCluster,
) -> None:
    cluster = own_cluster
    queue = "flap"
    leader = cluster.leader()
    victim = next(n for n in cluster.config.node_ids() if n != leader)
    with cluster.client(leader, only=True) as client:
        client.declare_queue(queue, QueueConfig(disconnected_timeout_ms=600_000))
        first = cluster.client(victim, only=True)
        first.consume(queue, prefetch=5)
        wait_until(lambda: len(client.consumers(queue)[queue]) == 1, 10, "the first consumer")
        cluster.kill(victim)  # lost: NodeDown, its consumer suspected
        wait_until(
            lambda: [c.status for c in client.consumers(queue)[queue]] == ["suspected_down"],
            15,
            "the first consumer suspected",
        )
        first.close()

        def checked_out() -> int:
            overview = client.overview(queue)
            assert overview is not None
            return overview.checked_out

        def all_suspected() -> bool:
            statuses = [c.status for c in client.consumers(queue)[queue]]
            return statuses.count("suspected_down") == len(statuses) >= 1

        for flap in range(1, 4):  # three flaps: the race with NodeUp is not won every time
            cluster.restart(victim)  # answers: NodeUp may not be committed yet
            again = cluster.client(victim, only=True)
            again.consume(queue, prefetch=5)
            client.publish(queue, f"flap-{flap}".encode())
            wait_until(lambda: checked_out() == flap, 10, f"{flap} checked out")  # noqa: B023 (called at once)
            cluster.kill(victim)  # lost again at once
            again.close()
            wait_until(all_suspected, 15, f"the consumer of flap {flap} suspected")
            assert checked_out() == flap, "suspected: its messages stay"
