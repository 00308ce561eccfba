"""Effect routing (issue 24): deliveries held while a follower applies a batch of committed
entries go out right after that tick, not at the node's next periodic reconciliation."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.node.effects import EffectRouter
from fifo.commands import ConnectionId
from tests.cluster.test_node_effects import FakeReplica, deliveries, delivery_of, held_consumer


def test_a_hold_during_a_batch_is_reconciled_right_after_the_tick() -> None:
    """Inside one loop callback (a tick applying entries 100..120 of a batch): the delivery
    of an early entry is held; the state is current once the batch is applied; the held
    messages go out in the next loop iteration, with no periodic reconcile called."""
    live = ConnectionId("n1", 2, 1)
    state, _consumer = held_consumer(live, [0, 1])
    replica = FakeReplica(state)
    router = EffectRouter("n1", incarnation=2)
    router.use_replica(replica)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    router.register(live, sent.append)

    async def one_tick_then_the_next_iteration() -> list[tuple[int, bytes]]:
        replica.current = False  # an entry before the leader's commit index
        router.dispatch([delivery_of(live, 0, 1)])
        replica.current = True  # the batch's last entry applied, no effect for this node
        held_after_the_tick = deliveries(sent)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert held_after_the_tick == []
        return deliveries(sent)

    assert asyncio.run(one_tick_then_the_next_iteration()) == [(0, b"m0"), (1, b"m1")]


def test_a_batch_over_two_ticks_is_reconciled_after_the_second() -> None:
    """Still behind after the first tick (the reconciliation finds the state not current);
    the second tick holds again and asks again: reconciled right after it."""
    live = ConnectionId("n1", 2, 1)
    state, _consumer = held_consumer(live, [0, 1])
    replica = FakeReplica(state)
    router = EffectRouter("n1", incarnation=2)
    router.use_replica(replica)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    router.register(live, sent.append)

    async def two_ticks() -> list[tuple[int, bytes]]:
        replica.current = False
        router.dispatch([delivery_of(live, 0)])
        await asyncio.sleep(0)  # the first reconciliation: not current, nothing sent
        await asyncio.sleep(0)
        assert deliveries(sent) == []
        router.dispatch([delivery_of(live, 1)])
        replica.current = True
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return deliveries(sent)

    assert asyncio.run(two_ticks()) == [(0, b"m0"), (1, b"m1")]
