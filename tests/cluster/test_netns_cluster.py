"""Three hosts, not three processes: bundle nodes in network namespaces of their own, TLS on,
the client in a fourth; a kill, a partition that is a link taken down, a node replaced."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.chaos.netns import NETNS_DIR, netns_lab, unavailable
from cluster.chaos.netns_cluster import NetnsCluster
from cluster.client import Client
from cluster.launcher import wait_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]

BATCH = 100


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    """Three bundle nodes, each in its own namespace; everything removed after the test."""
    with netns_lab([]) as lab:
        cluster = NetnsCluster(lab, tmp_path)
        cluster.start_all()
        cluster.wait_leader()
        yield cluster
    assert not [p for p in NETNS_DIR.iterdir() if p.name.startswith(lab.prefix)]


def _publish(client: Client, tag: str) -> set[bytes]:
    bodies = {f"{tag}-{i}".encode() for i in range(BATCH)}
    with client.publisher("jobs", window=50) as publisher:  # waits for every confirm
        publisher.publish_many(sorted(bodies))
    return bodies


def test_kill_partition_and_replace_across_namespaces_lose_nothing(
    netns_cluster: NetnsCluster,
) -> None:
    """Publish; kill the leader and publish; cut the new leader's link, publish through the
    others, heal; replace a follower by a new host (member add, member remove) and publish:
    every confirmed message is consumed, none that was not published, and the three members
    left end with equal digests."""
    cluster = netns_cluster
    published: set[bytes] = set()
    with cluster.client_side(), cluster.client(silence_timeout_s=3.0) as client:
        client.declare_queue("jobs")
        published |= _publish(client, "start")
        first = cluster.wait_leader()
        cluster.kill(first)
        second = cluster.wait_leader(exclude=first)
        published |= _publish(client, "killed")
        cluster.start(first)
        cluster.converged()
        cluster.partition(second)
        third = cluster.wait_leader(exclude=second)
        published |= _publish(client, "partitioned")
        cluster.heal(second)
        cluster.converged()
        follower = next(n for n in cluster.node_ids() if n != cluster.wait_leader())
        new = cluster.replace(follower)
        assert new not in (first, second, third) and follower not in cluster.node_ids()
    with cluster.client_side(), cluster.client() as client:
        published |= _publish(client, "replaced")
        received: list[bytes] = []
        consumer = client.consume("jobs", prefetch=200)
        for message in consumer.messages(idle_timeout_s=3.0):
            received.append(message.body)
            message.ack()
        assert consumer.wait_settled()
    assert set(received) == published  # nothing lost, nothing unexpected
    statuses = cluster.converged()
    assert sorted(statuses) == sorted(cluster.node_ids()) and len(statuses) == 3
    assert {s["role"] for s in statuses.values()} == {"leader", "follower"}


def test_a_cut_link_is_a_real_network_failure() -> None:
    """With a host's link down, its listener does not answer from the client namespace; with
    the link up again, it does; closing the lab stops the listener and deletes every
    namespace it made."""
    with netns_lab(["client", "a"]) as lab:
        address = lab.hosts["a"].address
        listener = lab.popen("a", [sys.executable, "-c", LISTENER], stdout=subprocess.PIPE)
        assert listener.stdout is not None and listener.stdout.readline() == b"ready\n"

        def reachable() -> bool:
            with lab.entered("client"), socket.socket() as sock:
                sock.settimeout(1.0)
                return sock.connect_ex((address, 9999)) == 0

        assert reachable()
        lab.link_down("a")
        assert not reachable()
        lab.link_up("a")
        wait_until(reachable, 10.0, "the listener reachable again")  # ARP resolves anew
    assert listener.poll() is not None
    leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab.prefix not in leftover


LISTENER = (
    "import socket, time\n"
    "s = socket.socket(); s.bind(('0.0.0.0', 9999)); s.listen()\n"
    "print('ready', flush=True); time.sleep(120)\n"
)
