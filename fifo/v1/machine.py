"""Machine version 1 ("classic"): per-queue semantics, frozen once shipped.

Consumers are keyed by their ConsumerId; SAC has no priorities (first attached is active);
`noconnection` returns a consumer's messages at once; the delivery limit counts every return
(acquisitions); there are no consumer timeouts, no `remove` and no `modify`.

Departure from rabbit_fifo (both versions): an enqueuer is a client-chosen publisher id, bound to
the connection it last used. A `normal` ConnectionDown marks it down but KEEPS its next_seq, so a
client that reconnects (possibly through another node) and resends is deduplicated. To bound
memory, a queue holds at most `enqueuers_per_queue_max` enqueuers: when a new one arrives at the
cap, the down enqueuer that went down first (lowest index, then name) is evicted; if none is down
the enqueue is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    Credit,
    Discard,
    Enqueue,
    Expire,
    NodeDown,
    NodeUp,
    Purge,
    RegisterEnqueuer,
    Return,
    Settle,
)
from fifo.effects import (
    ConsumerCancelled,
    ConsumerUpdate,
    CreditReply,
)
from fifo.fastbuild import deliver as fast_deliver
from fifo.fastbuild import fresh_delivery
from fifo.replies import (
    Error,
    NotEnqueued,
    PurgeOk,
    RejectPublish,
    Reply,
)
from fifo.shared import OK, SERIAL, Ctx, invalid, unknown_consumer
from fifo.state import Consumer, Enqueuer, Message, Queue
from fifo.v1.consumers import QueueConsumers


class QueueMachineV1(QueueConsumers):
    """Per-queue command handlers of machine version 1."""

    def __init__(self) -> None:
        self.handlers: dict[type, Callable[[Ctx, Queue, Any], Reply]] = {
            Enqueue: self.enqueue,
            RegisterEnqueuer: self.register_enqueuer,
            Checkout: self.checkout,
            Settle: self.settle,
            Return: self.return_,
            Discard: self.discard,
            Credit: self.credit,
            Purge: self.purge,
            Expire: self.expire,
        }

    def enqueue(self, ctx: Ctx, q: Queue, cmd: Enqueue) -> Reply:
        """Store a message (with enqueuer dedup), deliver, then apply the length limits."""
        body = cmd.body
        if type(body) is not bytes or len(body) > limits.body_bytes_max:
            return invalid(f"body must be bytes of at most {limits.body_bytes_max}")
        ttl = cmd.ttl_ms
        if ttl is not None and not v.int_in(ttl, 0, limits.ttl_ms_max):
            return invalid("ttl_ms out of range")
        if cmd.enqueuer is not None or cmd.seq is not None:
            reply = self.track_enqueue(ctx, q, cmd)
            if reply is not None:
                return reply
        cfg = q.config
        m = Message(body, None)
        if ttl is not None or cfg.message_ttl_ms is not None:
            m.expiry = self.expiry(ctx, q, ttl)
        q.messages_total += 1
        if q.service and not q.ready and not q.returns:
            c = self.next_consumer(q)
            if c is not None:  # fast path: hand the new message straight to a consumer
                self.assign_one(ctx, q, c, m)
                if q.blocked_count or cfg.max_length is not None or cfg.max_bytes is not None:
                    self.evaluate_limit(ctx, q)
                return OK
        q.ready.append(m)
        q.bytes_ready += len(body)
        if q.service:
            self.deliver(ctx, q)
        if cfg.max_length is not None or cfg.max_bytes is not None or q.blocked_count:
            self.evaluate_limit(ctx, q)
        return OK

    def assign_one(self, ctx: Ctx, q: Queue, c: Consumer, m: Message) -> None:
        """Deliver one never-delivered message to `c`, at the front of its service ring."""
        mid = c.next_msg_id
        c.next_msg_id = mid + 1
        c.checked_out[mid] = m
        if self.uses_locks:
            m.lock = ctx.now + c.timeout_ms
        credit = c.credit - 1
        c.credit = credit
        c.delivery_count = (c.delivery_count + 1) & 0xFFFFFFFF
        body = m.body
        q.bytes_checkout += len(body)
        ring = q.service[c.priority]
        if credit > 0:
            ring.rotate(-1)
        else:
            ring.popleft()
            c.in_service = False
            if not ring:
                del q.service[c.priority]
        # fast constructors: equal to Deliver(...) / Delivery(mid, body, False, 0)
        ctx.effects.append(
            fast_deliver(c.connection, q.name, c.tag, c.key, (fresh_delivery(mid, body),))
        )

    def track_enqueue(self, ctx: Ctx, q: Queue, cmd: Enqueue) -> Reply | None:
        """Dedup by (enqueuer, seq): None means store the message, else the reply to give."""
        err = v.name_error(cmd.enqueuer, "enqueuer", limits.enqueuer_name_bytes_max)
        if err:
            return invalid(err)
        if not v.int_in(cmd.seq, 1, limits.seq_max):
            return invalid("seq must be an int >= 1 when enqueuer is set")
        if cmd.connection is not None and (err := v.connection_error(cmd.connection)):
            return invalid(err)
        assert cmd.enqueuer is not None and cmd.seq is not None
        en = q.enqueuers.get(cmd.enqueuer)
        if en is None:
            en_or_err = self.add_enqueuer(ctx, q, cmd.enqueuer, cmd.connection)
            if isinstance(en_or_err, Error):
                return en_or_err
            en = en_or_err
        elif cmd.connection is not None:
            self.bind_enqueuer(q, en, cmd.connection)
        if cmd.seq == en.next_seq:
            en.next_seq += 1
            return None
        if cmd.seq > en.next_seq:
            return NotEnqueued(en.next_seq)
        return OK  # duplicate: already stored

    def add_enqueuer(
        self, ctx: Ctx, q: Queue, name: str, connection: ConnectionId | None
    ) -> Enqueuer | Error:
        """Create an enqueuer, evicting the earliest-down one at the cap."""
        if len(q.enqueuers) >= limits.enqueuers_per_queue_max:
            down = [e for e in q.enqueuers.values() if e.status == "down"]
            if not down:
                return Error("unsupported", "enqueuers_per_queue_max reached")
            victim = min(down, key=lambda e: (e.down_index, e.name))
            if victim.blocked is not None:
                q.blocked_count -= 1
            del q.enqueuers[victim.name]
        en = Enqueuer(name, connection)
        q.enqueuers[name] = en
        return en

    def bind_enqueuer(self, q: Queue, en: Enqueuer, connection: ConnectionId) -> None:
        """(Re)bind an enqueuer to the connection it now publishes on."""
        en.connection = connection
        en.status = "up"

    def register_enqueuer(self, ctx: Ctx, q: Queue, cmd: RegisterEnqueuer) -> Reply:
        """Make an enqueuer known; RejectPublish while over a reject_publish limit."""
        err = v.name_error(cmd.enqueuer, "enqueuer", limits.enqueuer_name_bytes_max)
        err = err or v.connection_error(cmd.connection)
        if err:
            return invalid(err)
        en = q.enqueuers.get(cmd.enqueuer)
        if en is None:
            en_or_err = self.add_enqueuer(ctx, q, cmd.enqueuer, cmd.connection)
            if isinstance(en_or_err, Error):
                return en_or_err
            en = en_or_err
        else:
            self.bind_enqueuer(q, en, cmd.connection)
        if q.config.overflow == "reject_publish" and self.over_limit(q):
            if en.blocked is None:
                en.blocked = ctx.index
                q.blocked_count += 1
            return RejectPublish()
        return OK

    def expire(self, ctx: Ctx, q: Queue, cmd: Expire) -> Reply:
        """Leader timer: dead-letter expired head messages, then deliver."""
        self.expire_head(ctx, q)
        self.after_change(ctx, q)
        return OK

    def settle(self, ctx: Ctx, q: Queue, cmd: Settle) -> Reply:
        """Acknowledge messages; credit is refilled for simple_prefetch consumers."""
        key = cmd.consumer_key
        c = q.consumers.get(key) if type(key) is int or type(key) is ConsumerId else None
        if c is None:
            c, err = self.find_key(q, key)
            if c is None:
                return err or unknown_consumer(key)
        ids = cmd.msg_ids
        fast_ids = type(ids) is tuple and len(ids) == 1 and type(ids[0]) is int and ids[0] >= 0
        if not fast_ids and (msg := v.msg_ids_error(ids)):
            return invalid(msg)
        if c.timed_out:
            self.untimeout(q, c, ids)
        checked_out = c.checked_out
        n = 0
        for i in ids:
            m = checked_out.pop(i, None)
            if m is not None:
                n += 1
                q.bytes_checkout -= len(m.body)
        q.messages_total -= n
        if c.status == "up" and not c.once and not c.credited and q.consumers.get(c.key) is c:
            if n:  # fast path: a plain consumer acked; refill credit and hand out more
                c.credit = min(c.prefetch, c.credit + n)
            if not c.in_service:
                self.service_add(q, c)
            self.after_change(ctx, q)
        else:
            self.consumer_done(ctx, q, c, n)
        return OK

    def return_(self, ctx: Ctx, q: Queue, cmd: Return) -> Reply:
        """Give messages back to the returns queue, in the order listed."""
        c = self.holder(q, cmd.consumer_key, cmd.msg_ids)
        if isinstance(c, Error):
            return c
        self.untimeout(q, c, cmd.msg_ids)
        n = self.return_msgs(ctx, q, c, cmd.msg_ids, delivery_failed=False)
        self.consumer_done(ctx, q, c, n)
        return OK

    def discard(self, ctx: Ctx, q: Queue, cmd: Discard) -> Reply:
        """Reject messages: a failed delivery; they are dead-lettered in the order given."""
        c = self.holder(q, cmd.consumer_key, cmd.msg_ids)
        if isinstance(c, Error):
            return c
        self.untimeout(q, c, cmd.msg_ids)
        n = self.discard_msgs(ctx, q, c, cmd.msg_ids, True, ())
        self.consumer_done(ctx, q, c, n)
        return OK

    def credit(self, ctx: Ctx, q: Queue, cmd: Credit) -> Reply:
        """AMQP 1.0 flow: credit = receiver's delivery_count + credit - ours (serial numbers)."""
        c, err = self.find_key(q, cmd.consumer_key)
        if c is None:
            return err or unknown_consumer(cmd.consumer_key)
        if not v.int_in(cmd.credit, 0, SERIAL - 1):
            return invalid("credit must be 0..2**32-1")
        if not v.int_in(cmd.delivery_count, 0, SERIAL - 1):
            return invalid("delivery_count must be a 32-bit serial number")
        if not v.is_bool(cmd.drain):
            return invalid("drain must be a bool")
        if not c.credited:
            return Error("unsupported", "credit is only for credited consumers")
        diff = (cmd.delivery_count + cmd.credit - c.delivery_count) % SERIAL
        if diff >= SERIAL // 2:
            diff -= SERIAL  # receiver is behind: messages are in flight
        c.credit = 0 if c.once else max(0, diff)  # a cancelled consumer takes no new credit
        c.drain = cmd.drain
        active = q.consumers.get(c.key) is c
        if active:
            self.service_add(q, c)
            if q.service:
                self.deliver(ctx, q)
        if cmd.drain and c.credit > 0:
            c.delivery_count = (c.delivery_count + c.credit) % SERIAL
            c.credit = 0
        if not active:
            self.resort_waiting(q)
        available = len(q.ready) + len(q.returns) if active else 0
        ctx.effects.append(
            CreditReply(c.connection, q.name, c.tag, c.key, c.delivery_count, c.credit,
                        available, cmd.drain, active and self.is_active(q, c))
        )  # fmt: skip
        self.after_change(ctx, q)
        return OK

    def purge(self, ctx: Ctx, q: Queue, cmd: Purge) -> Reply:
        """Drop every ready and returned message; checked-out ones stay."""
        count = len(q.ready) + len(q.returns)
        q.ready.clear()
        q.returns.clear()
        q.bytes_ready = 0
        q.messages_total -= count
        self.after_change(ctx, q)
        return PurgeOk(count)

    def connection_down(self, ctx: Ctx, q: Queue, cmd: ConnectionDown) -> None:
        """A connection closed (`normal`) or is unreachable (`noconnection`)."""
        conn = cmd.connection
        if cmd.reason == "normal":
            self.down_normal(ctx, q, lambda x: x == conn)
        else:
            self.down_noconnection(ctx, q, lambda x: x == conn)

    def node_down(self, ctx: Ctx, q: Queue, cmd: NodeDown) -> None:
        """Every connection of the node is treated as `noconnection`."""
        node = cmd.node
        self.down_noconnection(ctx, q, lambda x: x.node == node)

    def down_normal(self, ctx: Ctx, q: Queue, match: Callable[[ConnectionId], bool]) -> None:
        """Enqueuers go down (keeping dedup); consumers leave with a failed delivery each."""
        self.enqueuers_status(ctx, q, match, "down")
        for w in [w for w in q.waiting if match(w.connection)]:
            self.drop_waiting(ctx, q, w, "down", delivery_failed=True)
        for c in [c for c in q.consumers.values() if match(c.connection)]:
            self.return_all(ctx, q, c, delivery_failed=True)
            self.drop_consumer(q, c)
            ctx.effects.append(ConsumerCancelled(c.connection, q.name, c.tag, c.key, "down"))
            q.last_active = ctx.now
        self.after_change(ctx, q)

    def enqueuers_status(
        self, ctx: Ctx, q: Queue, match: Callable[[ConnectionId], bool], status: str
    ) -> None:
        """Mark the enqueuers bound to matching connections."""
        for en in q.enqueuers.values():
            if en.connection is not None and match(en.connection) and en.status != "down":
                en.status = status
                if status == "down":
                    en.down_index = ctx.index

    def down_noconnection(self, ctx: Ctx, q: Queue, match: Callable[[ConnectionId], bool]) -> None:
        """v1: messages come back at once; consumers are suspected until their node is up."""
        self.enqueuers_status(ctx, q, match, "suspected")
        for w in q.waiting:
            if not match(w.connection):
                continue
            if w.checked_out:  # a waiting holder (cancelled, then back) gives its messages too
                self.return_all(ctx, q, w, delivery_failed=False)
                if not w.credited:
                    w.credit = w.prefetch
            if w.suspected_since is None:
                w.suspected_since = ctx.now
        for c in [c for c in q.consumers.values() if match(c.connection)]:
            self.return_all(ctx, q, c, delivery_failed=False)
            if c.once:
                self.drop_consumer(q, c)
                continue
            if c.suspected_since is None:
                c.suspected_since = ctx.now
                self.service_remove(q, c)
                ctx.effects.append(
                    ConsumerUpdate(c.connection, q.name, c.tag, c.key, False, "suspected_down")
                )
            if not c.credited:
                c.credit = c.prefetch
            if q.config.single_active_consumer:
                self.to_waiting(ctx, q, c, notify=False)
        q.last_active = ctx.now
        self.after_change(ctx, q)

    def node_up(self, ctx: Ctx, q: Queue, cmd: NodeUp) -> None:
        """Suspected consumers and enqueuers of the node are up again."""
        node = cmd.node
        for en in q.enqueuers.values():
            if (
                en.status == "suspected"
                and en.connection is not None
                and en.connection.node == node
            ):
                en.status = "up"
        for w in q.waiting:
            if w.suspected_since is not None and w.connection.node == node:
                w.suspected_since = None
                w.disconnected_fired = False
        self.resort_waiting(q)
        for c in q.consumers.values():
            if c.suspected_since is not None and c.connection.node == node:
                c.suspected_since = None
                c.disconnected_fired = False
                if not q.config.single_active_consumer:
                    status: Any = "timeout" if c.timed_out else "up"
                    ctx.effects.append(
                        ConsumerUpdate(c.connection, q.name, c.tag, c.key, not c.timed_out, status)
                    )
                self.service_add(q, c)
        self.after_change(ctx, q)

    def delete(self, ctx: Ctx, q: Queue) -> int:
        """The queue is deleted: tell every consumer; return the number of messages lost."""
        for c in (*q.consumers.values(), *q.waiting):
            ctx.effects.append(
                ConsumerCancelled(c.connection, q.name, c.tag, c.key, "queue_deleted")
            )
        return q.messages_total
