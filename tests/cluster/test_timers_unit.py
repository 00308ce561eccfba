"""LeaderTimers' node bookkeeping without processes: which NodeDown / NodeUp a leader proposes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from cluster.node.timers import LeaderTimers
from fifo.commands import NodeDown, NodeUp
from raft.batcher import GroupCommitter
from raft.node import RaftNode


@dataclass
class _Settings:
    node_id: str
    peers: dict[str, str]


@dataclass
class _Node:
    """The little of a RaftNode that `_node_changes` reads."""

    settings: _Settings
    connected: set[str] = field(default_factory=set)

    def peer_connected(self, node_id: str) -> bool:
        return node_id in self.connected


def _timers(node: _Node) -> LeaderTimers:
    return LeaderTimers(cast(RaftNode, node), cast(GroupCommitter, None), down_after_s=0.0)


def test_a_leader_that_an_earlier_leader_marked_down_brings_itself_up() -> None:
    """A node that was lost (NodeDown committed by another leader) and then leads must commit
    NodeUp for itself: no peer ever will, and its consumers would get nothing for ever
    (found with issue 17)."""
    node = _Node(_Settings("n3", {"n1": "a", "n2": "b"}), connected={"n1", "n2"})
    changes: list[Any] = _timers(node)._node_changes(["n3"])
    assert changes == [NodeUp("n3")]


def test_peers_go_down_when_lost_and_up_when_back() -> None:
    """A lost peer not yet down gets NodeDown; a connected peer listed down gets NodeUp."""
    node = _Node(_Settings("n1", {"n2": "a", "n3": "b"}), connected={"n3"})
    assert _timers(node)._node_changes(["n3"]) == [NodeDown("n2"), NodeUp("n3")]
