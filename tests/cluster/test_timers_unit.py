"""The leader timers' node bookkeeping without processes: which NodeDown / NodeUp a leader
proposes (`TimerPlan.due`, pure, in virtual time)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

import fifo
from cluster.node.timers import LeaderTimers, TimerPlan, TimerView
from fifo.commands import (
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Expire,
    NodeDown,
    NodeUp,
    SimplePrefetch,
)
from fifo.meta import Meta
from fifo.replies import Error
from raft.replica import Replica


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


def _run(plan: TimerPlan, steps: list[tuple[float, TimerView]]) -> list[tuple[float, list[object]]]:
    """Every step's proposals, in order (only the non-empty ones)."""
    out: list[tuple[float, list[object]]] = []
    for at, view in steps:
        proposed = plan.due(at, view)
        if proposed:
            out.append((at, list(proposed)))
    return out


def test_a_peer_that_flaps_before_its_node_up_commits_is_marked_down_again() -> None:
    """Killed, back (seen connected while still listed down: NodeUp proposed, not committed)
    and killed again: the leader proposes NodeDown again, so the consumers that attached
    through it while it was back are suspected (node flap; before the fix nothing was proposed
    as the peer stayed listed down)."""
    peers = ["n2", "n3"]
    steps = [
        (0.0, _view("n1", peers, connected={"n2"}, down=[])),
        (1.5, _view("n1", peers, connected={"n2"}, down=[])),  # NodeDown(n3)
        (2.0, _view("n1", peers, connected={"n2"}, down=["n3"])),
        (2.5, _view("n1", peers, connected={"n2", "n3"}, down=["n3"])),  # back: NodeUp(n3)
        (2.6, _view("n1", peers, connected={"n2"}, down=["n3"])),  # lost again, NodeUp lost
        (3.0, _view("n1", peers, connected={"n2"}, down=["n3"])),
        (4.0, _view("n1", peers, connected={"n2"}, down=["n3"])),  # lost for 1.4 s
        (4.2, _view("n1", peers, connected={"n2"}, down=["n3"])),  # for 1.6 s
        (9.0, _view("n1", peers, connected={"n2"}, down=["n3"])),
    ]
    assert _run(TimerPlan(), steps) == [
        (1.5, [NodeDown("n3")]),
        (2.5, [NodeUp("n3")]),
        (4.2, [NodeDown("n3")]),  # once: not again later, it is listed down and was not back
    ]


def test_a_flap_within_the_resubmit_window_still_gets_its_node_down() -> None:
    """The second NodeDown encodes like the first: if the peer is lost again for the grace
    period before the first one's resubmit window ends, it is proposed once the window ends."""
    plan = TimerPlan(down_after_s=0.5, resubmit_s=2.0)
    peers = ["n2"]
    steps = [
        (0.0, _view("n1", peers, connected=set(), down=[])),
        (0.5, _view("n1", peers, connected=set(), down=[])),  # NodeDown(n2)
        (0.7, _view("n1", peers, connected={"n2"}, down=["n2"])),  # NodeUp(n2)
        (0.8, _view("n1", peers, connected=set(), down=["n2"])),
        (1.3, _view("n1", peers, connected=set(), down=["n2"])),  # lost 0.5 s: window not over
        (2.5, _view("n1", peers, connected=set(), down=["n2"])),
        (3.0, _view("n1", peers, connected=set(), down=["n2"])),
    ]
    assert _run(plan, steps) == [
        (0.5, [NodeDown("n2")]),
        (0.7, [NodeUp("n2")]),
        (2.5, [NodeDown("n2")]),
    ]


def test_a_restart_the_leader_never_saw_connected_is_known_by_its_incarnation() -> None:
    """The timer tick may never see the peer connected while it was back; its Hello committed
    a new incarnation, so consumers could attach through it: NodeDown again once it is lost."""

    def view(down: list[str], n3_incarnation: int) -> TimerView:
        return TimerView(
            leader=True,
            me="n1",
            connected={"n2": True, "n3": False},
            down_nodes=tuple(down),
            incarnations={"n2": 1, "n3": n3_incarnation},
        )

    steps = [
        (0.0, view([], 1)),
        (1.5, view([], 1)),  # NodeDown(n3)
        (2.0, view(["n3"], 1)),
        (3.0, view(["n3"], 2)),  # restarted (Hello committed), killed again between two ticks
        (4.4, view(["n3"], 2)),
        (4.5, view(["n3"], 2)),  # lost for 1.5 s since its new incarnation was seen
        (9.0, view(["n3"], 2)),
    ]
    assert _run(TimerPlan(), steps) == [(1.5, [NodeDown("n3")]), (4.5, [NodeDown("n3")])]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_machine_suspects_on_a_node_down_for_a_node_already_down(version: int) -> None:
    """What the flap fix relies on: NodeDown is not deduplicated in the machine, so a second
    one suspects the consumer that attached through the node after the first (and leaves the
    first suspicion as it was). A NodeUp before it would instead bring the old consumers up
    and deliver to them, on a node that is gone."""
    state = fifo.init_state(version)
    index = 0

    def apply(command: Command) -> None:
        nonlocal index
        index += 1
        reply, _ = fifo.apply(Meta(index, 1, 1000 + index, version), command, state)
        assert not isinstance(reply, Error), reply

    def statuses() -> list[str]:
        return [c.status for c in fifo.consumers(state, "q")]

    apply(DeclareQueue("q"))
    apply(Checkout("q", ConsumerId("old", ConnectionId("n2", 1, 1)), SimplePrefetch(5)))
    apply(NodeDown("n2"))
    assert statuses() == ["suspected_down"]
    apply(Checkout("q", ConsumerId("new", ConnectionId("n2", 2, 1)), SimplePrefetch(5)))
    assert statuses() == ["suspected_down", "up"]
    apply(NodeDown("n2"))
    assert statuses() == ["suspected_down", "suspected_down"]


def test_a_timer_command_the_machine_applied_may_be_proposed_again_at_once() -> None:
    """A queue's next message expiring just after the one an Expire took: proposed on the next
    round once the first Expire applied, not `resubmit_s` later (issue 31: TTLs 2 s late);
    one still in flight is not proposed twice."""
    plan = TimerPlan(resubmit_s=2.0)
    due = TimerView(leader=True, me="n1", connected={}, due_commands=(Expire("q"),))
    assert plan.due(0.0, due) == [Expire("q")]
    assert plan.due(0.1, due) == []  # in flight
    plan.applied(Expire("q"))
    assert plan.due(0.2, due) == [Expire("q")]


class _IdleReplica:
    """What `LeaderTimers` reads of a replica, with every read of the state counted; the
    machine's next deadline is `deadline` and an Expire is due from it on."""

    def __init__(self) -> None:
        self.settings = SimpleNamespace(node_id="n1")
        self.leading, self.applied, self.now_ms = True, 10, 0
        self.connected = {"n2": True, "n3": True}
        self.deadline: int | None = None
        self.reads, self.proposed = 0, list[Command]()

    def role(self) -> str:
        return "leader" if self.leading else "follower"

    def applied_index(self) -> int:
        return self.applied

    def peers(self) -> list[str]:
        return list(self.connected)

    def peer_connected(self, peer: str) -> bool:
        return self.connected[peer]

    def machine_now_ms(self) -> int:
        return self.now_ms

    def read(self, function: Any) -> Any:
        self.reads += 1
        meta = SimpleNamespace(down_nodes=[], incarnations={})
        return function(SimpleNamespace(state=self, meta=meta, upgrade_target=lambda: None))

    def propose(self, command: Command, _on_reply: object) -> None:
        self.proposed.append(command)


def test_an_idle_leader_s_timers_read_the_state_again_only_when_something_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the replicated state costs about 100 us under the apply lock: an idle leader
    reads it once, and again only when an entry was applied, a peer's connection dropped, the
    machine's time reached its next deadline or the role changed; each of these is still seen
    on the round it happens."""
    replica = _IdleReplica()
    monkeypatch.setattr(fifo, "next_deadline_ms", lambda state: state.deadline)
    monkeypatch.setattr(fifo, "due_commands", lambda state, now: [Expire("q")])
    timers = LeaderTimers(cast(Replica, replica), down_after_s=0.0)

    def rounds(count: int = 5) -> int:
        before = replica.reads
        for _ in range(count):
            timers.tick()
        return replica.reads - before

    assert rounds() == 1 and replica.proposed == []
    replica.applied, replica.deadline = 11, 5_000  # a consumer checked out with a timeout
    assert rounds() == 1
    replica.now_ms = 4_999
    assert rounds() == 0
    replica.now_ms = 5_000
    assert rounds(1) == 1 and replica.proposed == [Expire("q")]
    assert rounds(2) == 2  # something is due: read at every round until it is applied
    replica.applied, replica.deadline = 12, None
    assert rounds() == 1
    replica.connected["n3"] = False
    assert rounds(1) == 1 and replica.proposed[-1] == NodeDown("n3")
    replica.connected["n3"] = True
    assert rounds() == 1  # back, and not listed down yet: quiet until its NodeDown applies
    replica.leading = False
    assert rounds() == 0  # a follower reads nothing
    replica.leading = True
    assert rounds() == 1
