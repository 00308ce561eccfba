"""Machine v1 core: lookups, limits, dead-lettering, expiry and the delivery loop.

Shared by every handler of `QueueMachineV1`; v2 inherits it, which the pinned replay corpus of
both versions proves safe (a change here that alters either version fails its corpus).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    ConsumerId,
    ConsumerKey,
)
from fifo.effects import (
    DeadLettered,
    Delivery,
    QueueStatus,
)
from fifo.fastbuild import deliver as fast_deliver
from fifo.fastbuild import delivery as fast_delivery
from fifo.replies import Error
from fifo.shared import DEATH_KEYS, SERIAL, Ctx, invalid, merge_annotations, unknown_consumer
from fifo.state import Consumer, Message, Queue


class QueueCore:
    """Queue bookkeeping every command handler builds on."""

    uses_locks = False  # v2 records a consumer-timeout lock on every checked-out message

    def key_of(self, q: Queue, key: object) -> ConsumerKey | None:
        """v1 names consumers by their ConsumerId only (an int key is unknown)."""
        if type(key) is ConsumerId:
            return q.key_by_id.get(key)
        return None

    def resolve(self, q: Queue, key: object) -> Consumer | None:
        """Find a consumer (active or waiting) by key or id; None if unknown."""
        k = self.key_of(q, key)
        if k is None:
            return None
        found = q.consumers.get(k)
        if found is not None:
            return found
        for w in q.waiting:
            if w.key == k:
                return w
        return None

    def find_key(self, q: Queue, key: object) -> tuple[Consumer | None, Error | None]:
        """Validate then resolve a consumer key given by a command."""
        err = v.key_error(key)
        if err:
            return None, invalid(err)
        c = self.resolve(q, key)
        return c, (None if c is not None else unknown_consumer(key))

    def holder(self, q: Queue, key: object, msg_ids: object) -> Consumer | Error:
        """The consumer a return/discard/modify/renew names (ids validated), or the error."""
        c, err = self.find_key(q, key)
        if c is None:
            return err or unknown_consumer(key)
        if msg := v.msg_ids_error(msg_ids):
            return invalid(msg)
        return c

    def expiry(self, ctx: Ctx, q: Queue, ttl_ms: int | None) -> int | None:
        """Absolute expiry from the queue TTL and the message TTL (TTL 0 -> now + 1)."""
        qttl = q.config.message_ttl_ms
        if ttl_ms is None:
            if qttl is None:
                return None
            ttl = qttl
        else:
            ttl = ttl_ms if qttl is None else min(ttl_ms, qttl)
        return ctx.now + (ttl or 1)

    def store(self, ctx: Ctx, q: Queue, m: Message) -> None:
        """Append a message to the ready queue."""
        q.ready.append(m)
        q.messages_total += 1
        q.bytes_ready += len(m.body)

    def over_limit(self, q: Queue) -> bool:
        """Ready + returned messages above max_length, or their bytes above max_bytes."""
        ml, mb = q.config.max_length, q.config.max_bytes
        return (ml is not None and len(q.ready) + len(q.returns) > ml) or (
            mb is not None and q.bytes_ready > mb
        )

    def below_soft_limit(self, q: Queue) -> bool:
        """At or below 80% of every set limit."""
        ml, mb = q.config.max_length, q.config.max_bytes
        return (ml is None or len(q.ready) + len(q.returns) <= ml * 8 // 10) and (
            mb is None or q.bytes_ready <= mb * 8 // 10
        )

    def evaluate_limit(self, ctx: Ctx, q: Queue) -> None:
        """drop_head drops from the head; reject_publish blocks and later unblocks enqueuers."""
        if q.config.overflow == "drop_head":
            dropped: list[Message] = []
            while self.over_limit(q):
                m = self.pop_head(q)
                if m is None:
                    break
                dropped.append(m)
            self.dead_letter(ctx, q, dropped, "maxlen")
        elif self.over_limit(q):
            for en in q.enqueuers.values():
                if en.blocked is None and en.connection is not None and en.status != "down":
                    en.blocked = ctx.index
                    q.blocked_count += 1
                    ctx.effects.append(
                        QueueStatus(en.connection, q.name, en.name, "reject_publish")
                    )
            return
        if q.blocked_count and self.below_soft_limit(q):
            self.unblock_all(ctx, q)

    def unblock_all(self, ctx: Ctx, q: Queue) -> None:
        """Tell every blocked enqueuer to go on publishing."""
        for en in q.enqueuers.values():
            if en.blocked is not None:
                en.blocked = None
                if en.connection is not None and en.status != "down":
                    ctx.effects.append(QueueStatus(en.connection, q.name, en.name, "go"))
        q.blocked_count = 0

    def pop_head(self, q: Queue) -> Message | None:
        """Take the next message in delivery order (returns first), fixing the byte counter."""
        src = q.returns if q.returns else q.ready
        if not src:
            return None
        m: Message = src.popleft()  # type: ignore[assignment]  # v1-v3: never a v4 packed int
        q.bytes_ready -= len(m.body)
        return m

    def dead_letter(self, ctx: Ctx, q: Queue, msgs: list[Message], reason: Any) -> None:
        """Messages leave `q`: enqueue them into the dead-letter target, or drop them."""
        if not msgs:
            return
        q.messages_total -= len(msgs)
        name = q.config.dead_letter_queue
        target = ctx.state.queues.get(name) if name is not None else None
        if target is None or ctx.depth >= limits.dead_letter_hops_max:
            ctx.effects.append(DeadLettered(q.name, reason, len(msgs), None))
            return
        for m in msgs:
            new = Message(m.body, self.expiry(ctx, target, None))
            # the copy keeps how often the message failed (rabbit_fifo's annotate_msg); the
            # target's own delivery limit and `redelivered` flag count from these values on
            new.delivery_count, new.acquired_count = m.delivery_count, m.acquired_count
            kept = tuple(a for a in m.annotations if a[0] not in DEATH_KEYS)
            anns = (*kept, ("x-death-reason", reason), ("x-death-queue", q.name))
            new.annotations = anns[-limits.annotations_per_message_max :]
            self.store(ctx, target, new)
        if ctx.dirty is None:
            ctx.dirty = [target]
        elif not any(d is target for d in ctx.dirty):
            ctx.dirty.append(target)
        ctx.effects.append(DeadLettered(q.name, reason, len(msgs), name))

    def process_dirty(self, ctx: Ctx) -> None:
        """Deliver and apply limits in dead-letter targets, one hop per round (bounded)."""
        while ctx.dirty:
            ctx.depth += 1
            batch, ctx.dirty = ctx.dirty, None
            for target in batch:
                self.after_change(ctx, target)

    def expire_head(self, ctx: Ctx, q: Queue) -> None:
        """Shallow expiry: drop the expired prefix of returns and of ready."""
        now = ctx.now
        expired: list[Message] = []
        for src in (q.returns, q.ready):  # (v1-v3 deques hold Messages, never v4 packed ints)
            while src and src[0].expiry is not None and src[0].expiry <= now:  # type: ignore[union-attr]
                m: Message = src.popleft()  # type: ignore[assignment]
                q.bytes_ready -= len(m.body)
                expired.append(m)
        self.dead_letter(ctx, q, expired, "expired")

    def take(self, ctx: Ctx, q: Queue) -> Message | None:
        """Next message to hand out, expiring an expired head first."""
        src = q.returns if q.returns else q.ready
        if not src:
            return None
        exp = src[0].expiry  # type: ignore[union-attr]  # v1-v3: never a v4 packed int
        if exp is not None and exp <= ctx.now:
            self.expire_head(ctx, q)
            src = q.returns if q.returns else q.ready
            if not src:
                return None
        m: Message = src.popleft()  # type: ignore[assignment]  # v1-v3: never a v4 packed int
        q.bytes_ready -= len(m.body)
        return m

    def eligible(self, c: Consumer) -> bool:
        """Can this consumer receive a message now?"""
        return c.credit > 0 and c.status == "up" and c.suspected_since is None and not c.timed_out

    def service_add(self, q: Queue, c: Consumer) -> None:
        """Queue a consumer for delivery if it can take messages."""
        if not c.in_service and self.eligible(c) and q.consumers.get(c.key) is c:
            c.in_service = True
            ring = q.service.get(c.priority)
            if ring is None:
                ring = q.service[c.priority] = deque()
            ring.append(c.key)

    def service_remove(self, q: Queue, c: Consumer) -> None:
        """Take a consumer out of the service ring (it leaves or changes priority)."""
        if c.in_service:
            ring = q.service[c.priority]
            ring.remove(c.key)
            if not ring:
                del q.service[c.priority]
            c.in_service = False

    def next_consumer(self, q: Queue) -> Consumer | None:
        """Highest priority eligible consumer at the front of its ring."""
        service = q.service
        consumers = q.consumers
        while service:
            prio = next(iter(service)) if len(service) == 1 else max(service)
            ring = service[prio]
            while ring:
                c = consumers.get(ring[0])
                if (c is not None and c.credit > 0 and c.status == "up"
                        and c.suspected_since is None and not c.timed_out):  # fmt: skip
                    return c
                ring.popleft()
                if c is not None:
                    c.in_service = False
            del service[prio]
        return None

    def deliver(self, ctx: Ctx, q: Queue) -> None:
        """Hand out ready messages to consumers with credit, round robin within a priority."""
        batches: dict[ConsumerKey, list[Delivery]] = {}
        owners: list[Consumer] = []
        locks = self.uses_locks
        while q.returns or q.ready:
            c = self.next_consumer(q)
            if c is None:
                break
            m = self.take(ctx, q)
            if m is None:
                break
            mid = c.next_msg_id
            c.next_msg_id = mid + 1
            c.checked_out[mid] = m
            if locks:
                m.lock = ctx.now + c.timeout_ms
            c.credit -= 1
            c.delivery_count = (c.delivery_count + 1) % SERIAL
            q.bytes_checkout += len(m.body)
            d = fast_delivery(mid, m.body, m.acquired_count > 0 or m.delivery_count > 0,
                              m.delivery_count, m.annotations)  # fmt: skip
            batch = batches.get(c.key)
            if batch is None:
                batches[c.key] = [d]
                owners.append(c)
            else:
                batch.append(d)
            ring = q.service[c.priority]
            ring.popleft()
            if c.credit > 0:
                ring.append(c.key)
            else:
                c.in_service = False
                if not ring:
                    del q.service[c.priority]
        for c in owners:
            ctx.effects.append(
                fast_deliver(c.connection, q.name, c.tag, c.key, tuple(batches[c.key]))
            )

    def after_change(self, ctx: Ctx, q: Queue) -> None:
        """After anything that may free credit or add messages: activate, deliver, limits."""
        cfg = q.config
        if cfg.single_active_consumer:
            self.activate_next(ctx, q)
        if q.service and (q.ready or q.returns):
            self.deliver(ctx, q)
        if cfg.max_length is not None or cfg.max_bytes is not None or q.blocked_count:
            self.evaluate_limit(ctx, q)

    def activate_next(self, ctx: Ctx, q: Queue) -> None:
        """SAC activation hook (see QueueConsumers)."""

    def over_delivery_limit(self, q: Queue, m: Message) -> bool:
        """v1: every acquisition counts towards the delivery limit."""
        limit = q.config.delivery_limit
        return limit is not None and m.acquired_count > limit

    def return_msgs(
        self,
        ctx: Ctx,
        q: Queue,
        c: Consumer,
        ids: Iterable[int],
        delivery_failed: bool,
        annotations: tuple[tuple[str, str | int], ...] = (),
    ) -> int:
        """Move checked-out messages to the returns queue (or dead-letter them over the limit)."""
        over: list[Message] = []
        n = 0
        for i in ids:
            m = c.checked_out.pop(i, None)
            if m is None:
                continue
            n += 1
            size = len(m.body)
            q.bytes_checkout -= size
            m.lock = 0
            m.acquired_count += 1
            if delivery_failed:
                m.delivery_count += 1
            if annotations:
                m.annotations = merge_annotations(m.annotations, annotations)
            if self.over_delivery_limit(q, m):
                over.append(m)
            else:
                q.returns.append(m)
                q.bytes_ready += size
        self.dead_letter(ctx, q, over, "delivery_limit")
        return n

    def return_all(self, ctx: Ctx, q: Queue, c: Consumer, delivery_failed: bool) -> int:
        """Return every checked-out message of a consumer in msg-id order."""
        return self.return_msgs(ctx, q, c, sorted(c.checked_out), delivery_failed)

    def discard_msgs(
        self,
        ctx: Ctx,
        q: Queue,
        c: Consumer,
        ids: tuple[int, ...],
        delivery_failed: bool,
        annotations: tuple[tuple[str, str | int], ...],
    ) -> int:
        """Take messages from a consumer and dead-letter them with reason `rejected`."""
        gone: list[Message] = []
        for i in ids:
            m = c.checked_out.pop(i, None)
            if m is None:
                continue
            q.bytes_checkout -= len(m.body)
            m.acquired_count += 1
            if delivery_failed:
                m.delivery_count += 1
            if annotations:
                m.annotations = merge_annotations(m.annotations, annotations)
            gone.append(m)
        self.dead_letter(ctx, q, gone, "rejected")
        return len(gone)

