"""Message groups in the client library (machine v3) against a real 3-node cluster, both shells:
`publish(group=)`, `Message.group`, `declare_queue(groups=)`, `groups()`, `purge_queue(group=)`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import fifo
from cluster.client import CommandRefused
from cluster.launcher import LocalCluster, local_cluster
from fifo.commands import GroupConfig
from tests.cluster.shells import Shells

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("client-groups") / "D", 3) as running:
        # a new cluster starts on v1 and switches once every node said hello: groups need v3
        deadline = time.monotonic() + 30
        with running.client() as client:
            while client.machine().get("effective_version") != fifo.LATEST_VERSION:
                assert time.monotonic() < deadline, "the cluster did not switch to v3"
                time.sleep(0.1)
        yield running


def test_grouped_publish_consume_list_and_purge(cluster: LocalCluster, shells: Shells) -> None:
    queue = f"groups-{shells.kind}"
    with shells.client(cluster, cluster.leader()) as client:
        client.declare_queue(queue, groups=GroupConfig(policy="sequenced"))
        assert not client.declare_queue(queue, groups=GroupConfig(policy="sequenced")).created
        with pytest.raises(CommandRefused, match="another config"):
            client.declare_queue(queue)  # the same name without groups is another config
        with client.publisher(queue, window=20) as publisher:
            for n in range(12):
                publisher.publish(b"%d" % n, group=f"g{n % 3}")
            publisher.publish_many([b"plain-1", b"plain-2"])  # the default group
        client.publish(queue, b"12", group="g0")
        listed = {info.group: (info.ready, info.checked_out) for info in client.groups(queue)}
        assert listed == {"g0": (5, 0), "g1": (4, 0), "g2": (4, 0), None: (2, 0)}
        assert client.purge_queue(queue, group="g2").count == 4
        assert client.purge_queue(queue, default_group=True).count == 2
        consumer = client.consume(queue, prefetch=3)
        got: list[tuple[str | None, int]] = []
        while len(got) < 9:
            message = consumer.get(timeout_s=10.0)
            assert message is not None, f"only {len(got)} of 9 messages arrived"
            got.append((message.group, int(message.body)))
            message.ack()
        consumer.cancel()
        assert consumer.wait_settled()
        assert [n for g, n in got if g == "g0"] == [0, 3, 6, 9, 12]
        assert [n for g, n in got if g == "g1"] == [1, 4, 7, 10]
        assert client.groups(queue) == []
