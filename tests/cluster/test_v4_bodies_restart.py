"""Real node processes running machine v4 (issue 32): messages keep only a reference to their
body in the state, so a node reads every body back from its journal to send it. Publish, restart
the node the consumer will use (its body cache is empty then), and take the exact bodies back
there, in order, by basic.get, by peek and by a consumer.

The cluster keeps the default `snapshot_every_entries` (5,000): no log compaction happens in
this run. Entries holding live bodies survive compaction only with the retention work of the
same issue (branch `retention`), not merged here yet; until it is, a body whose entry was
compacted away is reported missing (`body_missing`, with its index) rather than sent."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from cluster.launcher import start_cluster, wait_until
from cluster.node.server import UNRELEASED_FLAG

pytestmark = pytest.mark.cluster

MESSAGES = 300
QUEUE = "backlog"


def _bodies() -> list[bytes]:
    rng = random.Random(32)
    return [rng.randbytes(rng.randrange(1, 3000)) for _ in range(MESSAGES)]


def _sums(bodies: list[bytes]) -> list[str]:
    return [hashlib.sha256(body).hexdigest() for body in bodies]


def test_a_restarted_node_sends_the_exact_bodies_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every body comes back byte for byte (checksums), in publish order, from a node that was
    restarted after the publishes: read back from its journal, never from the state."""
    monkeypatch.setenv(UNRELEASED_FLAG, "1")
    cluster = start_cluster(tmp_path / "D", 3, max_machine_version=4)
    try:
        leader = cluster.leader()
        raw = cluster.raw_client(leader)
        wait_until(lambda: raw.query("machine")["effective_version"] == 4, 30, "machine v4")
        raw.close()
        bodies = _bodies()
        with cluster.client(leader) as client:
            client.declare_queue(QUEUE)
            with client.publisher(QUEUE, window=50) as publisher:
                for body in bodies:
                    publisher.publish(body)
                publisher.wait_for_confirms(60)
        restarted = next(node.id for node in cluster.config.nodes if node.id != leader)
        cluster.restart(restarted, max_machine_version=4)
        with cluster.client(restarted, only=True) as client:
            wait_until(lambda: _ready(client) == MESSAGES, 30, "the restarted node to catch up")
            peeked = [info.body for info in client.messages(QUEUE, limit=3)]
            assert _sums(peeked) == _sums(bodies[:3])
            first = client.get(QUEUE, settled=True)
            assert first is not None and _sums([first.body]) == _sums(bodies[:1])
            consumer = client.consume(QUEUE, prefetch=50)
            got: list[bytes] = []
            for message in consumer.messages(idle_timeout_s=10):
                got.append(message.body)
                message.ack()
                if len(got) == MESSAGES - 1:
                    break
            assert _sums(got) == _sums(bodies[1:])
        logged = (cluster.config.node(restarted).data_dir / "stdout.log").read_text()
        assert "body_missing" not in logged
    finally:
        cluster.stop()


def _ready(client: object) -> int:
    overview = client.overview(QUEUE)  # type: ignore[attr-defined]
    return 0 if overview is None else int(overview.ready)
