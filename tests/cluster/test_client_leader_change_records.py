"""A leader change the client rides out is one log record, never one per refused frame.

The client publishes through the leader while both followers are paused (SIGSTOP) until it
steps down for want of a majority, and the leader while a follower is elected: the node refuses
or loses many frames meanwhile
(`unavailable`: no leader, the leader changed, the entry was discarded by a new leader), and the
client retries them all on the same connection. It says so once, at INFO on `quorumq.client`
(how many frames were refused, for how long), and prints nothing on stdout.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator

import pytest

from cluster.launcher import LocalCluster, local_cluster, node_status, wait_until
from tests.background import Background


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("leader-change-records") / "D", 3) as running:
        yield running


BEFORE_PAUSE = 400  # messages published before the followers are paused; the rest after
DEPOSE_S_MAX = 150.0  # `_depose` waits 30 s at most for each of its steps, then resumes the nodes


def _depose(cluster: LocalCluster, leader: str, publisher: object, paused: threading.Event) -> None:
    """Once some messages are confirmed, pause both followers until `leader` steps down (it
    lost its majority); resume them, and wait until the cluster has a leader again. `paused`
    is set once both are stopped: the rest of the messages go out only then, so the publisher
    meets the leader change however fast it publishes (before, on a fast run all 3,000 were
    confirmed before the pause and the client had nothing to log)."""
    wait_until(lambda: getattr(publisher, "confirmed", 0) >= 300, 30.0, "300 confirms")
    followers = [node for node in cluster.config.node_ids() if node != leader]
    for node in followers:
        cluster.kill(node, signal.SIGSTOP)
    paused.set()
    try:
        wait_until(lambda: _role(cluster, leader) not in ("leader", None), 30.0, "a step-down")
        # with the longest log it would stand again, win, and commit what it holds: nothing
        # refused (since a node that stops leading gets a fresh election timeout). Paused, a
        # follower is elected, and what it held unconfirmed is discarded by the new leader
        cluster.kill(leader, signal.SIGSTOP)
    finally:
        for node in followers:
            cluster.kill(node, signal.SIGCONT)
    try:
        cluster.leader(exclude=leader, timeout_s=30.0)
    finally:
        cluster.kill(leader, signal.SIGCONT)
    cluster.leader(timeout_s=30.0)


def _role(cluster: LocalCluster, node: str) -> str | None:
    status = node_status(cluster.config.node(node), cluster.key, timeout_s=1.0)
    return None if status is None else str(status["role"])


@pytest.mark.cluster
def test_a_leader_change_ridden_out_by_a_publisher_is_one_info_record(
    cluster: LocalCluster,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="quorumq")
    caplog.set_level(logging.INFO)
    leader = cluster.leader()
    total = 3000
    # no confirm comes while the followers and then the leader are paused (several seconds):
    # the client must not give the node up as silent meanwhile
    with cluster.client(leader, reconnect_timeout_s=30.0, silence_timeout_s=30.0) as client:
        client.declare_queue("changes")
        with (
            client.publisher("changes", window=200) as publisher,
            Background("leader-change", join_timeout_s=DEPOSE_S_MAX) as deposing,
        ):
            paused = threading.Event()
            deposing.start(lambda: _depose(cluster, leader, publisher, paused), "depose")
            first = [b"m%d" % i for i in range(BEFORE_PAUSE)]
            publisher.publish_many(first, timeout_s=60.0)
            assert paused.wait(60.0), "the followers were never paused"
            rest = (b"m%d" % i for i in range(BEFORE_PAUSE, total))
            publisher.publish_many(rest, timeout_s=60.0)
            publisher.wait_for_confirms(timeout_s=60.0)
        assert not deposing.errors, deposing.errors
        assert publisher.confirmed == total
        assert client.reconnects == 0, "the leader kept serving: no reconnect expected"
    assert capfd.readouterr().out == ""
    records = [
        r for r in caplog.records if r.name.startswith("quorumq") and r.levelno >= logging.INFO
    ]
    everything = [r.getMessage() for r in caplog.records if r.name.startswith("quorumq")]
    assert len(records) == 1, everything[:50]
    (record,) = records
    assert record.name == "quorumq.client"
    assert record.__dict__["quorumq_event"] == "leader_unavailable"
    assert record.__dict__["quorumq_context"]["refused"] >= 1
    debug = [r for r in caplog.records if r.name == "quorumq.client"]
    assert len(debug) < 20, f"{len(debug)} records: one per frame? {debug[0].getMessage()}"
