"""Invariants checked after every step of a fuzz run (rabbit_fifo_prop_SUITE's, plus accounting).

A `Checker` peeks at the state before each command (what a settle will remove, whether an enqueue
is fresh) and, after it, checks the state, the reply and the effects against its own ledger.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field

from fifo.commands import (
    UNBOUND_SETTLES,
    AnnotatedEnqueue,
    Checkout,
    Command,
    ConsumerId,
    Credit,
    DeclarePartitionedQueue,
    DeclareQueue,
    DeleteQueue,
    Dequeue,
    Discard,
    Enqueue,
    Modify,
    PurgeGroup,
    RegisterEnqueuer,
    RenewLocks,
    Return,
    Settle,
)
from fifo.effects import CreditReply, DeadLettered, Deliver, Effect, QueueStatus
from fifo.fuzz import probe
from fifo.fuzz.generator import body_number
from fifo.replies import (
    DeclareOk,
    DeleteOk,
    DequeueOk,
    Error,
    NotEnqueued,
    Ok,
    PurgeOk,
    RejectPublish,
    Reply,
    Routed,
)
from fifo.state import GroupId, Message, RefMessage, State
from fifo.v3.sticky import moves, moves_lower_bound

Found = tuple[str, str]  # (invariant, detail)
_NAMING_IDS = (Settle, Return, Discard, Modify, RenewLocks)


@dataclass(slots=True)
class Peek:
    """What the state said just before a command was applied."""

    settled_held: int = 0  # ids named by a Settle that the consumer really held
    enqueue_expected_seq: int | None = None  # the machine's next seq for the enqueuer
    total_before: int | None = None
    ready_before: int | None = None
    sender_delivery_count: int | None = None  # a credited consumer's, before a Credit
    # v3, a publish to a partitioned queue's base: each partition's total before it
    partition_totals: dict[str, int] | None = None
    # v4, a bound settle, return, discard, modify or renew naming a known consumer: whether
    # it comes from that consumer's own connection
    from_owner: bool | None = None


@dataclass
class Ledger:
    """Per-queue message accounting: enqueued in == total + everything that left."""

    inflow: int = 0
    outflow: int = 0
    disturbed: bool = False  # dead-lettered messages came in: enqueue order no longer applies


@dataclass
class Checker:
    """Holds the ledgers and last delivered numbers; `after` returns the failed invariants."""

    ledgers: dict[str, Ledger] = field(default_factory=dict)
    last_number: dict[tuple[str, ConsumerId], int] = field(default_factory=dict)
    last_first_delivery: dict[str, int] = field(default_factory=dict)  # per queue
    blocked: dict[tuple[str, str], bool] = field(default_factory=dict)  # told reject_publish
    deliveries: int = 0
    # v3 message groups: the group each enqueued body number went to, the last first delivery
    # per group, and the owners of groups after the last step (exclusive groups must not move)
    group_of_number: dict[tuple[str, int], GroupId] = field(default_factory=dict)
    last_in_group: dict[tuple[str, GroupId], int] = field(default_factory=dict)
    owners: dict[tuple[str, GroupId], object] = field(default_factory=dict)
    # v3 consumer groups: each group's target after the last step (for the minimal-moves check)
    group_targets: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    # v3 routing: the partition each key went to, and keyless messages per partition
    key_partition: dict[tuple[str, str], str] = field(default_factory=dict)
    round_robin: dict[str, dict[str, int]] = field(default_factory=dict)

    def ledger(self, queue: str) -> Ledger:
        """The ledger of a queue, created on first use."""
        return self.ledgers.setdefault(queue, Ledger())

    def before(self, state: State, command: Command) -> Peek:
        """Peek at what the command is about to touch."""
        peek = Peek()
        name = getattr(command, "queue", None)
        if isinstance(command, Enqueue) and isinstance(name, str) and name in state.partitioned:
            peek.partition_totals = probe.partition_totals(state, name)
            if isinstance(command.enqueuer, str):
                peek.enqueue_expected_seq = probe.routed_next_seq(state, name, command.enqueuer)
            return peek
        queue = probe.queue(state, name) if isinstance(name, str) else None
        if queue is None:
            return peek
        peek.total_before = queue.messages_total
        peek.ready_before = probe.ready_count(queue)
        if type(command) in UNBOUND_SETTLES:
            holder = probe.find_consumer(queue, command.consumer_key)  # type: ignore[union-attr]
            if holder is not None:
                peek.from_owner = holder.connection == command.connection  # type: ignore[union-attr]
        if isinstance(command, Settle):
            consumer = probe.find_consumer(queue, command.consumer_key)
            if consumer is not None and isinstance(command.msg_ids, tuple):
                ids = {i for i in command.msg_ids if isinstance(i, int)}
                peek.settled_held = sum(1 for i in ids if i in consumer.checked_out)
        elif isinstance(command, Credit):
            consumer = probe.find_consumer(queue, command.consumer_key)
            # a cancelled consumer gets no new credit (the machine answers 0): not checked
            if consumer is not None and consumer.credited and consumer.status != "cancelled":
                peek.sender_delivery_count = consumer.delivery_count
        elif isinstance(command, PurgeGroup) and queue.grouping is not None:
            group = queue.grouping.groups.get(command.group)
            peek.ready_before = 0 if group is None else len(group.returns) + len(group.ready)
        if isinstance(command, Enqueue) and isinstance(command.enqueuer, str):
            expected = probe.enqueuer_next_seq(queue, command.enqueuer)
            peek.enqueue_expected_seq = 1 if expected is None else expected
        if isinstance(command, Enqueue) and queue.grouping is not None:
            number = body_number(command.body) if isinstance(command.body, bytes) else None
            if number is not None:
                anns = command.annotations if isinstance(command, AnnotatedEnqueue) else ()
                self.group_of_number[(queue.name, number)] = _group_of(
                    queue.grouping.config.group_key, anns
                )
        return peek

    def after(
        self, state: State, command: Command, reply: Reply, effects: list[Effect], peek: Peek
    ) -> list[Found]:
        """Update the ledgers from the reply and effects, then check every invariant."""
        found: list[Found] = []
        if peek.partition_totals is not None:
            found += self._check_routed(state, command, reply, effects, peek)
        elif not isinstance(reply, Error):
            found += self._account(command, reply, peek)
        found += self._account_effects(state, command, effects)
        found += self._check_queue_order(state, command, reply, effects)
        if isinstance(command, Credit) and not isinstance(reply, Error):
            found += check_credit_reply(command, effects, peek)
        if isinstance(command, RenewLocks) and not isinstance(reply, Error):
            found += _check_renewed(state, command)
        if isinstance(command, _NAMING_IDS) and not isinstance(reply, Error):
            found += _check_untimed_out(state, command)
        if peek.from_owner is not None:
            found += _check_owner_rule(state, command, reply, effects, peek)
        if isinstance(command, RegisterEnqueuer) and isinstance(reply, RejectPublish):
            self.blocked[(command.queue, command.enqueuer)] = True  # told by the reply
        found += check_state(state, self.ledgers)
        found += self._check_groups_stay(state)
        if state.consumer_groups or self.group_targets:
            found += self._check_consumer_groups(state)
        return found

    def _check_consumer_groups(self, state: State) -> list[Found]:
        """v3 consumer groups after every step: at most one member holds messages of a
        partition and it is the partition's holder; with members, every partition is targeted
        at a live member; targets balanced; holders balanced once no hand-over is pending; a
        rebalance moves no more than the balanced lower bound."""
        found: list[Found] = []
        targets: dict[str, dict[str, tuple[str, ...]]] = {}
        for name, group in state.consumer_groups.items():
            found += check_consumer_group(state, group)
            before = self.group_targets.get(name, {})
            assignment = group.assignment()
            targets[name] = assignment
            if assignment != before and before:
                bound = moves_lower_bound(group.partitions, list(group.members), before)
                if moves(before, assignment) != bound:
                    found.append(("cgroup_moves", f"{name}: {moves(before, assignment)} moves, "
                                  f"the balanced minimum is {bound}"))  # fmt: skip
        self.group_targets = targets
        return found

    def _check_groups_stay(self, state: State) -> list[Found]:
        """Exclusive groups never move while their owner lives and holds messages of them."""
        found: list[Found] = []
        owners: dict[tuple[str, GroupId], object] = {}
        for queue in probe.queues(state):
            grouping = queue.grouping
            if grouping is None or grouping.config.policy != "exclusive":
                continue
            if queue.config.single_active_consumer:
                continue  # groups are moot with a single active consumer
            for group in grouping.groups.values():
                key = (queue.name, group.gid)
                before = self.owners.get(key)
                if group.checked_out:
                    owners[key] = group.owner
                if before is None or group.owner == before:
                    continue
                holder = queue.consumers.get(before)  # type: ignore[call-overload]
                if holder is not None and _sticky(holder) and any(
                        m.group == group.gid for m in holder.checked_out.values()):  # fmt: skip
                    found.append(
                        (
                            "group_moved",
                            f"{queue.name}: group {group.gid!r} moved from "
                            f"{holder.tag} (up, holding messages of it) to {group.owner}",
                        )
                    )
        self.owners = owners
        return found

    def _check_routed(
        self, state: State, command: Command, reply: Reply, effects: list[Effect], peek: Peek
    ) -> list[Found]:
        """v3, a publish to a partitioned queue's base: exactly one partition stored it when it
        was fresh (none for a duplicate, a gap or an error); a keyed message went to
        crc32(key) mod partitions, always the same for a key; keyless messages are spread round
        robin (per partition counts differ by at most one, counted afresh after messages were
        dead-lettered into the partitioned queue, which take their turns too)."""
        assert isinstance(command, Enqueue) and peek.partition_totals is not None
        base, totals = command.queue, peek.partition_totals
        stored: dict[str, int] = {}
        for partition, before in totals.items():
            q = probe.queue(state, partition)
            count = (q.messages_total if q is not None else 0) - before
            for effect in effects:
                if isinstance(effect, DeadLettered):
                    count += effect.count if effect.queue == partition else 0
                    count -= effect.count if effect.target == partition else 0
            if count:
                stored[partition] = count
        expected, seq = peek.enqueue_expected_seq, command.seq
        fresh = isinstance(reply, Ok) and (expected is None or seq is None or seq == expected)
        if isinstance(reply, NotEnqueued) and (expected is None or reply.expected_seq != expected):
            return [("partition_dedup", f"{base}: seq {seq} got {reply!r}, next is {expected}")]
        if not fresh:
            if stored:
                return [("partition_dedup", f"{base}: {reply!r} to seq {seq} (next {expected}) "
                         f"but partitions stored {stored}")]  # fmt: skip
            return []
        if list(stored.values()) != [1]:
            return [("partition_route", f"{base}: a publish stored {stored} (one partition must "
                     "store it once)")]  # fmt: skip
        (partition,) = stored
        self.ledger(partition).inflow += 1
        anns = command.annotations if isinstance(command, AnnotatedEnqueue) else ()
        key = _group_of("x-group-id", anns)
        if key is not None:
            want = f"{base}.{binascii.crc32(key.encode('utf-8', 'surrogatepass')) % len(totals)}"
            known = self.key_partition.setdefault((base, key), partition)
            if partition != want or known != partition:
                return [("partition_route", f"{base}: key {key!r} went to {partition}, "
                         f"crc32 says {want}, earlier {known}")]  # fmt: skip
            return []
        spread = self.round_robin.setdefault(base, dict.fromkeys(totals, 0))
        spread[partition] += 1
        if max(spread.values()) - min(spread.values()) > 1:
            return [("partition_round_robin", f"{base}: keyless messages per partition {spread}")]
        return []

    def _forget_partitioned(self, base: str) -> None:
        """A partitioned queue was created or deleted: its routing history starts over."""
        self.round_robin.pop(base, None)
        for key in [k for k in self.key_partition if k[0] == base]:
            del self.key_partition[key]
        prefix = base + "."
        for name in [n for n in self.ledgers if n.startswith(prefix) and n[len(prefix):].isdigit()]:
            del self.ledgers[name]
        for key in [k for k in self.blocked if k[0].startswith(prefix)]:
            del self.blocked[key]

    def _account(self, command: Command, reply: Reply, peek: Peek) -> list[Found]:
        found: list[Found] = []
        if isinstance(command, DeclarePartitionedQueue):
            if isinstance(reply, DeclareOk) and reply.created:
                self._forget_partitioned(command.queue)
        elif isinstance(command, DeclareQueue) and command.queue not in self.ledgers:
            self.ledgers[command.queue] = Ledger()
        elif isinstance(command, DeleteQueue) and isinstance(reply, DeleteOk):
            self._forget_partitioned(command.queue)
            if peek.total_before is not None and reply.messages != peek.total_before:
                found.append(
                    (
                        "delete_count",
                        f"DeleteOk({reply.messages}) but total was {peek.total_before}",
                    )
                )
            self.ledgers.pop(command.queue, None)
            for key in [k for k in self.blocked if k[0] == command.queue]:
                del self.blocked[key]
        elif isinstance(command, Enqueue):
            found += self._account_enqueue(command, reply, peek)
        elif isinstance(command, Settle):
            self.ledger(command.queue).outflow += peek.settled_held
        elif isinstance(reply, PurgeOk):
            self.ledger(getattr(command, "queue", "")).outflow += reply.count
            if peek.ready_before is not None and reply.count != peek.ready_before:
                found.append(
                    ("purge_count", f"PurgeOk({reply.count}) but {peek.ready_before} were ready")
                )
        elif _is_settled_dequeue(command, reply):
            self.ledger(getattr(command, "queue", "")).outflow += 1
        elif isinstance(reply, Routed):  # v4: a publish through an exchange, one copy a queue
            found += _check_routed_reply(reply)
            for name in reply.queues:
                self.ledger(name).inflow += 1
        return found

    def _account_enqueue(self, command: Enqueue, reply: Reply, peek: Peek) -> list[Found]:
        expected = peek.enqueue_expected_seq
        if command.seq is None or command.enqueuer is None or expected is None:
            if isinstance(reply, Ok):
                self.ledger(command.queue).inflow += 1
            return []
        if command.seq == expected and isinstance(reply, Ok):
            self.ledger(command.queue).inflow += 1
            return []
        if command.seq < expected and isinstance(reply, Ok):
            return []  # a duplicate: acked, not stored
        if command.seq > expected and isinstance(reply, NotEnqueued):
            if reply.expected_seq != expected:
                detail = f"NotEnqueued({reply.expected_seq}), expected {expected}"
                return [("enqueuer_dedup", detail)]
            return []
        return [("enqueuer_dedup", f"seq {command.seq} with next {expected} got {reply!r}")]

    def _account_effects(
        self, state: State, command: Command, effects: list[Effect]
    ) -> list[Found]:
        found: list[Found] = []
        for effect in effects:
            if isinstance(effect, DeadLettered):
                self.ledger(effect.queue).outflow += effect.count
                if effect.target is not None and probe.queue(state, effect.target) is not None:
                    target = self.ledger(effect.target)
                    target.inflow += effect.count
                    target.disturbed = True
                    # v3: dead-letters into a partitioned queue move its round robin too: the
                    # even spread is checked afresh from here
                    base = effect.target.rpartition(".")[0]
                    if base in state.partitioned:
                        self.round_robin.pop(base, None)
            elif isinstance(effect, Deliver):
                grouped = _grouped(state, effect.queue)
                self.deliveries += len(effect.messages) if grouped else 0
                found += self._check_group_order(effect.queue, [
                    (d.body, d.redelivered) for d in effect.messages]) if grouped else (
                    self._check_order(effect))  # fmt: skip
                found += _check_recipient(state, effect)
                found += _check_not_expired(state, effect)
            elif isinstance(effect, QueueStatus):
                found += self._check_queue_status(effect)
        return found

    def _check_queue_status(self, effect: QueueStatus) -> list[Found]:
        """reject_publish and go alternate per enqueuer, starting with reject_publish."""
        key = (effect.queue, effect.enqueuer)
        blocked = effect.status == "reject_publish"
        if self.blocked.get(key, False) == blocked:
            return [
                (
                    "queue_status",
                    f"{effect.queue}/{effect.enqueuer} told {effect.status} twice in a row"
                    if blocked or key in self.blocked
                    else f"{effect.queue}/{effect.enqueuer} told go without a reject_publish",
                )
            ]
        self.blocked[key] = blocked
        return []

    def _check_group_order(self, queue: str, deliveries: list[tuple[bytes, bool]]) -> list[Found]:
        """Within a group, first deliveries follow enqueue order (redeliveries are flagged)."""
        found: list[Found] = []
        if self.ledger(queue).disturbed:
            return found
        for body, redelivered in deliveries:
            number = body_number(body)
            if number is None or redelivered:
                continue
            gid = self.group_of_number.get((queue, number))
            last = self.last_in_group.get((queue, gid), -1)
            if number <= last:
                found.append(
                    (
                        "group_order",
                        f"{queue}: group {gid!r} delivered #{number} for "
                        f"the first time after #{last}",
                    )
                )
            self.last_in_group[(queue, gid)] = max(number, last)
        return found

    def _check_queue_order(
        self, state: State, command: Command, reply: Reply, effects: list[Effect]
    ) -> list[Found]:
        """Per queue, across all consumers and dequeues: messages leave for the first time in
        enqueue order (one command's deliveries may come in any order among themselves)."""
        firsts: dict[str, list[int]] = {}
        for effect in effects:
            if isinstance(effect, Deliver):
                for delivery in effect.messages:
                    if not delivery.redelivered:
                        _add_first(firsts, effect.queue, delivery.body)
        message = reply.message if isinstance(reply, DequeueOk) else None
        found: list[Found] = []
        name = getattr(command, "queue", "")
        if message is not None and not message.redelivered:
            _add_first(firsts, name, message.body)
        if message is not None and isinstance(name, str) and _grouped(state, name):
            found += self._check_group_order(name, [(message.body, message.redelivered)])
        for queue, numbers in firsts.items():
            if self.ledger(queue).disturbed or _grouped(state, queue):
                continue  # grouped: per group (groups owned by others are passed over)
            last = self.last_first_delivery.get(queue, -1)
            if min(numbers) <= last:
                found.append(
                    (
                        "queue_order",
                        f"{queue}: first delivery of #{min(numbers)} after #{last} had left",
                    )
                )
            self.last_first_delivery[queue] = max(last, *numbers)
        return found

    def _check_order(self, effect: Deliver) -> list[Found]:
        """Per consumer, first deliveries arrive in enqueue order; only redeliveries go back.

        Stronger than "in order when nothing was returned": returned messages are redelivered
        (flagged) and must not disturb the order of the others.
        """
        found: list[Found] = []
        ledger = self.ledger(effect.queue)
        cid = ConsumerId(effect.tag, effect.connection)
        prefix = effect.queue.encode() + b"|"
        for delivery in effect.messages:
            self.deliveries += 1
            number = body_number(delivery.body)
            if number is None or not delivery.body.startswith(prefix):
                continue
            if ledger.disturbed or delivery.redelivered:
                continue
            last = self.last_number.get((effect.queue, cid), -1)
            if number <= last:
                found.append(
                    (
                        "delivery_order",
                        f"{effect.queue}/{effect.tag}: message #{number} "
                        f"after #{last} with nothing returned",
                    )
                )
            self.last_number[(effect.queue, cid)] = number
        return found


def check_consumer_group(state: State, group: probe.ConsumerGroup) -> list[Found]:
    """One v3 consumer group's structural invariants (see `Checker._check_consumer_groups`)."""
    found: list[Found] = []
    name = group.name
    for partition in group.partitions:
        queue = probe.queue(state, partition)
        if queue is None:
            continue
        holding = [c for c in probe.all_consumers(queue) if c.checked_out]
        if len(holding) > 1:
            tags = ", ".join(c.tag for c in holding)
            found.append(("cgroup_two_holders", f"{name}: {partition} held by {tags}"))
        holder = group.holder.get(partition)
        member = group.members.get(holder) if holder is not None else None
        for consumer in holding:
            if member is None or (consumer.tag, consumer.connection) != (
                member.tag,
                member.connection,
            ):
                found.append(("cgroup_holder", f"{name}: {consumer.tag} holds messages of "
                              f"{partition}, whose holder is {holder}"))  # fmt: skip
    if group.members:
        alive = [p for p in group.partitions if probe.queue(state, p) is not None]
        for partition in alive:
            if group.target.get(partition) not in group.members:
                found.append(("cgroup_unassigned", f"{name}: {partition} has no live member "
                              f"(target {group.target.get(partition)})"))  # fmt: skip
        sizes = [len(held) for held in group.assignment().values()]
        if max(sizes) - min(sizes) > 1:
            found.append(("cgroup_balance", f"{name}: target sizes {sizes}"))
        if not group.pending():
            held = [len(group.held_by(member)) for member in group.members]
            if max(held) - min(held) > 1:
                found.append(("cgroup_balance", f"{name}: holders {held} with nothing pending"))
    return found


def _label(message: Message) -> str:
    """How a violation names a message: its body, or (v4) the index its body stays at."""
    return f"ref {message.ref}" if type(message) is RefMessage else repr(message.body)


def check_state(state: State, ledgers: dict[str, Ledger]) -> list[Found]:
    """The structural invariants over every queue of the state."""
    found: list[Found] = []
    owners: dict[int, str] = {}
    for queue in probe.queues(state):
        found += _check_queue(queue, ledgers.get(queue.name), owners, state.version)
    return found


def _check_queue(
    queue: probe.Queue, ledger: Ledger | None, owners: dict[int, str], version: int
) -> list[Found]:
    found: list[Found] = []
    name = queue.name
    held = 0
    for consumer, msg_id, message in probe.checked_out(queue):
        held += 1
        where = f"{name}/{consumer.tag}#{msg_id}"
        if id(message) in owners:
            found.append(
                (
                    "double_checkout",
                    f"message {_label(message)} at {where} and {owners[id(message)]}",
                )
            )
        owners[id(message)] = where
    waiting = 0
    for message in probe.waiting(queue):
        waiting += 1
        if id(message) in owners:
            where = owners[id(message)]
            found.append(("double_checkout", f"{_label(message)} ready and at {where}"))
    total = queue.messages_total
    if total != waiting + held:
        found.append(
            (
                "messages_total",
                f"{name}: total {total} != waiting {waiting} (ready "
                f"{len(queue.ready)}, returned {len(queue.returns)}) + checked out {held}",
            )
        )
    if ledger is not None and ledger.inflow - ledger.outflow != total:
        found.append(
            (
                "accounting",
                f"{name}: enqueued {ledger.inflow} - left {ledger.outflow} != total {total}",
            )
        )
    found += _check_consumers(queue, version)
    found += _check_bytes(queue)
    if queue.grouping is not None:
        found += check_groups(queue)
    config = queue.config
    limited = config.max_length is not None and config.overflow == "drop_head"
    if limited and probe.ready_count(queue) > (config.max_length or 0):
        found.append(
            (
                "max_length",
                f"{name}: ready {probe.ready_count(queue)} > max_length {config.max_length}",
            )
        )
    return found


def _check_consumers(queue: probe.Queue, version: int) -> list[Found]:
    found: list[Found] = []
    active = 0
    for consumer in queue.consumers.values():
        if consumer.status in ("up", "quiescing") and not consumer.once:
            active += 1
        if consumer.credited and consumer.credit < 0:
            detail = f"{queue.name}/{consumer.tag}: credit {consumer.credit} below 0"
            found.append(("credit_bounds", detail))
        if (
            not consumer.credited
            and not consumer.once
            and not (0 <= consumer.credit <= consumer.prefetch)
        ):
            found.append(
                (
                    "credit_bounds",
                    f"{queue.name}/{consumer.tag}: credit "
                    f"{consumer.credit} not in [0, {consumer.prefetch}]",
                )
            )
    if queue.config.single_active_consumer and active > 1:
        found.append(("single_active", f"{queue.name}: {active} active consumers"))
    if queue.config.single_active_consumer:
        found += _check_sac_progress(queue, version)
    return found


def _eligible(consumer: probe.Consumer) -> bool:
    return consumer.status == "up" and consumer.suspected_since is None and not consumer.timed_out


def _check_sac_progress(queue: probe.Queue, version: int) -> list[Found]:
    """SAC liveness: someone is active when someone can be; v2 priority takeover has happened.

    v2 rule: a higher-priority eligible waiting consumer makes an idle active consumer swap out,
    and one with pending messages quiesce (status quiescing), after every command.
    """
    active = [c for c in queue.consumers.values() if c.status in ("up", "quiescing")]
    eligible = [c for c in queue.waiting if _eligible(c)]
    if not active and eligible:
        return [("sac_progress", f"{queue.name}: no active consumer while {eligible[0].tag} waits")]
    if version < 2:
        return []
    order = [(not _eligible(c), -c.priority, -c.credit, c.attach_index) for c in queue.waiting]
    if order != sorted(order):
        return [
            (
                "sac_waiting_order",
                f"{queue.name}: waiting {[c.tag for c in queue.waiting]} "
                f"not in (up, priority, credit, attach) order: {order}",
            )
        ]
    if not active:
        return []
    current = active[0]
    if current.status == "quiescing" and not current.checked_out:
        return [("sac_progress", f"{queue.name}: {current.tag} quiescing with nothing pending")]
    higher = [c for c in eligible if c.priority > current.priority]
    if current.status == "up" and higher:  # idle: swap; with pending: quiescing
        return [
            (
                "sac_priority",
                f"{queue.name}: {higher[0].tag} (priority {higher[0].priority}) "
                f"waits behind {current.tag} (priority {current.priority}, up, "
                f"{len(current.checked_out)} pending)",
            )
        ]
    return []


def _is_settled_dequeue(command: Command, reply: Reply) -> bool:
    """A Dequeue(settled=True) that took a message: it left the queue at once."""
    return (
        isinstance(command, Checkout)
        and isinstance(command.spec, Dequeue)
        and command.spec.settled
        and isinstance(reply, DequeueOk)
        and reply.message is not None
    )


def _check_recipient(state: State, effect: Deliver) -> list[Found]:
    """A message goes only to a consumer that is up: not suspected, cancelled, quiescing or
    timed out (checked on the state after the command, so a revival in the same command counts)."""
    queue = probe.queue(state, effect.queue)
    consumer = None if queue is None else probe.find_consumer(queue, effect.consumer_key)
    if consumer is None:
        return [("delivery_to_unknown", f"{effect.queue}/{effect.tag} is not a consumer")]
    if consumer.suspected_since is not None or consumer.status != "up" or consumer.timed_out:
        return [
            (
                "delivery_to_inactive",
                f"{effect.queue}/{effect.tag} status {consumer.status} "
                f"suspected_since {consumer.suspected_since} timed_out {consumer.timed_out}",
            )
        ]
    return []


def _check_bytes(queue: probe.Queue) -> list[Found]:
    """Byte counters match the bodies, and drop_head keeps ready bytes within max_bytes."""
    found: list[Found] = []
    ready = sum(m.size for m in probe.waiting(queue))
    held = sum(m.size for _, _, m in probe.checked_out(queue))
    if (queue.bytes_ready, queue.bytes_checkout) != (ready, held):
        found.append(
            (
                "byte_counters",
                f"{queue.name}: ready/checked-out bytes "
                f"{queue.bytes_ready}/{queue.bytes_checkout}, bodies {ready}/{held}",
            )
        )
    max_bytes = queue.config.max_bytes
    if max_bytes is not None and queue.config.overflow == "drop_head" and ready > max_bytes:
        found.append(("max_bytes", f"{queue.name}: {ready} ready bytes > max_bytes {max_bytes}"))
    return found


SERIAL = 1 << 32


def check_credit_reply(command: Credit, effects: list[Effect], peek: Peek) -> list[Found]:
    """AMQP 1.0 flow: the reply follows its deliveries; delivery_count + credit follow RFC 1982.

    credit = max(0, rcv delivery_count + rcv credit - snd delivery_count) (RFC 1982), minus what
    this command delivered; with drain the rest is consumed: delivery_count += credit, credit 0.
    """
    sender = peek.sender_delivery_count
    if sender is None:
        return []
    replies = [i for i, e in enumerate(effects) if isinstance(e, CreditReply)]
    if len(replies) != 1:
        return [("credit_reply", f"{len(replies)} CreditReply effects for one Credit")]
    reply = effects[replies[0]]
    assert isinstance(reply, CreditReply)
    # Deliveries after the reply can only come from dead-lettering back into this queue later in
    # the same command (a dead-letter cycle); the reply covers the ones before it.
    count = sum(
        len(e.messages)
        for e in effects[: replies[0]]
        if isinstance(e, Deliver) and e.tag == reply.tag and e.connection == reply.connection
    )
    found: list[Found] = []
    link = (command.delivery_count + command.credit - sender) % SERIAL
    link = link - SERIAL if link >= SERIAL // 2 else link
    credit = max(0, link) - count
    want_count = (sender + count + (credit if command.drain else 0)) % SERIAL
    want = (want_count, 0 if command.drain else credit)
    if credit < 0 or (reply.delivery_count, reply.credit) != want:
        found.append(
            (
                "credit_reply",
                f"got delivery_count/credit "
                f"{reply.delivery_count}/{reply.credit}, expected {want[0]}/{want[1]} "
                f"(sender was at {sender}, delivered {count})",
            )
        )
    return found


def _check_renewed(state: State, command: RenewLocks) -> list[Found]:
    """After RenewLocks at time T, each named lock still held expires at T + the timeout."""
    queue = probe.queue(state, command.queue) if isinstance(command.queue, str) else None
    consumer = None if queue is None else probe.find_consumer(queue, command.consumer_key)
    if consumer is None or not isinstance(command.msg_ids, tuple):
        return []
    want = state.last_time + consumer.timeout_ms
    stale = [
        i
        for i in command.msg_ids
        if isinstance(i, int) and i in consumer.checked_out and consumer.checked_out[i].lock != want
    ]
    if stale:
        return [
            ("renew_locks", f"{command.queue}/{consumer.tag}: ids {stale} not renewed to {want}")
        ]
    return []


def _check_untimed_out(
    state: State, command: Settle | Return | Discard | Modify | RenewLocks
) -> list[Found]:
    """Naming a timed-out id in a settle, return, discard, modify or renew clears it."""
    queue = probe.queue(state, command.queue) if isinstance(command.queue, str) else None
    consumer = None if queue is None else probe.find_consumer(queue, command.consumer_key)
    if consumer is None or not isinstance(command.msg_ids, tuple):
        return []
    left = sorted(set(consumer.timed_out) & {i for i in command.msg_ids if isinstance(i, int)})
    if left:
        return [
            (
                "timed_out_cleared",
                f"{command.queue}/{consumer.tag}: {left} still timed out "
                f"after {type(command).__name__}",
            )
        ]
    return []


def _check_not_expired(state: State, effect: Deliver) -> list[Found]:
    """No message is delivered at or after its expiry (expired ones are dead-lettered first)."""
    queue = probe.queue(state, effect.queue)
    consumer = None if queue is None else probe.find_consumer(queue, effect.consumer_key)
    if consumer is None:
        return []
    now = state.last_time
    late = [
        d.msg_id
        for d in effect.messages
        if (m := consumer.checked_out.get(d.msg_id)) is not None
        and m.expiry is not None
        and m.expiry <= now
    ]
    if late:
        return [
            (
                "delivered_expired",
                f"{effect.queue}/{effect.tag}: ids {late} expired at or before {now}",
            )
        ]
    return []


def _grouped(state: State, name: str) -> bool:
    queue = probe.queue(state, name)
    return queue is not None and queue.grouping is not None


def _group_of(key: str, annotations: object) -> GroupId:
    """The group an annotated enqueue names (the last pair with the key; ints as text)."""
    gid: GroupId = None
    if isinstance(annotations, tuple):
        for pair in annotations:
            if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == key:
                gid = pair[1] if isinstance(pair[1], str) else str(pair[1])
    return gid


def _sticky(consumer: probe.Consumer) -> bool:
    """An exclusive owner that keeps its groups: up, not once, not timed out or disconnected."""
    return (consumer.status == "up" and not consumer.once and not consumer.timed_out
            and not consumer.disconnected_fired)  # fmt: skip


def check_groups(queue: probe.Queue) -> list[Found]:
    """Message groups: one holder per group (its owner, with the right count), every message in a
    tracked group, and no starvation (no consumer that could take a group with waiting messages
    is left with credit)."""
    grouping = queue.grouping
    assert grouping is not None
    found: list[Found] = []
    name = queue.name
    holders: dict[GroupId, dict[object, int]] = {}
    for consumer, _, message in probe.checked_out(queue):
        per = holders.setdefault(message.group, {})
        per[consumer.key] = per.get(consumer.key, 0) + 1
    for gid, per in holders.items():
        group = grouping.groups.get(gid)
        if len(per) > 1:
            found.append(("group_two_holders", f"{name}: group {gid!r} held by {list(per)}"))
        elif group is None:
            found.append(("group_untracked", f"{name}: group {gid!r} held but not tracked"))
        elif group.owner not in per or group.checked_out != sum(per.values()):
            found.append(
                (
                    "group_owner",
                    f"{name}: group {gid!r} owner {group.owner} with "
                    f"{group.checked_out} checked out, held by {per}",
                )
            )
    for group in grouping.groups.values():
        if group.checked_out and group.gid not in holders:
            found.append(
                (
                    "group_owner",
                    f"{name}: group {group.gid!r} counts "
                    f"{group.checked_out} checked out, none held",
                )
            )
        for message in (*group.returns, *group.ready):
            if message.group != group.gid:
                found.append(
                    (
                        "group_membership",
                        f"{name}: a message of {message.group!r} waits in {group.gid!r}",
                    )
                )
        positions = [m.pos for m in (*group.returns, *group.ready)]
        if positions != sorted(positions):
            found.append(("group_order", f"{name}: group {group.gid!r} waits out of order"))
    takers = [c for c in queue.consumers.values() if _eligible(c) and c.credit > 0]
    for consumer in takers:
        for group in grouping.groups.values():
            if (group.returns or group.ready) and group.owner in (None, consumer.key):
                found.append(
                    (
                        "group_starvation",
                        f"{name}: {consumer.tag} has credit "
                        f"{consumer.credit} while group {group.gid!r} waits "
                        f"(owner {group.owner})",
                    )
                )
                return found
    return found


def _add_first(firsts: dict[str, list[int]], queue: str, body: bytes) -> None:
    """Record a first delivery whose body was enqueued on this very queue."""
    number = body_number(body)
    if number is not None and body.startswith(queue.encode() + b"|"):
        firsts.setdefault(queue, []).append(number)


def _check_routed_reply(reply: Routed) -> list[Found]:
    """v4: a publish through an exchange names each queue it reached once, in name order, as
    stored or as refused, never both (each stored copy is then counted by `accounting`)."""
    names = [*reply.queues, *reply.refused]
    if list(reply.queues) != sorted(set(reply.queues)) or len(set(names)) != len(names):
        return [("exchange_routed", f"{reply!r}: queues unsorted, repeated or also refused")]
    return []


def _check_owner_rule(
    state: State, command: Command, reply: Reply, effects: list[Effect], peek: Peek
) -> list[Found]:
    """v4 (issue 31): a bound settle, return, discard, modify or renew from a connection other
    than its consumer's is refused (not_owner) and changes nothing; one from the consumer's
    own connection is never refused as not_owner."""
    refused = isinstance(reply, Error) and reply.code == "not_owner"
    name = type(command).__name__
    if peek.from_owner:
        return [("owner_refused", f"the owner's {name} was refused: {reply!r}")] if refused else []
    if not refused:
        return [("foreign_settle", f"another connection's {name} was answered {reply!r}")]
    name_of_queue = getattr(command, "queue", None)
    queue = probe.queue(state, name_of_queue) if isinstance(name_of_queue, str) else None
    total = queue.messages_total if queue is not None else None
    if effects or total != peek.total_before:
        return [("foreign_settle", f"another connection's {name} changed the queue: "
                 f"{len(effects)} effects, total {peek.total_before} -> {total}")]  # fmt: skip
    return []
