"""Hypothesis stateful tests of single-active-consumer queues against `SacModel`, per version.

After every step the machine's active consumer, its quiescing state and the waiting order match
the model, deliveries go only to the active consumer in queue order, and the fuzzer's invariants
hold. v1: first attached is active, attach order. v2: priorities with quiescing takeover.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import fifo
from fifo.commands import (
    Cancel,
    Checkout,
    Command,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver, Effect
from fifo.fuzz import probe
from fifo.fuzz.invariants import Checker
from fifo.meta import Meta
from fifo.replies import CancelOk, CheckoutOk, Error, Ok, Reply
from tests.fifo.model import SacConsumer, SacModel, fifo_settings

QUEUE = "sac"
TAGS = ("a", "b", "c", "d")


class SacAgainstModel(RuleBasedStateMachine):
    """Four possible consumers, each on its own connection (so a down closes exactly one)."""

    version = 1

    def __init__(self) -> None:
        super().__init__()
        self.state = fifo.init_state(self.version)
        self.model = SacModel(self.version)
        self.checker = Checker()
        self.index = 0
        self.bodies = 0
        self.incarnation = {tag: 1 for tag in TAGS}
        reply, _ = self.apply(DeclareQueue(QUEUE, QueueConfig(single_active_consumer=True)))
        assert not isinstance(reply, Error), reply

    def cid(self, tag: str) -> ConsumerId:
        return ConsumerId(tag, ConnectionId("n1", self.incarnation[tag], TAGS.index(tag)))

    def apply(self, command: Command) -> tuple[Reply, list[Effect]]:
        self.index += 1
        meta = Meta(self.index, 1, 1_000 + self.index, self.version)
        peek = self.checker.before(self.state, command)
        reply, effects = fifo.apply(meta, command, self.state)
        assert self.checker.after(self.state, command, reply, effects, peek) == []
        for effect in effects:
            if isinstance(effect, Deliver):
                for message in effect.messages:
                    self.model.deliver(ConsumerId(effect.tag, effect.connection),
                                       message.msg_id, message.body)
        return reply, effects

    @rule()
    def enqueue(self) -> None:
        self.bodies += 1
        body = b"s%05d" % self.bodies
        self.model.ready.append(body)
        reply, _ = self.apply(Enqueue(QUEUE, body))
        assert isinstance(reply, Ok), reply

    @rule(tag=st.sampled_from(TAGS), prefetch=st.integers(1, 3), priority=st.integers(0, 2))
    def checkout(self, tag: str, prefetch: int, priority: int) -> None:
        cid = self.cid(tag)
        self.model.checkout(cid, prefetch, priority, self.index + 1)
        reply, _ = self.apply(Checkout(QUEUE, cid, SimplePrefetch(prefetch), priority))
        assert isinstance(reply, CheckoutOk), reply

    @rule(tag=st.sampled_from(TAGS))
    def cancel(self, tag: str) -> None:
        cid = self.cid(tag)
        known = self.model.find(cid) is not None and cid not in self.model.cancelled
        self.model.cancel(cid)
        reply, _ = self.apply(Checkout(QUEUE, cid, Cancel()))
        if known:
            assert isinstance(reply, CancelOk), reply

    @rule(tag=st.sampled_from(TAGS))
    def connection_closed(self, tag: str) -> None:
        cid = self.cid(tag)
        self.model.down(cid)
        self.apply(ConnectionDown(cid.connection, "normal"))
        self.incarnation[tag] += 1  # the client reconnects on a new connection

    @precondition(lambda self: self.holders())
    @rule(data=st.data(), give_back=st.booleans())
    def settle(self, data: st.DataObject, give_back: bool) -> None:
        consumer = data.draw(st.sampled_from(self.holders()))
        ids = tuple(data.draw(st.lists(st.sampled_from(sorted(consumer.held)), min_size=1,
                                       max_size=2)))
        self.model.settle(consumer.cid, ids, give_back)
        command = (Return if give_back else Settle)(QUEUE, consumer.cid, ids)
        reply, _ = self.apply(command)
        assert isinstance(reply, Ok), reply

    def holders(self) -> list[SacConsumer]:
        """Consumers holding messages: active, waiting or cancelled."""
        everyone = [self.model.active, *self.model.waiting, *self.model.cancelled.values()]
        return [c for c in everyone if c is not None and c.held]

    @invariant()
    def active_and_waiting_match(self) -> None:
        queue = probe.queue(self.state, QUEUE)
        assert queue is not None
        active = [c for c in queue.consumers.values() if c.status in ("up", "quiescing")]
        model = self.model.active
        assert [c.tag for c in active] == ([] if model is None else [model.cid.tag])
        if model is not None:
            assert (active[0].status == "quiescing") == model.quiescing
        assert [c.tag for c in queue.waiting] == [c.cid.tag for c in self.model.waiting]

    @invariant()
    def work_conserving(self) -> None:
        assert not self.model.can_deliver(), "the active consumer has credit and sits idle"


class SacV2AgainstModel(SacAgainstModel):
    """v2: consumer priorities, quiescing takeover."""

    version = 2


TestSacV1AgainstModel = SacAgainstModel.TestCase
TestSacV1AgainstModel.settings = fifo_settings(200, stateful_step_count=40)
TestSacV2AgainstModel = SacV2AgainstModel.TestCase
TestSacV2AgainstModel.settings = fifo_settings(200, stateful_step_count=40)
