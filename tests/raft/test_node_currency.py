"""RaftNode.applied_state_current as a follower catching up (issue 24): a real node whose raft
view is set to that of a follower applying a batch of committed entries in one tick."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.syncobj import _RAFT_STATE

from cluster.launcher import free_ports
from raft.contact import STEADY_S
from raft.node import RaftNode, RaftSettings
from raft.replicated import Outcome


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[RaftNode]:
    """A node that follows n2, connected to it and hearing it steadily, whose log holds entries
    up to 120, all committed (the leader said 120)."""
    port, peer = free_ports(2)
    settings = RaftSettings(
        node_id="n1",
        address=f"127.0.0.1:{port}",
        peers={"n2": f"127.0.0.1:{peer}"},
        data_dir=tmp_path,
        password="secret-for-tests",
        supported_version=2,
        incarnation=1,
    )
    outcomes: list[Outcome] = []
    node = RaftNode(settings, outcomes.append)
    node._SyncObj__raftState = _RAFT_STATE.FOLLOWER
    node.leader_id = lambda: "n2"  # type: ignore[method-assign]
    node.peer_connected = lambda node_id: True  # type: ignore[method-assign]
    now = monotonic_time()
    node._leader_contact.heard("n2", now - STEADY_S - 0.05)
    step = 0.05
    while step < STEADY_S + 0.05:
        node._leader_contact.heard("n2", now - STEADY_S - 0.05 + step)
        step += 0.05
    node._leader_contact.heard("n2", now)
    node._SyncObj__leaderCommitIndex = 120
    node._SyncObj__raftCommitIndex = 120
    try:
        yield node
    finally:
        node.destroy_synchronous()


def test_a_follower_applying_entries_before_the_commit_index_is_not_current(
    follower: RaftNode,
) -> None:
    """Entry 101 of a batch through 120 is being handed over: a later entry of the same batch
    may take its deliveries back, so the state is not current yet; at 120 it is."""
    follower._SyncObj__raftLastApplied = 100
    follower._applied_through = 101
    assert not follower.applied_state_current()
    follower._SyncObj__raftLastApplied = 119
    follower._applied_through = 120
    assert follower.applied_state_current()


def test_a_follower_that_applied_everything_is_current(follower: RaftNode) -> None:
    """Between ticks, every committed entry applied (the last ones pysyncobj's own no-ops,
    which never pass through apply_entry): current."""
    follower._SyncObj__raftLastApplied = 120
    follower._applied_through = 117
    assert follower.applied_state_current()
