"""The chaos runner's queue workload in miniature: producers with confirms, consumers that
dequeue (basic.get, unsettled) and ack, each client attached to one node through its session
layer (`raft.sim.session`), now and then reconnecting (its old session closes, which submits
a ConnectionDown once; what it held unacked goes back to the queue), and a final drain.

Every operation is recorded as a history event `(time, client, type, f, value, redelivered)`
with type invoke | ok | fail | info (info: the outcome is unknown: the node crashed, the
proposal failed over, or no reply came within CLIENT_TIMEOUT_S).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fifo.commands import (
    Checkout,
    ConnectionId,
    ConsumerId,
    Dequeue,
    Enqueue,
    Settle,
)
from fifo.replies import DequeueOk, NotEnqueued, Ok
from raft.errors import SubmitError
from raft.replicated import InternalFailure
from raft.sim.clock import Scheduler
from raft.sim.cluster import SimCluster, SimNode

QUEUE = "sim"
CLIENT_TIMEOUT_S = 3.0
HEALED_SETTLE_S = 1.0  # after the final heal: time for an election and the restarted to rejoin
OP_GAP_S = (0.01, 0.12)  # pause between a client's operations
WORK_S = (0.0, 0.4)  # a consumer works on a message this long before it acks it
DRAIN_STEPS_MAX = 20_000
RECONNECT_RATE = 0.02  # chance that an idle client closes its connection and opens a new one
CONNECTION_NUMBER_STRIDE = 1000  # a client's n-th connection is number + n * stride

Event = tuple[float, str, str, str, str, bool]


@dataclass
class _Pending:
    op_id: int
    f: str
    value: str
    started: float


class Client:
    """One producer or consumer bound to a node; one operation in flight at a time."""

    def __init__(self, name: str, node_id: str, producer: bool, number: int) -> None:
        self.name = name
        self.node_id = node_id
        self.producer = producer
        self.number = number
        self.incarnation = 0
        self.pending: _Pending | None = None
        self.next_at = 0.0
        self.sent = 0
        self.ops = 0
        self.seq = 1  # publisher dedup: the machine stores each (enqueuer, seq) once
        self.retry: str | None = None  # a publish whose outcome is unknown, sent again
        self.ack_due: tuple[float, Any, int, str] | None = None  # at, consumer key, id, value
        self.attached: tuple[int, int] | None = None  # (incarnation, number) of its session
        self.reconnect_due = False  # its last operation timed out: it reconnects first

    def connection(self) -> ConnectionId:
        """This client's connection to its node's current incarnation."""
        return ConnectionId(self.node_id, self.incarnation, self.number)


class Workload:
    """Drives the clients on the virtual clock and records the history."""

    def __init__(
        self, cluster: SimCluster, scheduler: Scheduler, rng: random.Random, clients: int
    ) -> None:
        self.cluster = cluster
        self.scheduler = scheduler
        self.rng = rng
        self.history: list[Event] = []
        self.apply_failures: list[str] = []
        self.confirms: list[tuple[float, int]] = []  # (time, log index) of each confirmed publish
        node_ids = sorted(cluster.nodes)
        # a third of the clients publish, the rest consume, round-robin over the nodes: with 6
        # clients on 3 nodes one node serves two consumers, whose connections a restart of it
        # closes in one hello (in an order every replica must agree on)
        producers = max(1, clients // 3)
        self.clients = [
            Client(f"c{i}", node_ids[i % len(node_ids)], i < producers, 100 + i)
            for i in range(clients)
        ]
        for client in self.clients:
            client.next_at = self.rng.uniform(0.0, 1.0)  # not all at once
        self._op_ids = 0
        self.active = True
        # liveness on a healed cluster: set by the run at the final heal; an operation started
        # HEALED_SETTLE_S after it that gets no reply within CLIENT_TIMEOUT_S is a violation
        self.healed_at: float | None = None
        self.stalls: list[str] = []

    def record(self, client: str, kind: str, f: str, value: str, redelivered: bool = False) -> None:
        """Append one history event at the current virtual time."""
        self.history.append((round(self.scheduler.now, 6), client, kind, f, value, redelivered))

    def step(self) -> None:
        """Time out stale operations; start the next operation of every idle client."""
        now = self.scheduler.now
        order = list(self.clients)
        self.rng.shuffle(order)  # clients are concurrent: who goes first varies
        for client in order:
            self._give_up_if_stale(client, now)
            node = self.cluster.nodes[client.node_id]
            if client.incarnation != node.incarnation and client.pending is not None:
                pending = client.pending
                self._finish(client, pending.op_id, "info", pending.f, pending.value)
            if not self.active or client.pending is not None or now < client.next_at:
                continue
            if node.replica is None:
                continue
            reconnect = client.reconnect_due or self.rng.random() < RECONNECT_RATE
            if client.attached is not None and reconnect:
                self._reconnect(client, node)  # a consumer may hold a message it did not ack
            if client.ack_due is not None:
                self._ack_when_due(client, node)
                continue
            self._attach(client, node)
            if client.producer:
                self._publish(client, node)
            else:
                self._dequeue(client, node)

    def give_up_stale(self) -> None:
        """Time out stale operations only (after the clients stopped: no new operation)."""
        for client in self.clients:
            self._give_up_if_stale(client, self.scheduler.now)

    def pending(self) -> int:
        """Client operations still waiting for their reply."""
        return sum(1 for client in self.clients if client.pending is not None)

    def _give_up_if_stale(self, client: Client, now: float) -> None:
        pending = client.pending
        if pending is not None and now - pending.started > CLIENT_TIMEOUT_S:
            healed = self.healed_at
            if healed is not None and pending.started >= healed + HEALED_SETTLE_S:
                self.stalls.append(
                    f"{client.name} {pending.f} {pending.value!r} sent at {pending.started:.2f} "
                    f"via {client.node_id}, {pending.started - healed:.2f} s after the heal: "
                    f"no reply in {CLIENT_TIMEOUT_S:g} s"
                )
            self._finish(client, pending.op_id, "info", pending.f, pending.value)
            # a late reply is ignored: the publish (if it was one) goes again, same seq;
            # a client whose node stopped answering reconnects, as the client library does
            client.reconnect_due = True

    def _attach(self, client: Client, node: SimNode) -> None:
        """Open a session for the client on its node's current incarnation, if it has none."""
        client.incarnation = node.incarnation
        if client.attached != (node.incarnation, client.number):
            assert node.sessions is not None
            node.sessions.open(client.connection())
            client.attached = (node.incarnation, client.number)

    def _reconnect(self, client: Client, node: SimNode) -> None:
        """The client closes its connection (its session submits ConnectionDown once) and will
        use a new one; an ack it still owed is dropped: the message goes back to the queue."""
        self._close_session(client, node)
        client.number += CONNECTION_NUMBER_STRIDE
        client.reconnect_due = False
        client.ack_due = None
        self.record(client.name, "reconnect", "reconnect", str(client.number))

    def _close_session(self, client: Client, node: SimNode) -> None:
        if node.sessions is not None and client.attached == (node.incarnation, client.number):
            node.loop.run_now(node.sessions.close, client.connection())  # type: ignore[union-attr]
        client.attached = None

    def _start(self, client: Client, f: str, value: str) -> int:
        self._op_ids += 1
        client.pending = _Pending(self._op_ids, f, value, self.scheduler.now)
        client.ops += 1
        self.record(client.name, "invoke", f, value)
        return self._op_ids

    def _finish(
        self, client: Client, op_id: int, kind: str, f: str, value: str, redelivered: bool = False
    ) -> bool:
        if client.pending is None or client.pending.op_id != op_id:
            return False  # a late reply to an operation already given up
        client.pending = None
        client.next_at = self.scheduler.now + self.rng.uniform(*OP_GAP_S)
        self.record(client.name, kind, f, value, redelivered)
        return True

    def _propose(self, node: SimNode, command: Any, on_reply: Callable[[Any], None]) -> None:
        assert node.replica is not None and node.loop is not None
        node.loop.run_now(node.replica.propose, command, on_reply)

    def _outcome_kind(self, reply: Any) -> str:
        if isinstance(reply, SubmitError):
            return "info"
        if isinstance(reply, InternalFailure):
            self.apply_failures.append(reply.message)
            return "fail"
        return "ok" if isinstance(reply, (Ok, DequeueOk)) else "fail"

    def _publish(self, client: Client, node: SimNode) -> None:
        """Publish with dedup, as the client library does: a publish whose outcome is unknown
        goes again with the same sequence number until it is confirmed or refused."""
        if client.retry is None:
            client.sent += 1
            client.retry = f"{client.name}-{client.sent}"
        value, seq = client.retry, client.seq
        op_id = self._start(client, "enqueue", value)
        command = Enqueue(QUEUE, value.encode(), client.name, seq, client.connection())

        def on_reply(reply: Any) -> None:
            kind = self._outcome_kind(reply)
            if not self._finish(client, op_id, kind, "enqueue", value):
                return
            if kind == "ok":
                client.seq, client.retry = seq + 1, None
                self.confirms.append((self.scheduler.now, node.applied_index))
            elif kind == "fail":
                client.retry = None  # refused: nothing stored, the next value takes this seq
                if isinstance(reply, NotEnqueued):
                    client.seq = reply.expected_seq

        self._propose(node, command, on_reply)

    def _dequeue(self, client: Client, node: SimNode) -> None:
        client.sent += 1
        tag = f"{client.name}-{client.sent}"
        op_id = self._start(client, "dequeue", "")
        consumer = ConsumerId(tag, client.connection())
        command = Checkout(QUEUE, consumer, Dequeue(settled=False))

        def on_reply(reply: Any) -> None:
            kind = self._outcome_kind(reply)
            message = reply.message if isinstance(reply, DequeueOk) else None
            if message is None:
                self._finish(client, op_id, kind, "dequeue", "")
                return
            value = bytes(message.body).decode()
            redelivered = bool(message.redelivered or message.delivery_count)
            if self._finish(client, op_id, "ok", "dequeue", value, redelivered):
                due = self.scheduler.now + self.rng.uniform(*WORK_S)
                client.ack_due = (due, reply.consumer_key, message.msg_id, value)

        self._propose(node, command, on_reply)

    def _ack_when_due(self, client: Client, node: SimNode) -> None:
        """Ack the message the consumer worked on, once its work is done."""
        assert client.ack_due is not None
        due, key, msg_id, value = client.ack_due
        if self.scheduler.now >= due:
            client.ack_due = None
            self._ack(client, node, key, msg_id, value)

    def _ack(self, client: Client, node: SimNode, key: Any, msg_id: int, value: str) -> None:
        op_id = self._start(client, "ack", value)
        command = Settle(QUEUE, key, (msg_id,))

        def on_reply(reply: Any) -> None:
            self._finish(client, op_id, self._outcome_kind(reply), "ack", value)

        if node.replica is None or node.incarnation != client.incarnation:
            self._finish(client, op_id, "fail", "ack", value)  # its connection died with it
            return
        self._propose(node, command, on_reply)

    # --- the end of a run ----------------------------------------------------------------------

    def close_connections(self) -> None:
        """Every client disconnects (its session submits ConnectionDown normal, as the node
        does when a client's socket closes): what they held unsettled goes back to the queue."""
        self.active = False
        for client in self.clients:
            self._close_session(client, self.cluster.nodes[client.node_id])

    def drain_step(self, node: SimNode, number: int) -> dict[str, Any]:
        """Propose one settled dequeue on `node` for the drainer; its reply lands in the
        returned dict under "reply" (a message taken is recorded as drained)."""
        state: dict[str, Any] = {}

        def on_reply(reply: Any) -> None:
            state["reply"] = reply
            if isinstance(reply, DequeueOk) and reply.message is not None:
                message = reply.message
                again = bool(message.redelivered or message.delivery_count)
                self.record("drain", "ok", "drain", bytes(message.body).decode(), again)

        connection = ConnectionId(node.node_id, node.incarnation, 10_000 + number)
        command = Checkout(QUEUE, ConsumerId(f"drain-{number}", connection), Dequeue(True))
        self._propose(node, command, on_reply)
        return state
