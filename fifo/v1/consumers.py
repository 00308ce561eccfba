"""Machine v1 consumers: checkout, SAC activation, cancel and dequeue. Frozen with v1."""

from __future__ import annotations

from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Cancel,
    Checkout,
    ConsumerId,
    ConsumerKey,
    Credited,
    Dequeue,
    Remove,
    SimplePrefetch,
)
from fifo.effects import (
    ConsumerCancelled,
    ConsumerUpdate,
)
from fifo.replies import (
    CancelOk,
    CheckoutOk,
    DequeuedMessage,
    DequeueOk,
    Error,
    Reply,
)
from fifo.shared import SERIAL, Ctx, invalid, unknown_consumer
from fifo.state import Consumer, Queue
from fifo.v1.core import QueueCore


class QueueConsumers(QueueCore):
    """Consumer registration and single-active-consumer rules of machine version 1."""

    def new_key(self, ctx: Ctx, consumer: ConsumerId) -> ConsumerKey:
        """v1 keys a consumer by its id."""
        return consumer

    def checkout(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """Attach or update a consumer, cancel or remove one, or dequeue one message."""
        err = v.consumer_id_error(cmd.consumer)
        if err:
            return invalid(err)
        spec = cmd.spec
        if type(spec) is Cancel:
            return self.cancel(ctx, q, cmd)
        if type(spec) is Dequeue:
            return self.dequeue(ctx, q, cmd)
        if type(spec) is Remove:
            return self.remove(ctx, q, cmd)
        if type(spec) is SimplePrefetch:
            if not v.int_in(spec.prefetch, 0, limits.prefetch_max):
                return invalid(f"prefetch must be 0..{limits.prefetch_max}")
        elif type(spec) is Credited:
            if not v.int_in(spec.initial_delivery_count, 0, SERIAL - 1):
                return invalid("initial_delivery_count must be a 32-bit serial number")
        else:
            return invalid("unknown checkout spec")
        if not v.int_in(cmd.priority, -limits.priority_abs_max, limits.priority_abs_max):
            return invalid("priority out of range")
        if not v.opt_int_in(cmd.timeout_ms, 1, limits.timeout_ms_max):
            return invalid("timeout_ms out of range")
        return self.consume(ctx, q, cmd)

    def remove(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """v1 has no hard cancel."""
        return Error("unknown_command", "remove is not supported by machine version 1")

    def consume(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """Register (or update) a competing or SAC consumer, then deliver."""
        c = self.resolve(q, cmd.consumer)
        if c is None:
            if len(q.consumers) + len(q.waiting) >= limits.consumers_per_queue_max:
                return Error("unsupported", "consumers_per_queue_max reached")
            key = self.new_key(ctx, cmd.consumer)
            if key in q.consumers or any(w.key == key for w in q.waiting):
                return invalid("consumer key already in use")
            c = Consumer(key, cmd.consumer.tag, cmd.consumer.connection, ctx.index)
            self.configure(q, c, cmd, fresh=True)
            q.key_by_id[cmd.consumer] = key
            if q.config.single_active_consumer:
                self.add_waiting(q, c)
            else:
                q.consumers[key] = c
        else:
            was = c.status
            self.service_remove(q, c)
            self.configure(q, c, cmd, fresh=False)
            if q.config.single_active_consumer:
                self.sac_reattach(ctx, q, c, was)
        if q.config.single_active_consumer:
            self.activate_next(ctx, q)
        self.service_add(q, c)
        reply = CheckoutOk(c.key, c.next_msg_id, c.credit, c.delivery_count,
                           self.is_active(q, c), len(c.checked_out))  # fmt: skip
        self.after_change(ctx, q)
        return reply

    def configure(self, q: Queue, c: Consumer, cmd: Checkout, fresh: bool) -> None:
        """Apply a checkout spec: credit mode, prefetch, priority, timeout; status up."""
        spec = cmd.spec
        c.credited = type(spec) is Credited
        c.prefetch = spec.prefetch if isinstance(spec, SimplePrefetch) else 0
        c.priority = cmd.priority
        c.timeout_ms = cmd.timeout_ms or q.config.consumer_timeout_ms
        c.status = "up"
        c.once = False
        c.credit = max(0, c.prefetch - len(c.checked_out))
        if fresh and isinstance(spec, Credited):
            c.delivery_count = spec.initial_delivery_count

    def is_active(self, q: Queue, c: Consumer) -> bool:
        """Competing: up and not cancelled; SAC: the active consumer."""
        if q.consumers.get(c.key) is not c:
            return False
        return c.status in ("up", "quiescing")

    def active(self, q: Queue) -> Consumer | None:
        """The SAC active consumer (up or quiescing, suspected or not)."""
        for c in q.consumers.values():
            if c.status in ("up", "quiescing"):
                return c
        return None

    def add_waiting(self, q: Queue, c: Consumer) -> None:
        """v1: waiting consumers queue in attach order."""
        q.waiting.append(c)

    def resort_waiting(self, q: Queue) -> None:
        """v1 keeps attach order."""

    def sac_reattach(self, ctx: Ctx, q: Queue, c: Consumer, was: str) -> None:
        """A known consumer checks out again: update in place, revive, or make it wait."""
        if q.consumers.get(c.key) is not c:
            self.resort_waiting(q)
            return
        if was in ("up", "quiescing"):
            return
        for other in q.consumers.values():
            if other is not c and other.status in ("up", "quiescing"):
                # a cancelled consumer coming back while another is active waits (with pending)
                self.service_remove(q, c)
                del q.consumers[c.key]
                self.add_waiting(q, c)
                return
        ctx.effects.append(
            ConsumerUpdate(c.connection, q.name, c.tag, c.key, True, "single_active")
        )

    def waiting_eligible(self, c: Consumer) -> bool:
        """A waiting consumer that may be activated."""
        return c.suspected_since is None and not c.timed_out and c.status == "up"

    def activate_next(self, ctx: Ctx, q: Queue) -> None:
        """v1: with no active consumer, activate the first eligible waiting one."""
        if self.active(q) is not None:
            return
        self.activate_first_waiting(ctx, q)

    def activate_first_waiting(self, ctx: Ctx, q: Queue) -> None:
        """Move the first eligible waiting consumer into the active slot."""
        for i, w in enumerate(q.waiting):
            if self.waiting_eligible(w):
                del q.waiting[i]
                q.consumers[w.key] = w
                ctx.effects.append(
                    ConsumerUpdate(w.connection, q.name, w.tag, w.key, True, "single_active")
                )
                self.service_add(q, w)
                return

    def to_waiting(self, ctx: Ctx, q: Queue, c: Consumer, notify: bool) -> None:
        """Move the active SAC consumer to the waiting list."""
        self.service_remove(q, c)
        del q.consumers[c.key]
        c.status = "up"
        self.add_waiting(q, c)
        if notify:
            ctx.effects.append(ConsumerUpdate(c.connection, q.name, c.tag, c.key, False, "waiting"))

    def cancel(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """Soft cancel: no new messages; the consumer leaves once its pending ones are done."""
        c = self.resolve(q, cmd.consumer)
        if c is None:
            return unknown_consumer(cmd.consumer)
        if q.consumers.get(c.key) is not c:
            if not c.checked_out:
                self.drop_waiting(ctx, q, c, "cancel")
                self.after_change(ctx, q)
                return CancelOk(None, 0)
            # a waiting consumer still holding messages (a cancelled one that checked out again)
            # keeps them until they are settled or returned, like any cancelled consumer
            q.waiting.remove(c)
            q.consumers[c.key] = c
        if c.status != "cancelled":
            self.service_remove(q, c)
            c.status, c.once, c.credit = "cancelled", True, 0
            ctx.effects.append(ConsumerCancelled(c.connection, q.name, c.tag, c.key, "cancel"))
        q.last_active = ctx.now
        n = len(c.checked_out)
        if not n:
            self.drop_consumer(q, c)
        self.after_change(ctx, q)
        return CancelOk(c.key if n else None, n)

    def drop_consumer(self, q: Queue, c: Consumer) -> None:
        """Forget a consumer of `q.consumers`."""
        self.service_remove(q, c)
        del q.consumers[c.key]
        q.key_by_id.pop(ConsumerId(c.tag, c.connection), None)

    def drop_waiting(
        self, ctx: Ctx, q: Queue, c: Consumer, reason: Any, delivery_failed: bool = False
    ) -> None:
        """Forget a waiting SAC consumer (returning anything it still holds)."""
        if c.checked_out:
            self.return_all(ctx, q, c, delivery_failed=delivery_failed)
        q.waiting.remove(c)
        q.key_by_id.pop(ConsumerId(c.tag, c.connection), None)
        ctx.effects.append(ConsumerCancelled(c.connection, q.name, c.tag, c.key, reason))

    def dequeue(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """basic.get: one message; settled at once, or held by a once-consumer until settled."""
        assert isinstance(cmd.spec, Dequeue)
        if not v.is_bool(cmd.spec.settled):
            return invalid("settled must be a bool")
        if q.config.single_active_consumer:
            return Error(
                "unsupported", "dequeue is not supported on a single active consumer queue"
            )
        if self.resolve(q, cmd.consumer) is not None:
            # the id names a consumer already on the queue: `empty`, nothing changes (rabbit_fifo)
            return DequeueOk(None, len(q.ready) + len(q.returns))
        if not cmd.spec.settled:
            if len(q.consumers) + len(q.waiting) >= limits.consumers_per_queue_max:
                return Error("unsupported", "consumers_per_queue_max reached")
            key = self.new_key(ctx, cmd.consumer)
            if key in q.consumers:
                return invalid("consumer key already in use")
        q.last_active = ctx.now
        m = self.take(ctx, q)
        if m is None:
            return DequeueOk(None, 0)
        msg = DequeuedMessage(0, m.body, m.delivery_count,
                              m.acquired_count > 0 or m.delivery_count > 0)  # fmt: skip
        if cmd.spec.settled:
            q.messages_total -= 1
            self.after_change(ctx, q)
            return DequeueOk(msg, len(q.ready) + len(q.returns))
        c = Consumer(key, cmd.consumer.tag, cmd.consumer.connection, ctx.index)
        c.once, c.prefetch, c.next_msg_id = True, 1, 1
        c.timeout_ms = cmd.timeout_ms or q.config.consumer_timeout_ms
        c.checked_out[0] = m
        if self.uses_locks:
            m.lock = ctx.now + c.timeout_ms
        c.delivery_count = 1
        q.bytes_checkout += len(m.body)
        q.consumers[key] = c
        q.key_by_id[cmd.consumer] = key
        self.after_change(ctx, q)
        return DequeueOk(msg, len(q.ready) + len(q.returns), key)

    def untimeout(self, q: Queue, c: Consumer, ids: tuple[int, ...]) -> None:
        """v1 has no consumer timeouts."""

    def consumer_done(self, ctx: Ctx, q: Queue, c: Consumer, n: int) -> None:
        """After `n` messages left a consumer: refill, remove or hand over, then deliver."""
        if n and not c.credited and not c.once:
            c.credit = min(c.prefetch, c.credit + n)
        if q.consumers.get(c.key) is c:
            if c.once and not c.checked_out and c.credit == 0:
                self.drop_consumer(q, c)
                q.last_active = ctx.now
            elif c.status == "quiescing" and not c.checked_out:
                self.to_waiting(ctx, q, c, notify=True)
            else:
                self.service_add(q, c)
        elif n:
            self.resort_waiting(q)  # a waiting holder's credit rose: v2 orders by credit
        self.after_change(ctx, q)
