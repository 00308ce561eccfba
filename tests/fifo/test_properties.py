"""Hypothesis stateful tests of each machine version against the reference model (model.py).

Rules: enqueue (with dedup resends and gaps), simple_prefetch and credited consumers (credit,
drain), settle/return/discard, cancel, connection and node downs, node up, purge, delivery limits,
and on v2 consumer timeouts, lock renewal and disconnected timeouts driven by `due_commands`.
After every step: the machine matches the model (which message is delivered next, ready, checked
out, total, consumers), it is work-conserving, and the fuzzer's invariants hold (messages total,
accounting, single active consumer, no double checkout, credit bounds, max length, order).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import fifo
from fifo.commands import (
    Cancel,
    Checkout,
    Command,
    ConnectionDown,
    ConnectionId,
    ConsumerDisconnectedTimeout,
    ConsumerId,
    ConsumerKey,
    Credit,
    Credited,
    DeclareQueue,
    Discard,
    Enqueue,
    EvalConsumerTimeouts,
    Modify,
    NodeDown,
    NodeUp,
    Purge,
    QueueConfig,
    RenewLocks,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import CreditReply, Deliver, Effect, Released
from fifo.fuzz import probe
from fifo.fuzz.invariants import Checker
from fifo.meta import Meta
from fifo.replies import CheckoutOk, Error, NotEnqueued, Ok, PurgeOk, Reply
from tests.fifo.model import QueueModel, fifo_settings

QUEUE = "q"
TAGS = ("c1", "c2", "c3")
CREDITED_TAG = "k1"
DISCONNECTED_TIMEOUT_MS = 200
SERIAL = 1 << 32
NODES = ("n1", "n2")
PUBLISHER = ConnectionId("n3", 1, 99)  # never goes down: enqueuer dedup state stays


class FifoAgainstModel(RuleBasedStateMachine):
    """One queue, competing simple_prefetch consumers on two nodes, a deduplicating publisher."""

    version = 1

    def __init__(self) -> None:
        super().__init__()
        self.state = fifo.init_state(self.version)
        self.model = QueueModel(self.version)
        self.checker = Checker()
        self.index = 0
        self.now_ms = 1_000
        self.connections = {node: ConnectionId(node, 1, n) for n, node in enumerate(NODES)}
        self.suspected: set[str] = set()
        self.bodies = 0

    @initialize(delivery_limit=st.sampled_from((None, None, 0, 1, 2)))
    def declare(self, delivery_limit: int | None) -> None:
        """The queue, with or without a delivery limit (no dead-letter target: dropped)."""
        self.model.delivery_limit = delivery_limit
        config = QueueConfig(delivery_limit=delivery_limit,
                             disconnected_timeout_ms=DISCONNECTED_TIMEOUT_MS)
        reply, _ = self.apply(DeclareQueue(QUEUE, config))
        assert not isinstance(reply, Error), reply

    def apply(self, command: Command, advance_ms: int = 7) -> tuple[Reply, list[Effect]]:
        """Apply to the machine, check the fuzzer invariants, feed deliveries to the model."""
        self.index += 1
        self.now_ms += advance_ms
        meta = Meta(self.index, 1, self.now_ms, self.version)
        peek = self.checker.before(self.state, command)
        reply, effects = fifo.apply(meta, command, self.state)
        assert self.checker.after(self.state, command, reply, effects, peek) == []
        self.model.deliver_batch([
            (ConsumerId(e.tag, e.connection), m.msg_id, m.body, m.redelivered, m.delivery_count)
            for e in effects if isinstance(e, Deliver) for m in e.messages
        ], self.now_ms)
        return reply, effects

    def body(self) -> bytes:
        self.bodies += 1
        return b"m%06d" % self.bodies

    def key_of(self, cid: ConsumerId) -> ConsumerKey:
        """The machine's key of a consumer the model knows (learnt from CheckoutOk)."""
        key = self.model.consumers[cid].key
        assert key is not None
        return key

    def cid(self, tag: str, node: str) -> ConsumerId:
        return ConsumerId(tag, self.connections[node])

    # --- rules -------------------------------------------------------------------------------

    @rule()
    def enqueue(self) -> None:
        body = self.body()
        self.model.enqueue(body)
        reply, _ = self.apply(Enqueue(QUEUE, body))
        assert isinstance(reply, Ok), reply

    @rule(enqueuer=st.sampled_from(("p1", "p2")), shift=st.sampled_from((0, 0, 0, -1, 1)))
    def enqueue_with_seq(self, enqueuer: str, shift: int) -> None:
        """In order, a resend (duplicate) or a gap; the model says which reply is due."""
        seq = max(1, self.model.enqueuer_next.get(enqueuer, 1) + shift)
        body = self.body()
        expected = self.model.enqueue(body, enqueuer, seq)
        reply, _ = self.apply(Enqueue(QUEUE, body, enqueuer, seq, PUBLISHER))
        assert isinstance(reply, NotEnqueued if expected == "gap" else Ok), (expected, reply)

    @rule(tag=st.sampled_from(TAGS), node=st.sampled_from(NODES), prefetch=st.integers(1, 5),
          timeout=st.sampled_from((None, 40, 100)))
    def checkout(self, tag: str, node: str, prefetch: int, timeout: int | None) -> None:
        if node in self.suspected:
            return  # a client on an unreachable node cannot attach
        timeout = timeout if self.version >= 2 else None
        cid = self.cid(tag, node)
        self.model.checkout(cid, prefetch, timeout)
        reply, _ = self.apply(Checkout(QUEUE, cid, SimplePrefetch(prefetch), timeout_ms=timeout))
        assert isinstance(reply, CheckoutOk), reply
        if cid in self.model.consumers:
            self.model.consumers[cid].key = reply.consumer_key

    @rule(node=st.sampled_from(NODES),
          initial=st.sampled_from((0, 5, SERIAL - 2)))
    def attach_credited(self, node: str, initial: int) -> None:
        """A credited consumer `k1` (at most one per node); it starts with no credit."""
        cid = self.cid(CREDITED_TAG, node)
        if node in self.suspected or cid in self.model.consumers:
            return
        self.model.attach_credited(cid, initial)
        reply, _ = self.apply(Checkout(QUEUE, cid, Credited(initial)))
        assert isinstance(reply, CheckoutOk) and reply.credit == 0, reply
        self.model.consumers[cid].key = reply.consumer_key

    @precondition(lambda self: any(c.credited for c in self.model.consumers.values()))
    @rule(data=st.data(), credit=st.integers(0, 6), lag=st.sampled_from((0, 0, 1, 3)),
          drain=st.booleans())
    def grant_credit(self, data: st.DataObject, credit: int, lag: int, drain: bool) -> None:
        """The receiver grants credit, maybe from a stale delivery count (messages in flight)."""
        consumer = data.draw(st.sampled_from(
            [c for c in self.model.consumers.values() if c.credited]))
        receiver_count = (consumer.delivery_count - lag) % SERIAL
        self.model.grant_credit(consumer.cid, credit, receiver_count)
        reply, effects = self.apply(Credit(QUEUE, consumer.cid, credit, receiver_count, drain))
        assert isinstance(reply, Ok), reply
        if drain and consumer.cid in self.model.consumers:
            self.model.drain(consumer.cid)
        flows = [e for e in effects if isinstance(e, CreditReply)]
        assert len(flows) == 1 and isinstance(effects[-1], CreditReply), effects
        expected = (consumer.delivery_count, consumer.credit)
        assert (flows[0].delivery_count, flows[0].credit) == expected, (flows[0], expected)

    @precondition(lambda self: self.model.checked_out_count() > 0)
    @rule(data=st.data(), outcome=st.sampled_from(
        ("settle", "settle", "return", "discard", "modify_return", "modify_failed", "modify_drop")))
    def settle(self, data: st.DataObject, outcome: str) -> None:
        holders = [c for c in self.model.consumers.values() if c.held]
        consumer = data.draw(st.sampled_from(holders))
        ids = data.draw(st.lists(st.sampled_from(sorted(consumer.held)), min_size=1, max_size=3))
        if outcome.startswith("modify") and self.version < 2:
            outcome = "return"  # v1 has no modify
        command: Command
        if outcome.startswith("modify"):
            command = Modify(QUEUE, consumer.cid, tuple(ids), outcome == "modify_failed",
                             outcome == "modify_drop", (("x-why", outcome),))
        elif outcome == "settle":
            command = Settle(QUEUE, consumer.cid, tuple(ids))
        elif outcome == "return":
            command = Return(QUEUE, consumer.cid, tuple(ids))
        else:
            command = Discard(QUEUE, consumer.cid, tuple(ids))
        self.model.settle(consumer.cid, tuple(ids), outcome)
        reply, _ = self.apply(command)
        assert isinstance(reply, Ok), reply

    @rule(tag=st.sampled_from(TAGS), node=st.sampled_from(NODES))
    def cancel(self, tag: str, node: str) -> None:
        cid = self.cid(tag, node)
        known = cid in self.model.consumers
        self.model.cancel(cid)
        reply, _ = self.apply(Checkout(QUEUE, cid, Cancel()))
        assert isinstance(reply, Error) != known, reply

    @rule(node=st.sampled_from(NODES), reason=st.sampled_from(("normal", "noconnection")))
    def connection_down(self, node: str, reason: str) -> None:
        conn = self.connections[node]
        self.model.connection_down(conn, reason, self.now_ms + 7)
        self.apply(ConnectionDown(conn, reason))  # type: ignore[arg-type]
        if reason == "normal":  # a closed connection never comes back; the client reconnects
            self.connections[node] = ConnectionId(node, 1, conn.number + 10)
        else:
            self.suspected.add(node)

    @rule(node=st.sampled_from(NODES))
    def node_down(self, node: str) -> None:
        """A lost node: like noconnection for every connection on it (v1 and v2 alike here)."""
        self.model.connection_down(self.connections[node], "noconnection", self.now_ms + 7)
        reply, _ = self.apply(NodeDown(node))
        assert not isinstance(reply, Error), reply
        self.suspected.add(node)

    @rule(node=st.sampled_from(NODES))
    def node_up(self, node: str) -> None:
        self.model.node_up(node)
        self.suspected.discard(node)
        reply, _ = self.apply(NodeUp(node))
        assert not isinstance(reply, Error), reply

    # --- v2 timers: the leader submits what due_commands says ---------------------------------

    @precondition(lambda self: self.version >= 2)
    @rule(advance=st.integers(0, 120))
    def tick(self, advance: int) -> None:
        """Time passes; due timers (lock expiry, disconnected timeout) match the model's."""
        self.now_ms += advance
        locked, away = self.model.due(self.now_ms, DISCONNECTED_TIMEOUT_MS)
        due = fifo.due_commands(self.state, self.now_ms)
        keys = {k for c in due if isinstance(c, EvalConsumerTimeouts) for k in c.consumer_keys}
        gone = {c.consumer_key for c in due if isinstance(c, ConsumerDisconnectedTimeout)}
        assert keys == {self.model.consumers[c].key for c in locked}, (due, locked)
        assert gone == {self.model.consumers[c].key for c in away}, (due, away)
        for cid in locked:
            key = self.key_of(cid)
            expired = self.model.time_out(cid, self.now_ms)
            _, effects = self.apply(EvalConsumerTimeouts(QUEUE, (key,)), 0)
            released = [e.msg_ids for e in effects if isinstance(e, Released)]
            assert released == [tuple(expired)], (released, expired)
        for cid in away:
            if cid in self.model.consumers:
                key = self.key_of(cid)
                self.model.disconnected_timeout(cid)
                reply, _ = self.apply(ConsumerDisconnectedTimeout(QUEUE, key), 0)
                assert isinstance(reply, Ok), reply
        assert fifo.due_commands(self.state, self.now_ms) == []

    @precondition(lambda self: self.version >= 2 and self.model.checked_out_count() > 0)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        """RenewLocks extends the named locks (and clears timed-out ids it names)."""
        consumer = data.draw(st.sampled_from(
            [c for c in self.model.consumers.values() if c.held]))
        ids = tuple(data.draw(st.lists(st.sampled_from(sorted(consumer.held)), min_size=1,
                                       max_size=2)))
        self.model.renew(consumer.cid, ids, self.now_ms + 7)
        reply, _ = self.apply(RenewLocks(QUEUE, consumer.cid, ids))
        assert isinstance(reply, Ok), reply

    @precondition(lambda self: any(c.timed_out for c in self.model.consumers.values()))
    @rule(data=st.data(), outcome=st.sampled_from(("settle", "return")))
    def answer_timed_out(self, data: st.DataObject, outcome: str) -> None:
        """A late settle (or return) of timed-out ids: they are gone, but the consumer revives."""
        consumer = data.draw(st.sampled_from(
            [c for c in self.model.consumers.values() if c.timed_out]))
        ids = tuple(sorted(consumer.timed_out))
        self.model.settle(consumer.cid, ids, outcome)
        command: Command = (Settle if outcome == "settle" else Return)(QUEUE, consumer.cid, ids)
        reply, _ = self.apply(command)
        assert isinstance(reply, Ok), reply

    @rule()
    def purge(self) -> None:
        count = self.model.purge()
        reply, _ = self.apply(Purge(QUEUE))
        assert isinstance(reply, PurgeOk) and reply.count == count, (reply, count)

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def machine_matches_model(self) -> None:
        queue = probe.queue(self.state, QUEUE)
        assert queue is not None
        held = sum(1 for _ in probe.checked_out(queue))
        assert (probe.ready_count(queue), held, queue.messages_total) == (
            self.model.ready_count(), self.model.checked_out_count(), self.model.total()
        )
        tags = sorted(c.tag for c in queue.consumers.values())
        assert tags == sorted(c.cid.tag for c in self.model.consumers.values())

    @invariant()
    def work_conserving(self) -> None:
        """No up consumer with credit sits idle while a message is ready."""
        assert not self.model.can_deliver(), "a ready message was not delivered"

    @invariant()
    def overview_agrees(self) -> None:
        overview = fifo.overview(self.state, QUEUE)
        assert overview is not None
        assert overview.total == self.model.total()
        assert overview.checked_out == self.model.checked_out_count()


class FifoV2AgainstModel(FifoAgainstModel):
    """The same rules on machine version 2 (noconnection keeps messages, suspects the consumer)."""

    version = 2


TestFifoV1AgainstModel = FifoAgainstModel.TestCase
TestFifoV1AgainstModel.settings = fifo_settings(250, stateful_step_count=50)
TestFifoV2AgainstModel = FifoV2AgainstModel.TestCase
TestFifoV2AgainstModel.settings = fifo_settings(250, stateful_step_count=50)
