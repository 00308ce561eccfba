"""The fuzzer's client-side view: live connections, consumers, enqueuers and pending deliveries.

It is what a set of well-behaved (and a few badly behaved) clients would know, learnt only from
replies and effects, and it is what the generator draws the next command from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fifo.commands import (
    BindExchange,
    BindQueue,
    Cancel,
    Checkout,
    Command,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    Credited,
    DeclareExchange,
    DeclareGroupedQueue,
    DeclarePartitionedQueue,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    Dequeue,
    Enqueue,
    GroupConfig,
    JoinGroup,
    LeaveGroup,
    NodeDown,
    NodeUp,
    QueueConfig,
    Remove,
    SimplePrefetch,
    UnbindExchange,
    UnbindQueue,
    UpdateConfig,
)
from fifo.effects import CreditReply, Deliver, Effect
from fifo.replies import (
    CancelOk,
    CheckoutOk,
    DeclareOk,
    DeleteOk,
    DequeueOk,
    JoinGroupOk,
    Ok,
    Reply,
)

NODES = ("n1", "n2", "n3")
WORK_QUEUES = ("q0", "q1")
DEAD_LETTER_QUEUE = "dlx"
SERIAL_MASK = (1 << 32) - 1
_EXCHANGE_COMMANDS = (DeclareExchange, DeleteExchange, BindQueue, BindExchange, UnbindQueue,
                      UnbindExchange)  # fmt: skip


@dataclass
class ConsumerSlot:
    """One consumer as its client knows it."""

    queue: str
    cid: ConsumerId
    credited: bool
    prefetch: int
    key: ConsumerKey | None = None
    delivery_count: int = 0  # the receiver's serial-number delivery count (credited)
    cancelled: bool = False


@dataclass
class EnqueuerSlot:
    """One publisher with dedup sequence numbers, bound to a connection."""

    queue: str
    name: str
    connection: ConnectionId
    next_seq: int = 1


@dataclass(frozen=True, slots=True)
class Pending:
    """A delivered message the client still has to settle, return, discard or modify."""

    queue: str
    cid: ConsumerId
    msg_id: int


@dataclass
class MemberSlot:
    """A consumer-group member as its client knows it (v3)."""

    group: str
    queue: str  # the partitioned queue
    member: str
    cid: ConsumerId
    epoch: int


@dataclass
class World:
    """Everything the generator needs to produce plausible commands."""

    version: int
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    groups: dict[str, GroupConfig] = field(default_factory=dict)  # v3: grouped queues
    connections: list[ConnectionId] = field(default_factory=list)
    nodes_down: list[str] = field(default_factory=list)
    consumers: dict[ConsumerId, ConsumerSlot] = field(default_factory=dict)
    enqueuers: dict[str, EnqueuerSlot] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    counter: int = 0  # names and message bodies
    partitioned: dict[str, int] = field(default_factory=dict)  # v3: partitioned queues
    members: list[MemberSlot] = field(default_factory=list)  # v3: consumer-group members
    exchanges: dict[str, str] = field(default_factory=dict)  # v4: declared, name -> type
    bindings: list[BindQueue | BindExchange] = field(default_factory=list)  # v4: made

    def fresh(self) -> int:
        """A new number for names and bodies, increasing over the run."""
        self.counter += 1
        return self.counter

    def new_connection(self, node: str) -> ConnectionId:
        """Open a connection on `node`."""
        conn = ConnectionId(node, 1, self.fresh())
        self.connections.append(conn)
        return conn

    def slots_of(self, queue: str) -> list[ConsumerSlot]:
        """Consumers of a queue, in attach order."""
        return [slot for slot in self.consumers.values() if slot.queue == queue]

    def observe(self, command: Command, reply: Reply, effects: list[Effect]) -> None:
        """Learn from one applied command: keys, deliveries, queues and connections."""
        self._observe_command(command, reply)
        for effect in effects:
            if isinstance(effect, Deliver):
                self._observe_deliver(effect)
            elif isinstance(effect, CreditReply):
                slot = self.consumers.get(ConsumerId(effect.tag, effect.connection))
                if slot is not None:
                    slot.delivery_count = effect.delivery_count

    def _observe_deliver(self, effect: Deliver) -> None:
        cid = ConsumerId(effect.tag, effect.connection)
        slot = self.consumers.get(cid)
        if slot is not None:
            slot.key = effect.consumer_key
            slot.delivery_count = (slot.delivery_count + len(effect.messages)) & SERIAL_MASK
        for message in effect.messages:
            self.pending.append(Pending(effect.queue, cid, message.msg_id))

    def _observe_command(self, command: Command, reply: Reply) -> None:
        if isinstance(command, DeclarePartitionedQueue) and isinstance(reply, DeclareOk):
            self.partitioned[command.queue] = command.partitions
            for index in range(command.partitions):
                self.queues[f"{command.queue}.{index}"] = command.config
        elif isinstance(command, JoinGroup) and isinstance(reply, JoinGroupOk):
            slot = MemberSlot(command.group, command.queue, command.member, command.consumer,
                              reply.epoch)  # fmt: skip
            if all(m.member != slot.member or m.group != slot.group for m in self.members):
                self.members.append(slot)
        elif isinstance(command, LeaveGroup) and isinstance(reply, Ok):
            self.members = [m for m in self.members
                            if (m.group, m.member) != (command.group, command.member)]  # fmt: skip
        elif isinstance(command, DeclareQueue) and isinstance(reply, DeclareOk):
            self.queues[command.queue] = command.config
            if isinstance(command, DeclareGroupedQueue):
                self.groups[command.queue] = command.groups
        elif isinstance(command, UpdateConfig) and command.queue in self.queues:
            if isinstance(reply, Ok):
                self.queues[command.queue] = command.config
        elif isinstance(command, DeleteQueue) and isinstance(reply, DeleteOk):
            self._forget_queue(command.queue)
        elif isinstance(command, Checkout):
            self._observe_checkout(command, reply)
        elif isinstance(command, ConnectionDown) and command.reason == "normal":
            self._forget_connection(command.connection)
        elif isinstance(command, NodeDown) and command.node not in self.nodes_down:
            self.nodes_down.append(command.node)
        elif isinstance(command, NodeUp) and command.node in self.nodes_down:
            self.nodes_down.remove(command.node)
        elif isinstance(command, Enqueue):
            self._observe_enqueue(command, reply)
        elif isinstance(command, _EXCHANGE_COMMANDS) and isinstance(reply, Ok | DeclareOk):
            self._observe_exchange(command, reply)

    def _observe_exchange(self, command: Command, reply: Ok | DeclareOk) -> None:
        """v4: learn declared and deleted exchanges, and the bindings made and removed."""
        if isinstance(command, DeclareExchange) and isinstance(reply, DeclareOk) and reply.created:
            self.exchanges[command.exchange] = command.exchange_type
        elif isinstance(command, DeleteExchange):
            self.exchanges.pop(command.exchange, None)
        elif isinstance(command, BindQueue | BindExchange) and command not in self.bindings:
            self.bindings.append(command)
        elif isinstance(command, UnbindQueue | UnbindExchange):
            made = (BindQueue if isinstance(command, UnbindQueue) else BindExchange)(
                *(getattr(command, name) for name in command.__dataclass_fields__)
            )
            self.bindings = [b for b in self.bindings if b != made]

    def _observe_enqueue(self, command: Enqueue, reply: Reply) -> None:
        slot = self.enqueuers.get(command.enqueuer or "")
        if slot is None or command.seq is None or not isinstance(reply, Ok):
            return
        if command.seq == slot.next_seq:
            slot.next_seq += 1

    def _observe_checkout(self, command: Checkout, reply: Reply) -> None:
        spec = command.spec
        if isinstance(spec, Dequeue):
            if isinstance(reply, DequeueOk) and reply.message is not None and not spec.settled:
                self.pending.append(Pending(command.queue, command.consumer, reply.message.msg_id))
            return
        slot = self.consumers.get(command.consumer)
        if isinstance(spec, SimplePrefetch | Credited) and isinstance(reply, CheckoutOk):
            if slot is None or slot.queue != command.queue:
                slot = ConsumerSlot(command.queue, command.consumer, False, 0)
                self.consumers[command.consumer] = slot
            slot.credited = isinstance(spec, Credited)
            slot.prefetch = spec.prefetch if isinstance(spec, SimplePrefetch) else 0
            if isinstance(spec, Credited) and slot.key is None:
                slot.delivery_count = spec.initial_delivery_count
            slot.key = reply.consumer_key
            slot.cancelled = False
        elif isinstance(spec, Cancel) and slot is not None and isinstance(reply, CancelOk):
            slot.cancelled = True
        elif isinstance(spec, Remove) and slot is not None and isinstance(reply, CancelOk):
            self._forget_consumer(command.consumer)

    def _forget_consumer(self, cid: ConsumerId) -> None:
        self.consumers.pop(cid, None)
        self.pending = [p for p in self.pending if p.cid != cid]

    def _forget_queue(self, queue: str) -> None:
        count = self.partitioned.pop(queue, None)
        if count is not None:  # v3: a partitioned queue goes with its partitions and groups
            self.members = [m for m in self.members if m.queue != queue]
            for index in range(count):
                self._forget_queue(f"{queue}.{index}")
        self.queues.pop(queue, None)
        self.groups.pop(queue, None)
        for cid in [s.cid for s in self.consumers.values() if s.queue == queue]:
            self.consumers.pop(cid)
        self.pending = [p for p in self.pending if p.queue != queue]
        for name in [e.name for e in self.enqueuers.values() if e.queue == queue]:
            self.enqueuers.pop(name)

    def _forget_connection(self, conn: ConnectionId) -> None:
        self.members = [m for m in self.members if m.cid.connection != conn]
        if conn in self.connections:
            self.connections.remove(conn)
        for cid in [s.cid for s in self.consumers.values() if s.cid.connection == conn]:
            self._forget_consumer(cid)
        for name in [e.name for e in self.enqueuers.values() if e.connection == conn]:
            self.enqueuers.pop(name)
