"""Real node processes running machine v4 (issue 31, item 3): a connection cannot settle,
return, discard, modify or renew the deliveries of another connection's consumer.

Connection A consumes on the leader; connection B, authenticated too, on another node, names
A's consumer key and message ids in every settling command (keys and ids are small integers,
easy to guess). Each is refused with `not_owner`; A still holds every message, and A's own
acks afterwards are `ok` and remove them: nothing was dropped unprocessed."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.client.errors import CommandRefused
from cluster.launcher import LocalCluster, init_cluster, wait_until
from cluster.node.server import UNRELEASED_FLAG
from fifo.commands import Discard, Modify, RenewLocks, Return, Settle
from fifo.replies import Ok

pytestmark = pytest.mark.cluster

QUEUE = "owned"
MESSAGES = 5


def test_another_connection_cannot_settle_a_consumers_deliveries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's discard, settle, return, modify and renew of A's deliveries are refused with
    not_owner and change nothing; A's later ack of the same ids is ok."""
    monkeypatch.setenv(UNRELEASED_FLAG, "1")
    cfg = init_cluster(tmp_path / "D", nodes=3)
    cluster = LocalCluster(tmp_path / "D", cfg)
    try:
        for node in cfg.nodes:
            cluster.start_node(node.id, max_machine_version=4)
        leader = cluster.leader()
        other = next(node.id for node in cfg.nodes if node.id != leader)
        raw = cluster.raw_client(leader)
        wait_until(lambda: raw.query("machine")["effective_version"] == 4, 30, "machine v4")
        raw.close()
        with cluster.client(leader, only=True) as owner, \
                cluster.client(other, only=True) as attacker:  # fmt: skip
            owner.declare_queue(QUEUE)
            for number in range(MESSAGES):
                owner.publish(QUEUE, b"job %d" % number)
            consumer = owner.consume(QUEUE, prefetch=MESSAGES)
            held = []
            for message in consumer.messages(idle_timeout_s=10):
                held.append(message)
                if len(held) == MESSAGES:
                    break
            key = held[0].consumer_key
            ids = tuple(message.msg_id for message in held)
            foreign = [Discard(QUEUE, key, ids), Settle(QUEUE, key, ids),
                       Return(QUEUE, key, ids), Modify(QUEUE, key, ids, True, True),
                       RenewLocks(QUEUE, key, ids)]  # fmt: skip
            for command in foreign:
                with pytest.raises(CommandRefused) as refused:
                    attacker.command(command)
                assert refused.value.code == "not_owner", (type(command).__name__, refused.value)
                overview = attacker.overview(QUEUE)
                assert overview is not None and overview.checked_out == MESSAGES
            assert isinstance(owner.command(Settle(QUEUE, key, ids)), Ok)
            wait_until(lambda: _total(attacker) == 0, 30, "the owner's acks to apply everywhere")
            consumer.close()
    finally:
        cluster.stop()


def _total(client: object) -> int:
    overview = client.overview(QUEUE)  # type: ignore[attr-defined]
    assert overview is not None
    return int(overview.total)
