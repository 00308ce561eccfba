"""Replay one group of queues through the machine itself and derive per-message facts from it.

A group is a set of queues linked by dead-lettering (a queue and every queue it dead-letters to,
transitively): the machine moves messages between them inside one `apply`, so they replay
together. Every command of the group (plus the cluster-wide ConnectionDown / NodeDown / NodeUp,
which touch every queue) is applied with `fifo.apply`, in index order, with the meta recorded in
the log; upgrades convert the state with `fifo.convert` at the recorded index. Since exported
metas carry a non-decreasing time, a group's state evolves exactly as those queues did in the
cluster, and the merged group states reproduce the log's `fifo_digest`.

Facts are read from the machine's output, never guessed: a message is the `fifo.state.Message`
object the machine holds (tracked by identity), its deliveries are the `Deliver` effects (and
`DequeueOk` replies; from machine v4 also `RefDeliver` / `RefDequeueOk`, the same deliveries
with bodies by reference), a settle / return / discard is the message leaving a consumer's
checked-out map, dead-lettering comes from `DeadLettered` effects, SAC hand-overs from
`ConsumerUpdate` effects and timeouts from `Released` effects. A cheap invariant (tracked
messages per queue == `messages_total`) guards the bookkeeping after every command; when it does
not hold the queue is resynchronised from the state and the event counted in `resyncs`.

Bodies (machine v4, issue 32): a v4 message (`RefMessage`) holds no body, only the meta index
of its enqueuing command and the body's size; the replay needs only the size (`Message.size`,
which both shapes give), so it never reads a body, and never needs to resolve one.

Extension point (machine v3, group ownership): `GroupReplay.observe_effect` is where a new effect
type (e.g. a group owner change) becomes rows; it has no column until the machine emits it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import fifo
from fifo.commands import (
    UNBOUND_SETTLES,
    Checkout,
    ConnectionDown,
    ConsumerDisconnectedTimeout,
    ConsumerId,
    Credit,
    DeclareQueue,
    DeleteQueue,
    Discard,
    Enqueue,
    EvalConsumerTimeouts,
    Expire,
    Modify,
    NodeDown,
    NodeUp,
    Purge,
    RegisterEnqueuer,
    RenewLocks,
    Return,
    Settle,
)
from fifo.effects import (
    ConsumerCancelled,
    ConsumerUpdate,
    DeadLettered,
    Deliver,
    RefDeliver,
    Released,
)
from fifo.fuzz import probe
from fifo.meta import Meta
from fifo.replies import DeclareOk, DequeueOk, Error, RefDequeueOk
from fifo.state import (
    Consumer,
    Message,
    Queue,
    RefMessage,
    State,
    Waiting,
    WaitingLine,
    expiry_of,
    inflate,
)

GLOBAL_COMMANDS = (ConnectionDown, NodeDown, NodeUp)
NAMED_COMMANDS = (Settle, Return, Discard, Modify, RenewLocks)
# Commands after which no checked-out message can have left its consumer (checked by the guard).
NO_CHECKOUT_EXIT = (Enqueue, Credit, RegisterEnqueuer, DeclareQueue, Purge, Expire)
DELIVERIES_KEPT = 32  # per message; `deliveries` counts them all
OUTCOME_BY_REASON = {"rejected": "discarded", "expired": "expired"}  # without a DLX target
CAUSE_BY_COMMAND = {
    Return: "return",
    Modify: "modify",
    EvalConsumerTimeouts: "timeout",
    ConsumerDisconnectedTimeout: "consumer_down",
    ConnectionDown: "consumer_down",
    NodeDown: "consumer_down",
    Checkout: "consumer_cancelled",
}
SECOND_MS = 1000
DELIVER_EFFECTS = (Deliver, RefDeliver)  # v4 delivers by reference: the same msg ids
DEQUEUE_REPLIES = (DequeueOk, RefDequeueOk)  # v4 dequeues by reference
STATE_BYTES_MAX = 64 * 1024 * 1024  # a larger final state is not sent back for the check


def _key(m: Waiting | None) -> int:
    """A message's key among a queue's tracked rows: an object's id; a plain v4 message (a packed
    int, which machine v4's WaitingLine hands out as a new int object at each read) its value,
    negated to keep clear of ids (a queue never holds two of one publish's packed int)."""
    return ~m if type(m) is int else id(m)


def consumer_name(tag: str, connection: Any) -> str:
    """`tag@node/incarnation/number`: unique per consumer for the life of the log."""
    return f"{tag}@{connection.node}/{connection.incarnation}/{connection.number}"


@dataclass(slots=True)
class MessageRow:
    """What is known of one message; `m` is the machine's object while the message lives (a
    plain waiting v4 message: its packed int, the very item of the deque, until it is checked
    out as a new RefMessage: `_unpacked_row`)."""

    m: Waiting | None
    queue: str
    seq: int
    enqueue_index: int | None
    enqueue_ms: int | None
    source: str  # publish | dead_letter | snapshot | unobserved
    dead_lettered_from: str | None
    body_bytes: int
    loc: Any = None  # "ready" | "returns" | "popped" | (consumer key, msg id) | None
    holder: str | None = None
    deliveries: list[tuple[str, int, int]] = field(default_factory=list)
    delivery_total: int = 0
    first_delivery_ms: int | None = None
    returns: int = 0
    timeouts: int = 0
    consumer_gone: int = 0
    modified: int = 0
    settle_index: int | None = None
    settle_ms: int | None = None
    outcome: str | None = None
    outcome_reason: str | None = None
    dead_letter_target: str | None = None


@dataclass(slots=True)
class ConsumerRow:
    """Per consumer counters."""

    queue: str
    consumer: str
    key: str
    first_ms: int
    last_ms: int
    deliveries: int = 0
    acks: int = 0
    returns: int = 0
    timeouts: int = 0
    timed_out_messages: int = 0
    sac_activations: int = 0
    handovers_in: int = 0
    handovers_out: int = 0
    sac_active_ms: int = 0
    active_since: int | None = None
    cancel_reason: str | None = None


@dataclass(slots=True)
class RateRow:
    """Per queue per second counters; depths are those after the second's last command."""

    second: int
    published: int = 0
    delivered: int = 0
    acked: int = 0
    returned: int = 0
    dead_lettered: int = 0
    ready: int = 0
    checked_out: int = 0


@dataclass(slots=True)
class QueueTrack:
    """The replay's mirror of one queue: its ready and returns deques and checked-out places."""

    ready: deque[MessageRow] = field(default_factory=deque)
    returns: deque[MessageRow] = field(default_factory=deque)
    checked_out: dict[tuple[Any, int], MessageRow] = field(default_factory=dict)
    alive: dict[int, MessageRow] = field(default_factory=dict)
    seq: int = 0
    rate: RateRow | None = None
    active: str | None = None  # SAC: the consumer active now
    last_active: str | None = None  # SAC: the last consumer that was active


@dataclass(frozen=True, slots=True)
class Upgrade:
    """A machine version switch recorded in the log, with the exact meta it was applied with."""

    index: int
    term: int
    ms: int
    to_version: int


class GroupReplay:
    """Replays the commands of one queue group and yields (table, row) pairs as facts settle."""

    def __init__(
        self,
        queues: Iterable[str],
        initial_version: int,
        snapshot_fifo: bytes | None = None,
        window: tuple[int | None, int | None] = (None, None),
    ) -> None:
        self.names = frozenset(queues)
        if snapshot_fifo is not None:
            state = fifo.restore(snapshot_fifo)
            for name in [n for n in state.queues if n not in self.names]:
                del state.queues[name]
            self.state: State = state
        else:
            self.state = fifo.init_state(initial_version)
        self.window = window
        self.tracks: dict[str, QueueTrack] = {}
        self.consumers: dict[tuple[str, str], ConsumerRow] = {}
        self.out: list[tuple[str, dict[str, Any]]] = []
        self.stats = {"commands": 0, "errors": 0, "undecodable": 0, "resyncs": 0, "upgrades": 0}
        self.now = self.state.last_time
        # queue -> sort key of its place in the state's dict (the snapshot's order, then the
        # index of the declare that created it): merging groups rebuilds the cluster's order
        self.created: dict[str, float] = {}
        self.seq_base: dict[str, int] = {}
        for position, (name, q) in enumerate(self.state.queues.items()):
            self.created[name] = position - len(self.state.queues)
            self._adopt(name, q)

    # --- driving -------------------------------------------------------------------------------

    def command(self, index: int, term: int, ms: int, version: int, blob: bytes) -> None:
        """Apply one logged command."""
        try:
            cmd = fifo.decode(blob)
        except fifo.CodecError:
            self.stats["undecodable"] += 1
            return
        self.stats["commands"] += 1
        qname = getattr(cmd, "queue", None)
        q = self.state.queues.get(qname) if isinstance(qname, str) else None
        named = self._named_candidates(q, cmd) if q is not None else None
        reply, effects = fifo.apply(Meta(index, term, ms, version), cmd, self.state)
        self.now = max(self.now, ms)
        if isinstance(reply, Error):
            self.stats["errors"] += 1
            return
        if isinstance(cmd, DeleteQueue):
            # the queue, or (v3) a partitioned queue's partitions, deleted with their base
            for name in [n for n in self.tracks if n not in self.state.queues]:
                self._deleted(name, index)
            for name in [n for n in self.created if n not in self.state.queues]:
                del self.created[name]
        elif isinstance(reply, DeclareOk) and reply.created:
            # a partitioned declare (v3) creates queue.0 .. queue.{P-1}, in that order
            new = [name for name in self.state.queues if name not in self.created]
            for offset, name in enumerate(new):
                self.created[name] = index + offset / (len(new) + 1)
        touched: dict[str, None] = {}
        if isinstance(cmd, GLOBAL_COMMANDS):
            touched.update(dict.fromkeys(sorted(self.state.queues)))
        elif isinstance(qname, str) and qname in self.state.queues:
            touched[qname] = None
        elif isinstance(qname, str) and qname in self.state.partitioned:  # v3 JoinGroup, ...
            partitions = (f"{qname}.{i}" for i in range(self.state.partitioned[qname]))
            touched.update(dict.fromkeys(p for p in partitions if p in self.state.queues))
        for effect in effects:
            if type(effect) is DeadLettered and effect.target in self.state.queues:
                touched[effect.target] = None
            elif getattr(effect, "queue", None) in self.state.queues:
                # v3: a command on one partition can hand others over (a member timed out
                # there ends on all of them): every queue an effect names changed
                touched[effect.queue] = None
        for name in touched:
            self._sync(name, cmd, reply, effects, index, named if name == qname else None)
        for effect in effects:
            self.observe_effect(effect, index)

    def upgrade(self, up: Upgrade) -> None:
        """Convert the state at a recorded version switch, keeping every message's identity."""
        old = self.state
        if up.to_version <= old.version:
            return
        meta = Meta(up.index, up.term, up.ms, up.to_version)
        new = fifo.convert(old, old.version, up.to_version, meta)
        for name, q in old.queues.items():
            self._remap(name, q, new.queues[name])
        self.state = new
        self.now = max(self.now, up.ms)
        self.stats["upgrades"] += 1

    def finish(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Flush what is still open: live messages (no outcome), consumers, the last seconds."""
        yield from self.drain()
        for name, track in self.tracks.items():
            q = self.state.queues.get(name)
            if q is not None and len(track.alive) != q.messages_total:
                self._resync(name, q, self.now)
            for row in track.alive.values():
                self._emit_message(row)
            self._flush_rate(name, track)
        for crow in self.consumers.values():
            if crow.active_since is not None:
                crow.sac_active_ms += self.now - crow.active_since
                crow.active_since = None
            self.out.append(("consumers", _consumer_dict(crow)))
        order = sorted(self.state.queues, key=lambda n: self.created.get(n, 0))
        snapshot = fifo.snapshot(self.state)
        self.out.append(
            (
                "state",
                {
                    "snapshot": snapshot if len(snapshot) <= STATE_BYTES_MAX else b"",
                    "order": order,
                    "keys": [self.created.get(n, 0) for n in order],
                },
            )
        )
        yield from self.drain()

    def drain(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Rows finished since the last drain."""
        out, self.out = self.out, []
        yield from out

    # --- effects into consumer facts -------------------------------------------------------------

    def observe_effect(self, effect: Any, index: int) -> None:
        """Consumer facts from one effect (the place to add new effect types, e.g. machine v3)."""
        kind = type(effect)
        if kind is ConsumerUpdate:
            crow = self._consumer(effect.queue, effect.tag, effect.connection, effect.consumer_key)
            track = self.tracks.get(effect.queue)
            if effect.active and effect.status == "single_active" and track is not None:
                self._activate(track, crow)
            elif not effect.active and crow.active_since is not None and track is not None:
                self._deactivate(track, crow)
        elif kind is ConsumerCancelled:
            crow = self._consumer(effect.queue, effect.tag, effect.connection, effect.consumer_key)
            crow.cancel_reason = effect.reason
            track = self.tracks.get(effect.queue)
            if crow.active_since is not None and track is not None:
                self._deactivate(track, crow)
        elif kind is Released:
            crow = self._consumer(effect.queue, effect.tag, effect.connection, effect.consumer_key)
            if self._in_window(self.now):
                crow.timeouts += 1
                crow.timed_out_messages += len(effect.msg_ids)

    def _activate(self, track: QueueTrack, crow: ConsumerRow) -> None:
        if track.active == crow.consumer:
            return
        if track.active is not None:
            previous = self.consumers.get((crow.queue, track.active))
            if previous is not None and previous.active_since is not None:
                self._deactivate(track, previous)
        counted = self._in_window(self.now)
        if track.last_active is not None and track.last_active != crow.consumer and counted:
            crow.handovers_in += 1
            previous = self.consumers.get((crow.queue, track.last_active))
            if previous is not None:
                previous.handovers_out += 1
        if counted:
            crow.sac_activations += 1
        crow.active_since = self.now
        track.active = track.last_active = crow.consumer

    def _deactivate(self, track: QueueTrack, crow: ConsumerRow) -> None:
        if crow.active_since is not None:
            crow.sac_active_ms += self.now - crow.active_since
            crow.active_since = None
        if track.active == crow.consumer:
            track.active = None

    def _consumer(self, queue: str, tag: str, connection: Any, key: Any) -> ConsumerRow:
        name = consumer_name(tag, connection)
        crow = self.consumers.get((queue, name))
        if crow is None:
            crow = ConsumerRow(queue, name, _key_text(key), self.now, self.now)
            self.consumers[(queue, name)] = crow
        crow.last_ms = self.now
        return crow

    # --- per queue bookkeeping -----------------------------------------------------------------

    def _named_candidates(self, q: Queue, cmd: Any) -> list[MessageRow] | None:
        """The tracked messages a settle/return/discard/modify names, found before it applies."""
        if not isinstance(cmd, NAMED_COMMANDS):
            return None
        track = self.tracks.get(q.name)
        key = cmd.consumer_key
        if type(key) is ConsumerId:
            key = q.key_by_id.get(key, key)
        ids = cmd.msg_ids if type(cmd.msg_ids) is tuple else ()
        if track is None:
            return []
        found = (track.checked_out.get((key, i)) for i in ids if type(i) is int)
        return list({id(row): row for row in found if row is not None}.values())  # ids may repeat

    def _sync(
        self,
        name: str,
        cmd: Any,
        reply: Any,
        effects: list[Any],
        index: int,
        named: list[MessageRow] | None,
    ) -> None:
        """Bring the mirror of queue `name` in line with the state after `cmd`, emitting facts."""
        q = self.state.queues[name]
        track = self.tracks.get(name)
        if track is None:
            track = self._adopt(name, q)
        now = self.now
        rate = self._rate(name, track, now)
        own = getattr(cmd, "queue", None) == name or self._routed_to(name, cmd, effects)
        # 1. messages that left a consumer
        if own and named is not None:
            candidates: Iterable[MessageRow] = named
        elif own and isinstance(cmd, NO_CHECKOUT_EXIT):
            candidates = ()
        else:
            candidates = list(track.checked_out.values())
        left = [row for row in candidates if not self._still_held(q, row)]
        for row in left:
            del track.checked_out[row.loc]
        # 2. the ready and returns deques: pops at the head, appends at the tail
        if q.grouping is None:
            popped = self._pop_mirror(track.ready, q.ready)
            popped += self._pop_mirror(track.returns, q.returns)
            returned = self._appended(track.returns, q.returns)
            fresh = self._appended(track.ready, q.ready)
        else:
            popped, returned, fresh = self._diff_waiting(track, q)
        for row in popped:
            row.loc = "popped"
        cause = CAUSE_BY_COMMAND.get(UNBOUND_SETTLES.get(type(cmd), type(cmd)), "other")
        moved: dict[int, MessageRow] = {}
        for m in fresh:
            row = self._new_row(name, track, m, cmd, index, own, rate)
            row.loc = "ready"
            track.ready.append(row)
        for m in returned:
            row = track.alive.get(_key(m)) or self._new_row(name, track, m, cmd, index, own, rate)
            row.loc = "returns"
            track.returns.append(row)
            moved[id(row)] = row
        # 3. deliveries
        delivered: dict[int, MessageRow] = {}
        for effect in effects:
            if type(effect) in DELIVER_EFFECTS and effect.queue == name:
                c = _find_consumer(q, effect.consumer_key)
                who = self._consumer(
                    name, effect.tag, effect.connection, effect.consumer_key
                ).consumer
                for d in effect.messages:
                    held = c.checked_out.get(d.msg_id) if c is not None else None
                    if held is None:
                        continue
                    row = (track.alive.get(_key(held)) or self._unpacked_row(track, popped, held)
                           or self._new_row(name, track, held, cmd, index, own, rate))  # fmt: skip
                    self._delivered(track, row, (effect.consumer_key, d.msg_id), who, index, rate)
                    delivered[id(row)] = row
        auto_acked: MessageRow | None = None
        if own and isinstance(reply, DEQUEUE_REPLIES) and reply.message is not None:
            key = reply.consumer_key if reply.consumer_key is not None else cmd.consumer
            who = self._consumer(name, cmd.consumer.tag, cmd.consumer.connection, key).consumer
            if reply.consumer_key is not None:
                c = q.consumers.get(reply.consumer_key)
                got = c.checked_out.get(0) if c is not None else None
                if got is not None and c is not None:
                    row = (track.alive.get(_key(got)) or self._unpacked_row(track, popped, got)
                           or self._new_row(name, track, got, cmd, index, own, rate))  # fmt: skip
                    self._delivered(track, row, (c.key, 0), who, index, rate)
                    delivered[id(row)] = row
            else:
                taken = [r for r in popped if id(r) not in delivered]
                if taken:
                    auto_acked = taken[-1]
                    auto_acked.holder = None
                    self._delivery_fact(auto_acked, who, index, rate)
        for row in left:
            if id(row) in moved or id(row) in delivered:
                self._returned(row, cause, rate)
        # 4. what is gone
        gone_left = [r for r in left if id(r) not in moved and id(r) not in delivered]
        gone_popped = [r for r in popped if r.loc == "popped" and r is not auto_acked]
        self._settle_gone(name, track, q, cmd, own, effects, gone_left, gone_popped, auto_acked,
                          index, rate)  # fmt: skip
        rate.ready = len(track.ready) + len(track.returns)
        rate.checked_out = q.messages_total - rate.ready
        if len(track.alive) != q.messages_total or len(track.checked_out) != rate.checked_out:
            self._resync(name, q, index)

    def _routed_to(self, name: str, cmd: Any, effects: list[Any]) -> bool:
        """v3: `cmd` is a publish to the partitioned queue whose partition `name` is, and no
        message came to `name` by dead-lettering (so a new one there is the publish)."""
        if not isinstance(cmd, Enqueue) or cmd.queue not in self.state.partitioned:
            return False
        base, _, index = name.rpartition(".")
        if base != cmd.queue or not index.isdigit():
            return False
        return not any(type(e) is DeadLettered and e.target == name for e in effects)

    def _settle_gone(
        self,
        name: str,
        track: QueueTrack,
        q: Queue,
        cmd: Any,
        own: bool,
        effects: list[Any],
        gone_left: list[MessageRow],
        gone_popped: list[MessageRow],
        auto_acked: MessageRow | None,
        index: int,
        rate: RateRow,
    ) -> None:
        """Outcomes of messages that left the queue, from the command and DeadLettered effects."""
        budget: dict[str, list[Any]] = {}
        for effect in effects:
            if type(effect) is DeadLettered and effect.queue == name:
                slot = budget.setdefault(effect.reason, [0, effect.target])
                slot[0] += effect.count
                rate.dead_lettered += effect.count
        if auto_acked is not None:
            self._finish(track, auto_acked, "acked", "auto_ack", None, index, rate)
        for row in gone_left:
            if own and isinstance(cmd, Settle):
                self._finish(track, row, "acked", "settle", None, index, rate)
                continue
            preferred = "rejected" if isinstance(cmd, (Discard, Modify)) else "delivery_limit"
            if isinstance(cmd, Modify) and not cmd.undeliverable_here:
                preferred = "delivery_limit"
            self._dead(track, row, preferred, budget, index, rate)
        for row in gone_popped:
            if own and isinstance(cmd, Purge):
                self._finish(track, row, "dropped", "purged", None, index, rate)
                continue
            expiry = None if row.m is None else expiry_of(row.m)
            expired = expiry is not None and expiry <= self.now
            self._dead(track, row, "expired" if expired else "maxlen", budget, index, rate)
        for reason, (count, target) in budget.items():  # created and gone within this command
            for _ in range(count):
                row = MessageRow(None, name, track.seq, index, self.now, "unobserved", None, 0)
                track.seq += 1
                self._finish(track, row, _outcome(reason, target), reason, target, index, rate)

    def _dead(
        self,
        track: QueueTrack,
        row: MessageRow,
        preferred: str,
        budget: dict[str, list[Any]],
        index: int,
        rate: RateRow,
    ) -> None:
        reason = (
            preferred
            if budget.get(preferred, [0])[0] > 0
            else next((r for r, slot in budget.items() if slot[0] > 0), None)
        )
        if reason is None:
            self._finish(track, row, "dropped", "unknown", None, index, rate)
            return
        slot = budget[reason]
        slot[0] -= 1
        self._finish(track, row, _outcome(reason, slot[1]), reason, slot[1], index, rate)

    def _finish(
        self,
        track: QueueTrack,
        row: MessageRow,
        outcome: str,
        reason: str,
        target: str | None,
        index: int,
        rate: RateRow,
    ) -> None:
        row.outcome, row.outcome_reason, row.dead_letter_target = outcome, reason, target
        row.settle_index, row.settle_ms = index, self.now
        if outcome == "acked":
            rate.acked += 1 if self._in_window(self.now) else 0
            if row.holder is not None:
                crow = self.consumers.get((row.queue, row.holder))
                if crow is not None and self._in_window(self.now):
                    crow.acks += 1
        if row.m is not None:
            track.alive.pop(_key(row.m), None)
            row.m = None
        self._emit_message(row)

    def _still_held(self, q: Queue, row: MessageRow) -> bool:
        key, mid = row.loc
        c = _find_consumer(q, key)
        return c is not None and c.checked_out.get(mid) is row.m

    @staticmethod
    def _diff_waiting(
        track: QueueTrack, q: Queue
    ) -> tuple[list[MessageRow], list[Waiting], list[Waiting]]:
        """A grouped queue (machine v3) keeps its waiting messages in per-group deques, so the
        mirror is a set: rows no longer waiting are popped; messages newly waiting are returned
        (already tracked, e.g. back from a consumer) or fresh. Costs O(waiting) per command on
        grouped queues only."""
        waiting: list[Waiting] = list(probe.waiting(q))
        present = {_key(m) for m in waiting}
        kept: deque[MessageRow] = deque()
        popped: list[MessageRow] = []
        for row in (*track.ready, *track.returns):
            (kept if _key(row.m) in present else popped).append(row)
        known = {_key(row.m) for row in kept}
        added = [m for m in waiting if _key(m) not in known]
        track.ready, track.returns = kept, deque()
        returned = [m for m in added if _key(m) in track.alive]
        fresh = [m for m in added if _key(m) not in track.alive]
        return popped, returned, fresh

    @staticmethod
    def _pop_mirror(
        mirror: deque[MessageRow], actual: deque[Waiting] | WaitingLine
    ) -> list[MessageRow]:
        popped: list[MessageRow] = []
        head = _key(actual[0]) if actual else None
        while mirror and _key(mirror[0].m) != head:
            popped.append(mirror.popleft())
        return popped

    @staticmethod
    def _appended(mirror: deque[MessageRow], actual: deque[Waiting] | WaitingLine) -> list[Waiting]:
        extra = len(actual) - len(mirror)
        if extra <= 0:
            return []
        tail = list(islice(reversed(actual), extra))
        tail.reverse()
        return tail

    @staticmethod
    def _unpacked_row(
        track: QueueTrack, popped: list[MessageRow], held: Message
    ) -> MessageRow | None:
        """The row of a plain v4 message popped from a deque as its packed int and now held as
        a new RefMessage (same packed int): it follows the new object from here on."""
        if type(held) is not RefMessage:
            return None
        for row in popped:
            if type(row.m) is int and row.m == held.packed and track.alive.get(_key(row.m)) is row:
                del track.alive[_key(row.m)]
                row.m = held
                track.alive[_key(held)] = row
                return row
        return None

    def _new_row(
        self,
        name: str,
        track: QueueTrack,
        item: Waiting,
        cmd: Any,
        index: int,
        own: bool,
        rate: RateRow,
    ) -> MessageRow:
        m = inflate(item)
        death = dict(m.annotations).get("x-death-queue") if m.annotations else None
        if own and isinstance(cmd, Enqueue):
            source, origin = "publish", None
            if self._in_window(self.now):
                rate.published += 1
        elif death is not None:
            source, origin = "dead_letter", str(death)
        else:
            source, origin = "unknown", None
        row = MessageRow(item, name, track.seq, index, self.now, source, origin, m.size)
        track.seq += 1
        track.alive[_key(item)] = row
        return row

    def _delivered(
        self,
        track: QueueTrack,
        row: MessageRow,
        place: tuple[Any, int],
        who: str,
        index: int,
        rate: RateRow,
    ) -> None:
        if isinstance(row.loc, tuple) and track.checked_out.get(row.loc) is row:
            del track.checked_out[row.loc]
        row.loc = place
        row.holder = who
        track.checked_out[place] = row
        self._delivery_fact(row, who, index, rate)

    def _delivery_fact(self, row: MessageRow, who: str, index: int, rate: RateRow) -> None:
        now = self.now
        row.delivery_total += 1
        if row.first_delivery_ms is None:
            row.first_delivery_ms = now
        if len(row.deliveries) < DELIVERIES_KEPT:
            row.deliveries.append((who, index, now))
        if self._in_window(now):
            rate.delivered += 1
            crow = self.consumers.get((row.queue, who))
            if crow is not None:
                crow.deliveries += 1

    def _returned(self, row: MessageRow, cause: str, rate: RateRow) -> None:
        if cause == "timeout":
            row.timeouts += 1
        elif cause == "modify":
            row.modified += 1
        elif cause in ("consumer_down", "consumer_cancelled"):
            row.consumer_gone += 1
        else:
            row.returns += 1
        if self._in_window(self.now):
            rate.returned += 1
            if row.holder is not None and cause == "return":
                crow = self.consumers.get((row.queue, row.holder))
                if crow is not None:
                    crow.returns += 1

    def _deleted(self, name: str, index: int) -> None:
        track = self.tracks.pop(name, None)
        if track is None:
            return
        self.seq_base[name] = track.seq  # a queue declared again under this name goes on counting
        for row in list(track.alive.values()):
            row.m = None
            row.outcome, row.outcome_reason = "dropped", "queue_deleted"
            row.settle_index, row.settle_ms = index, self.now
            self._emit_message(row)
        self._flush_rate(name, track)

    def _adopt(self, name: str, q: Queue) -> QueueTrack:
        """Start tracking a queue; messages it already holds (from a snapshot) get rows."""
        track = QueueTrack(seq=self.seq_base.get(name, 0))
        self.tracks[name] = track
        self._resync(name, q, None, counted=False)
        return track

    def _resync(self, name: str, q: Queue, index: int | None, counted: bool = True) -> None:
        """Rebuild the mirror of a queue from the state (messages found but unknown get rows)."""
        track = self.tracks[name]
        if counted:
            self.stats["resyncs"] += 1
        seen: dict[int, MessageRow] = {}

        def row_for(m: Waiting) -> MessageRow:
            row = track.alive.get(_key(m))
            if row is None:
                source = "snapshot" if index is None else "unknown"
                row = MessageRow(m, name, track.seq, index, None, source, None, inflate(m).size)
                track.seq += 1
            seen[_key(m)] = row
            return row

        grouped = q.grouping is not None  # v3: waiting messages live in their groups
        track.ready = deque(row_for(m) for m in (probe.waiting(q) if grouped else q.ready))
        for row in track.ready:
            row.loc = "ready"
        track.returns = deque(() if grouped else (row_for(m) for m in q.returns))
        for row in track.returns:
            row.loc = "returns"
        track.checked_out = {}
        for c in (*q.consumers.values(), *q.waiting):
            for mid, m in c.checked_out.items():
                row = row_for(m)
                row.loc = (c.key, mid)
                track.checked_out[(c.key, mid)] = row
        for key, row in track.alive.items():
            if key not in seen:
                row.m = None
                row.outcome, row.outcome_reason = "dropped", "unknown"
                row.settle_index, row.settle_ms = index, self.now
                self._emit_message(row)
        track.alive = seen

    def _remap(self, name: str, old: Queue, new: Queue) -> None:
        """After a conversion: the same messages are new objects at the same places."""
        track = self.tracks.get(name)
        if track is None:
            return
        pairs: list[tuple[Waiting, Waiting]] = [*zip(old.ready, new.ready, strict=True)]
        pairs += zip(old.returns, new.returns, strict=True)
        new_consumers = {c.key: c for c in (*new.consumers.values(), *new.waiting)}
        for c in (*old.consumers.values(), *old.waiting):
            nc = new_consumers[c.key]
            pairs += [(m, nc.checked_out[mid]) for mid, m in c.checked_out.items()]
        alive: dict[int, MessageRow] = {}
        for m_old, m_new in pairs:
            row = track.alive.get(_key(m_old))
            if row is not None:
                row.m = m_new
                alive[_key(m_new)] = row
        track.alive = alive

    # --- rows ------------------------------------------------------------------------------------

    def _in_window(self, ms: int | None) -> bool:
        lo, hi = self.window
        if ms is None:
            return lo is None
        return (lo is None or ms >= lo) and (hi is None or ms < hi)

    def _rate(self, name: str, track: QueueTrack, now: int) -> RateRow:
        rate = self._rate_of(track, now)
        if rate.second != now // SECOND_MS:
            self._flush_rate(name, track)
            rate = self._rate_of(track, now)
        return rate

    @staticmethod
    def _rate_of(track: QueueTrack, now: int) -> RateRow:
        if track.rate is None:
            track.rate = RateRow(now // SECOND_MS)
        return track.rate

    def _flush_rate(self, name: str, track: QueueTrack) -> None:
        rate = track.rate
        if rate is None:
            return
        track.rate = None
        if self._in_window(rate.second * SECOND_MS):
            self.out.append(
                (
                    "queue_rates",
                    {
                        "queue": name,
                        "second": rate.second,
                        "published": rate.published,
                        "delivered": rate.delivered,
                        "acked": rate.acked,
                        "returned": rate.returned,
                        "dead_lettered": rate.dead_lettered,
                        "ready": rate.ready,
                        "checked_out": rate.checked_out,
                    },
                )
            )

    def _emit_message(self, row: MessageRow) -> None:
        if row.source != "snapshot" and not self._in_window(row.enqueue_ms):
            return
        if row.source == "snapshot" and self.window[0] is not None:
            return
        self.out.append(
            (
                "messages",
                {
                    "queue": row.queue,
                    "seq": row.seq,
                    "source": row.source,
                    "dead_lettered_from": row.dead_lettered_from,
                    "enqueue_index": row.enqueue_index,
                    "enqueue_ms": row.enqueue_ms,
                    "body_bytes": row.body_bytes,
                    "deliveries": [
                        {"consumer": who, "index": i, "ms": ms} for who, i, ms in row.deliveries
                    ],
                    "delivery_count": row.delivery_total,
                    "first_delivery_ms": row.first_delivery_ms,
                    "returns": row.returns,
                    "timeouts": row.timeouts,
                    "consumer_gone": row.consumer_gone,
                    "modified": row.modified,
                    "settle_index": row.settle_index,
                    "settle_ms": row.settle_ms,
                    "outcome": row.outcome,
                    "outcome_reason": row.outcome_reason,
                    "dead_letter_target": row.dead_letter_target,
                },
            )
        )


def _outcome(reason: str, target: str | None) -> str:
    if target is not None:
        return "dead_lettered"
    return OUTCOME_BY_REASON.get(reason, "dropped")


def _find_consumer(q: Queue, key: Any) -> Consumer | None:
    c = q.consumers.get(key)
    if c is not None:
        return c
    for w in q.waiting:
        if w.key == key:
            return w
    return None


def _key_text(key: Any) -> str:
    if type(key) is ConsumerId:
        return consumer_name(key.tag, key.connection)
    return str(key)


def _consumer_dict(crow: ConsumerRow) -> dict[str, Any]:
    return {
        "queue": crow.queue,
        "consumer": crow.consumer,
        "first_ms": crow.first_ms,
        "last_ms": crow.last_ms,
        "deliveries": crow.deliveries,
        "acks": crow.acks,
        "returns": crow.returns,
        "timeouts": crow.timeouts,
        "timed_out_messages": crow.timed_out_messages,
        "sac_activations": crow.sac_activations,
        "handovers_in": crow.handovers_in,
        "handovers_out": crow.handovers_out,
        "sac_active_ms": crow.sac_active_ms,
        "cancel_reason": crow.cancel_reason,
    }


def merged_digest(parts: Iterable[dict[str, Any]], version: int) -> str:
    """`fifo.digest` of the union of group states (disjoint queues, in the cluster's order)."""
    merged = fifo.init_state(version)
    keyed: list[tuple[int, str, Queue]] = []
    for part in parts:
        state = fifo.restore(part["snapshot"])
        merged.last_time = max(merged.last_time, state.last_time)
        merged.version = state.version
        keys = dict(zip(part["order"], part["keys"], strict=True))
        keyed += [(keys.get(name, 0), name, q) for name, q in state.queues.items()]
        if state.partitioned or state.consumer_groups:  # v3: all in one group (PARTITIONED_ANCHOR)
            merged.partitioned, merged.consumer_groups = state.partitioned, state.consumer_groups
            merged.routing = state.routing
    merged.queues = {name: q for _, name, q in sorted(keyed, key=lambda t: (t[0], t[1]))}
    return fifo.digest(merged)


__all__ = ["GroupReplay", "Upgrade", "consumer_name", "merged_digest"]
