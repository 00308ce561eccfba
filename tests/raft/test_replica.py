"""The seam the node uses (`raft.replica.Replica`), on a real single-node pysyncobj group in this
process: proposals answered on the loop, effects handed over after their entry's replies,
read-only views, upgrades and hellos through the same door."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fifo
from cluster.launcher import free_ports
from fifo.commands import Checkout, ConnectionId, ConsumerId, DeclareQueue, Enqueue, SimplePrefetch
from fifo.effects import Deliver
from fifo.replies import CheckoutOk, DeclareOk, Ok
from raft.node import RaftSettings
from raft.replica import Applied, Replica, ReplicaView, Reply
from raft.replicated import InternalFailure

pytestmark = pytest.mark.slow


def _settings(data_dir: Path) -> RaftSettings:
    return RaftSettings(
        node_id="n1",
        address=f"127.0.0.1:{free_ports(1)[0]}",
        peers={},
        data_dir=data_dir,
        password="secret-for-tests",
        supported_version=2,
        incarnation=7,
        election_timeout_ms=(300, 500),
    )


class Recorder:
    """What the replica hands to the node, in the order it arrives on the loop."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.resets: list[int] = []

    def applied(self, applied: Applied) -> None:
        for effect in applied.effects:
            self.events.append(("effect", effect))

    def reset(self, index: int) -> None:
        self.resets.append(index)


async def _propose(replica: Replica, recorder: Recorder, command: object) -> Reply:
    done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

    def on_reply(reply: Reply) -> None:
        recorder.events.append(("reply", reply))
        done.set_result(reply)

    replica.propose(command, on_reply)  # type: ignore[arg-type]
    return await asyncio.wait_for(done, 15)


async def _scenario(data_dir: Path) -> None:
    recorder = Recorder()
    replica = Replica(
        _settings(data_dir), asyncio.get_running_loop(), recorder.applied, recorder.reset
    )
    try:
        while replica.role() != "leader":
            await asyncio.sleep(0.05)
        mine = ConnectionId("n1", 7, 1)
        elsewhere = ConnectionId("n2", 3, 1)
        assert isinstance(await _propose(replica, recorder, DeclareQueue("q")), DeclareOk)
        checkout = Checkout("q", ConsumerId("c", mine), SimplePrefetch(10))
        assert isinstance(await _propose(replica, recorder, checkout), CheckoutOk)
        other = Checkout("q2", ConsumerId("c", elsewhere), SimplePrefetch(10))
        await _propose(replica, recorder, DeclareQueue("q2"))
        await _propose(replica, recorder, other)
        recorder.events.clear()

        assert await _propose(replica, recorder, Enqueue("q", b"x")) == Ok()
        await _propose(replica, recorder, Enqueue("q2", b"y"))
        await asyncio.sleep(0.2)
        kinds = [kind for kind, _ in recorder.events]
        # the reply of the entry first, then its effect for our connection; the delivery to a
        # connection of another node is that node's business and never reaches us
        assert kinds == ["reply", "effect", "reply"], recorder.events
        delivered = recorder.events[1][1]
        assert isinstance(delivered, Deliver) and delivered.connection == mine

        def count(view: ReplicaView) -> tuple[int, bool, list[tuple[int, int]]]:
            overview = fifo.overview(view.state, "q")
            assert overview is not None
            return overview.total, view.lists_connection(mine), view.connections_of("n1")

        assert replica.read(count) == (1, True, [(7, 1)])

        upgraded: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        replica.propose_hello(lambda reply: None)
        replica.propose_upgrade(2, upgraded.set_result)
        assert await asyncio.wait_for(upgraded, 15) == Ok()
        assert replica.read(lambda view: view.meta.effective_version) == 2
        assert not any(isinstance(r, InternalFailure) for _, r in recorder.events)
        assert recorder.resets == []
    finally:
        replica.destroy()


def test_the_replica_answers_proposals_and_hands_over_effects_in_order(tmp_path: Path) -> None:
    """propose -> reply on the loop; the entry's effects for this node come after its reply;
    read() sees the applied state; hello and upgrade go through the same seam."""
    asyncio.run(_scenario(tmp_path))
