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

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Cancel,
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    Credit,
    Credited,
    Dequeue,
    Discard,
    Enqueue,
    Expire,
    NodeDown,
    NodeUp,
    Purge,
    RegisterEnqueuer,
    Remove,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import (
    ConsumerCancelled,
    ConsumerUpdate,
    CreditReply,
    DeadLettered,
    Delivery,
    Effect,
    QueueStatus,
)
from fifo.fastbuild import deliver as fast_deliver
from fifo.fastbuild import delivery as fast_delivery
from fifo.fastbuild import fresh_delivery
from fifo.replies import (
    CancelOk,
    CheckoutOk,
    DequeuedMessage,
    DequeueOk,
    Error,
    NotEnqueued,
    Ok,
    PurgeOk,
    RejectPublish,
    Reply,
)
from fifo.state import Consumer, Enqueuer, Message, Queue, State

OK = Ok()
SERIAL = limits.serial_modulus
DEATH_KEYS = ("x-death-reason", "x-death-queue")


class Ctx:
    """What one `apply` works with: the state, the entry's index and time, the effects."""

    __slots__ = ("depth", "dirty", "effects", "index", "now", "state")

    def __init__(self, state: State, index: int, now: int) -> None:
        self.state = state
        self.index = index
        self.now = now
        self.effects: list[Effect] = []
        self.depth = 0  # dead-letter hops within this apply
        # dead-letter targets that received messages: processed after the command's own queue,
        # never re-entrantly (a queue's delivery loop must not run inside another's)
        self.dirty: list[Queue] | None = None


def invalid(message: str) -> Error:
    """An invalid_argument error reply."""
    return Error("invalid_argument", message)


def key_text(key: object) -> str:
    """A consumer key for messages: `tag@node/incarnation/number` or the index."""
    if type(key) is ConsumerId:
        conn = key.connection
        return f"{key.tag}@{conn.node}/{conn.incarnation}/{conn.number}"
    return repr(key)


def unknown_consumer(key: object) -> Error:
    """An unknown_consumer error reply."""
    return Error("unknown_consumer", f"no consumer {key_text(key)}")


class QueueMachineV1:
    """Per-queue command handlers of machine version 1."""

    version = 1
    uses_locks = False  # v2 records a consumer-timeout lock on every checked-out message

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

    # --- keys and lookups ---------------------------------------------------------------------

    def new_key(self, ctx: Ctx, consumer: ConsumerId) -> ConsumerKey:
        """v1 keys a consumer by its id."""
        return consumer

    def resolve(self, q: Queue, key: object) -> Consumer | None:
        """Find a consumer (active or waiting) by key or id; None if unknown."""
        if type(key) is ConsumerId:
            k = q.key_by_id.get(key)
            if k is None:
                return None
        elif type(key) is int and self.version >= 2:
            k = key
        else:
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

    # --- enqueue ------------------------------------------------------------------------------

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

    # --- limits -------------------------------------------------------------------------------

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
        m = src.popleft()
        q.bytes_ready -= len(m.body)
        return m

    # --- dead-lettering and expiry ------------------------------------------------------------

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
        for src in (q.returns, q.ready):
            while src and src[0].expiry is not None and src[0].expiry <= now:
                m = src.popleft()
                q.bytes_ready -= len(m.body)
                expired.append(m)
        self.dead_letter(ctx, q, expired, "expired")

    def take(self, ctx: Ctx, q: Queue) -> Message | None:
        """Next message to hand out, expiring an expired head first."""
        src = q.returns if q.returns else q.ready
        if not src:
            return None
        exp = src[0].expiry
        if exp is not None and exp <= ctx.now:
            self.expire_head(ctx, q)
            src = q.returns if q.returns else q.ready
            if not src:
                return None
        m = src.popleft()
        q.bytes_ready -= len(m.body)
        return m

    def expire(self, ctx: Ctx, q: Queue, cmd: Expire) -> Reply:
        """Leader timer: dead-letter expired head messages, then deliver."""
        self.expire_head(ctx, q)
        self.after_change(ctx, q)
        return OK

    # --- delivery -----------------------------------------------------------------------------

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

    # --- consumers: checkout ------------------------------------------------------------------

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

    # --- SAC ----------------------------------------------------------------------------------

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

    # --- consumers: cancel, dequeue -----------------------------------------------------------

    def cancel(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """Soft cancel: no new messages; the consumer leaves once its pending ones are done."""
        c = self.resolve(q, cmd.consumer)
        if c is None:
            return unknown_consumer(cmd.consumer)
        if q.consumers.get(c.key) is not c:
            self.drop_waiting(ctx, q, c, "cancel")
            self.after_change(ctx, q)
            return CancelOk(None, 0)
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

    def drop_waiting(self, ctx: Ctx, q: Queue, c: Consumer, reason: Any) -> None:
        """Forget a waiting SAC consumer (returning anything it still holds)."""
        if c.checked_out:
            self.return_all(ctx, q, c, delivery_failed=False)
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
        if not cmd.spec.settled:
            if self.resolve(q, cmd.consumer) is not None:
                return DequeueOk(None, len(q.ready) + len(q.returns))
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

    # --- settle, return, discard --------------------------------------------------------------

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
        self.after_change(ctx, q)

    def return_(self, ctx: Ctx, q: Queue, cmd: Return) -> Reply:
        """Give messages back to the returns queue, in the order listed."""
        c, err = self.find_key(q, cmd.consumer_key)
        if c is None:
            return err or unknown_consumer(cmd.consumer_key)
        if msg := v.msg_ids_error(cmd.msg_ids):
            return invalid(msg)
        self.untimeout(q, c, cmd.msg_ids)
        n = self.return_msgs(ctx, q, c, cmd.msg_ids, delivery_failed=False)
        self.consumer_done(ctx, q, c, n)
        return OK

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

    def discard(self, ctx: Ctx, q: Queue, cmd: Discard) -> Reply:
        """Reject messages: a failed delivery; they are dead-lettered in the order given."""
        c, err = self.find_key(q, cmd.consumer_key)
        if c is None:
            return err or unknown_consumer(cmd.consumer_key)
        if msg := v.msg_ids_error(cmd.msg_ids):
            return invalid(msg)
        self.untimeout(q, c, cmd.msg_ids)
        n = self.discard_msgs(ctx, q, c, cmd.msg_ids, True, ())
        self.consumer_done(ctx, q, c, n)
        return OK

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

    # --- credit -------------------------------------------------------------------------------

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

    # --- purge --------------------------------------------------------------------------------

    def purge(self, ctx: Ctx, q: Queue, cmd: Purge) -> Reply:
        """Drop every ready and returned message; checked-out ones stay."""
        count = len(q.ready) + len(q.returns)
        q.ready.clear()
        q.returns.clear()
        q.bytes_ready = 0
        q.messages_total -= count
        self.after_change(ctx, q)
        return PurgeOk(count)

    # --- connections and nodes ----------------------------------------------------------------

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
            self.drop_waiting(ctx, q, w, "down")
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
            if match(w.connection) and w.suspected_since is None:
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


def merge_annotations(
    old: tuple[tuple[str, str | int], ...], new: tuple[tuple[str, str | int], ...]
) -> tuple[tuple[str, str | int], ...]:
    """Later annotations replace earlier ones with the same key; order of first appearance."""
    merged = dict(old)
    merged.update(new)
    out = tuple(merged.items())
    return out[-limits.annotations_per_message_max :]
