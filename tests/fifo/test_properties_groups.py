"""Hypothesis stateful test of machine v3 message groups against a naive reference model.

The model keeps, per group, its waiting messages (by enqueue position), its holder or sticky
owner, and per consumer what it holds; it lets the machine choose which consumer gets a message
and checks every delivery and, after every step, the grouped invariants:
- a delivered message is the head of its group (returned ones first, in enqueue order), flagged
  redelivered exactly when it was delivered before;
- a group goes only to its owner while it has one (sequenced: the holder; exclusive: the consumer
  that got its first message, while it lives);
- no starvation: no live consumer with credit is left while a group it could take has messages;
- the machine's `groups` query agrees with the model (waiting, held, owner).
The fuzzer's invariants (fifo.fuzz.invariants) run after every step too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import fifo
from fifo.commands import (
    AnnotatedEnqueue,
    Cancel,
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    DeclareGroupedQueue,
    GroupConfig,
    PurgeGroup,
    QueueConfig,
    Remove,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver, Effect
from fifo.fuzz.invariants import Checker
from fifo.meta import Meta
from fifo.replies import CheckoutOk, Error, PurgeOk, Reply
from tests.fifo.model import ModelMismatch, fifo_settings

QUEUE = "q"
GROUPS = ("a", "b", "c", "d")
TAGS = ("c1", "c2", "c3")
CONN = ConnectionId("n1", 1, 1)


@dataclass
class GConsumer:
    prefetch: int
    key: int
    held: dict[int, tuple[int, str]] = field(default_factory=dict)  # msg id -> (pos, group)
    cancelled: bool = False

    def credit(self) -> int:
        return 0 if self.cancelled else self.prefetch - len(self.held)


@dataclass
class GroupsModel:
    exclusive: bool
    waiting: dict[str, list[int]] = field(default_factory=dict)  # group -> positions, sorted
    owner: dict[str, int] = field(default_factory=dict)  # group -> consumer key
    consumers: dict[str, GConsumer] = field(default_factory=dict)  # tag -> consumer
    delivered: set[int] = field(default_factory=set)  # positions delivered at least once
    group_of: dict[int, str] = field(default_factory=dict)

    def live(self, key: int) -> GConsumer | None:
        return next((c for c in self.consumers.values() if c.key == key), None)

    def holds(self, c: GConsumer, group: str) -> bool:
        return any(g == group for _, g in c.held.values())

    def maybe_free(self, group: str) -> None:
        """Drop the owner of a group when the policy says it is free."""
        key = self.owner.get(group)
        if key is None:
            return
        c = self.live(key)
        if c is not None and self.holds(c, group):
            return
        if c is None or c.cancelled or not self.exclusive:
            del self.owner[group]

    def deliver(self, tag: str, msg_id: int, pos: int, redelivered: bool) -> None:
        c = self.consumers[tag]
        group = self.group_of[pos]
        owner = self.owner.get(group)
        if owner is not None and owner != c.key:
            raise ModelMismatch(f"{tag} got group {group} owned by {owner}")
        queue = self.waiting.get(group, [])
        if not queue or queue[0] != pos:
            raise ModelMismatch(f"{tag} got #{pos} of {group}, head is {queue[:1]}")
        if redelivered != (pos in self.delivered):
            raise ModelMismatch(f"#{pos} redelivered={redelivered}")
        if c.credit() <= 0:
            raise ModelMismatch(f"{tag} got #{pos} without credit")
        queue.pop(0)
        self.delivered.add(pos)
        c.held[msg_id] = (pos, group)
        self.owner[group] = c.key

    def give_back(self, c: GConsumer, msg_id: int) -> None:
        pos, group = c.held.pop(msg_id)
        queue = self.waiting.setdefault(group, [])
        queue.append(pos)
        queue.sort()

    def starving(self) -> str | None:
        for tag, c in self.consumers.items():
            if c.credit() <= 0:
                continue
            for group, queue in self.waiting.items():
                if queue and self.owner.get(group) in (None, c.key):
                    return f"{tag} has credit {c.credit()} while {group} waits"
        return None


class GroupsAgainstModel(RuleBasedStateMachine):
    """One grouped queue, up to three simple_prefetch consumers."""

    def __init__(self) -> None:
        super().__init__()
        self.state = fifo.init_state(3)
        self.checker = Checker()
        self.index = 0
        self.model = GroupsModel(False)
        self.positions: dict[bytes, int] = {}

    @initialize(exclusive=st.booleans())
    def declare(self, exclusive: bool) -> None:
        self.model = GroupsModel(exclusive)
        policy: Literal["exclusive", "sequenced"] = "exclusive" if exclusive else "sequenced"
        reply, _ = self.apply(DeclareGroupedQueue(QUEUE, QueueConfig(),
                                                  GroupConfig("x-group-id", policy)))  # fmt: skip
        assert not isinstance(reply, Error), reply

    def apply(self, command: Command) -> tuple[Reply, list[Effect]]:
        self.index += 1
        meta = Meta(self.index, 1, 1_000 + self.index, 3)
        peek = self.checker.before(self.state, command)
        reply, effects = fifo.apply(meta, command, self.state)
        assert self.checker.after(self.state, command, reply, effects, peek) == []
        return reply, effects

    def deliveries(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Deliver):
                for m in effect.messages:
                    self.model.deliver(effect.tag, m.msg_id, self.positions[m.body],
                                       m.redelivered)  # fmt: skip

    # --- rules -------------------------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS))
    def enqueue(self, group: str) -> None:
        pos = len(self.positions) + 1
        body = b"m%05d" % pos
        self.positions[body] = pos
        self.model.group_of[pos] = group
        self.model.waiting.setdefault(group, []).append(pos)
        _, effects = self.apply(AnnotatedEnqueue(QUEUE, body,
                                                 annotations=(("x-group-id", group),)))  # fmt: skip
        self.deliveries(effects)

    @rule(tag=st.sampled_from(TAGS), prefetch=st.integers(1, 3))
    def attach(self, tag: str, prefetch: int) -> None:
        if tag in self.model.consumers:
            return
        reply, effects = self.apply(Checkout(QUEUE, ConsumerId(tag, CONN),
                                             SimplePrefetch(prefetch)))  # fmt: skip
        assert isinstance(reply, CheckoutOk)
        self.model.consumers[tag] = GConsumer(prefetch, reply.consumer_key)  # type: ignore[arg-type]
        self.deliveries(effects)

    def pick(self, data: st.DataObject) -> tuple[str, GConsumer, int] | None:
        holders = [(t, c) for t, c in self.model.consumers.items() if c.held]
        if not holders:
            return None
        tag, c = data.draw(st.sampled_from(holders))
        return tag, c, data.draw(st.sampled_from(sorted(c.held)))

    def after_leave(self, tag: str, c: GConsumer, groups: set[str]) -> None:
        if c.cancelled and not c.held:
            self.model.consumers.pop(tag, None)
        for group in groups:
            self.model.maybe_free(group)

    @rule(data=st.data(), give_back=st.booleans())
    def settle_or_return(self, data: st.DataObject, give_back: bool) -> None:
        picked = self.pick(data)
        if picked is None:
            return
        tag, c, msg_id = picked
        group = c.held[msg_id][1]
        if give_back:
            self.model.give_back(c, msg_id)
            command: Command = Return(QUEUE, c.key, (msg_id,))
        else:
            c.held.pop(msg_id)
            command = Settle(QUEUE, c.key, (msg_id,))
        self.after_leave(tag, c, {group})
        _, effects = self.apply(command)
        self.deliveries(effects)

    @rule(tag=st.sampled_from(TAGS), hard=st.booleans())
    def leave(self, tag: str, hard: bool) -> None:
        c = self.model.consumers.get(tag)
        if c is None:
            return
        groups = {g for _, g in c.held.values()} | {
            g for g, k in self.model.owner.items() if k == c.key}
        if hard:
            for msg_id in sorted(c.held):
                self.model.give_back(c, msg_id)
            del self.model.consumers[tag]
        else:
            c.cancelled = True
        self.after_leave(tag, c, groups)
        spec = Remove() if hard else Cancel()
        _, effects = self.apply(Checkout(QUEUE, ConsumerId(tag, CONN), spec))
        self.deliveries(effects)

    @rule(group=st.sampled_from(GROUPS))
    def purge_group(self, group: str) -> None:
        count = len(self.model.waiting.get(group, []))
        self.model.waiting[group] = []
        self.model.maybe_free(group)
        reply, _ = self.apply(PurgeGroup(QUEUE, group))
        assert reply == PurgeOk(count)

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def no_starvation(self) -> None:
        found = self.model.starving()
        if found:
            raise ModelMismatch(found)

    @invariant()
    def groups_agree(self) -> None:
        rows = {r.group: (r.ready, r.checked_out, r.owner) for r in fifo.groups(self.state, QUEUE)}
        model: dict[str | None, tuple[int, int, int | None]] = {}
        for group in GROUPS:
            waiting = len(self.model.waiting.get(group, []))
            held = sum(1 for c in self.model.consumers.values()
                       for _, g in c.held.values() if g == group)  # fmt: skip
            owner = self.model.owner.get(group)
            if waiting or held or owner is not None:
                model[group] = (waiting, held, owner)
        if rows != model:
            raise ModelMismatch(f"machine {rows} model {model}")


TestGroupsAgainstModel = GroupsAgainstModel.TestCase
TestGroupsAgainstModel.settings = fifo_settings(60, stateful_step_count=40)
