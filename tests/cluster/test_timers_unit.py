"""The leader timers' node bookkeeping without processes: which NodeDown / NodeUp a leader
proposes (`TimerPlan.due`, pure, in virtual time)."""

from __future__ import annotations

from cluster.node.timers import TimerPlan, TimerView
from fifo.commands import NodeDown, NodeUp


def _view(me: str, peers: list[str], connected: set[str], down: list[str]) -> TimerView:
    return TimerView(
        leader=True,
        me=me,
        connected={peer: peer in connected for peer in peers},
        down_nodes=tuple(down),
    )


def test_a_leader_that_an_earlier_leader_marked_down_brings_itself_up() -> None:
    """A node that was lost (NodeDown committed by another leader) and then leads must commit
    NodeUp for itself: no peer ever will, and its consumers would get nothing for ever
    (found with issue 17)."""
    view = _view("n3", ["n1", "n2"], connected={"n1", "n2"}, down=["n3"])
    assert TimerPlan(down_after_s=0.0).due(0.0, view) == [NodeUp("n3")]


def test_peers_go_down_when_lost_and_up_when_back() -> None:
    """A lost peer not yet down gets NodeDown; a connected peer listed down gets NodeUp."""
    view = _view("n1", ["n2", "n3"], connected={"n3"}, down=["n3"])
    assert TimerPlan(down_after_s=0.0).due(0.0, view) == [NodeDown("n2"), NodeUp("n3")]
