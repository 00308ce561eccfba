"""A small reference model of one fifo queue, for the Hypothesis stateful tests.

It is deliberately naive: lists of bodies and dicts, no service ring. It predicts which message is
delivered next (returns first, in the order they came back, then ready in enqueue order), credit
and consumer status; it lets the machine choose which consumer with credit gets a message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings

from fifo.commands import CONSUMER_TIMEOUT_MS_DEFAULT, ConnectionId, ConsumerId, ConsumerKey

SERIAL = 1 << 32


class ModelMismatch(AssertionError):
    """The machine did something the model says it must not."""


@dataclass
class ModelConsumer:
    """A simple_prefetch or credited consumer as the model sees it."""

    cid: ConsumerId
    prefetch: int  # 0 for a credited consumer
    credit: int
    status: str = "up"  # up | cancelled | suspected
    credited: bool = False
    delivery_count: int = 0  # the sender's, 32-bit serial
    held: dict[int, bytes] = field(default_factory=dict)  # msg id -> body
    timeout_ms: int = CONSUMER_TIMEOUT_MS_DEFAULT  # v2 consumer timeout
    locks: dict[int, int] = field(default_factory=dict)  # msg id -> lock expiry (v2)
    timed_out: set[int] = field(default_factory=set)  # ids taken back by a timeout (v2)
    suspected_since: int | None = None
    disconnected_fired: bool = False
    key: ConsumerKey | None = None  # the machine's key (v2: the checkout's index)

    def eligible(self) -> bool:
        """May receive new messages: up, not timed out (suspected consumers are not up)."""
        return self.status == "up" and not self.timed_out


@dataclass
class QueueModel:
    """One queue with competing consumers (simple_prefetch or credited), no limits, no DLX."""

    version: int
    ready: list[bytes] = field(default_factory=list)
    returns: list[bytes] = field(default_factory=list)
    consumers: dict[ConsumerId, ModelConsumer] = field(default_factory=dict)
    delivered_before: set[bytes] = field(default_factory=set)
    enqueuer_next: dict[str, int] = field(default_factory=dict)
    delivery_limit: int | None = None
    failed: dict[bytes, int] = field(default_factory=dict)  # failed deliveries per message
    acquired: dict[bytes, int] = field(default_factory=dict)  # times it came back
    dead_lettered: int = 0

    # --- what the model predicts -----------------------------------------------------------

    def ready_count(self) -> int:
        return len(self.ready) + len(self.returns)

    def checked_out_count(self) -> int:
        return sum(len(c.held) for c in self.consumers.values())

    def total(self) -> int:
        return self.ready_count() + self.checked_out_count()

    def can_deliver(self) -> bool:
        """Some message is ready and some up consumer has credit: the machine must deliver."""
        hungry = any(c.eligible() and c.credit > 0 for c in self.consumers.values())
        return hungry and self.ready_count() > 0

    # --- commands --------------------------------------------------------------------------

    def enqueue(self, body: bytes, enqueuer: str | None = None, seq: int | None = None) -> str:
        """Returns 'stored', 'duplicate' or 'gap' (the reply the machine must give)."""
        if enqueuer is not None and seq is not None:
            expected = self.enqueuer_next.get(enqueuer, 1)
            if seq < expected:
                return "duplicate"
            if seq > expected:
                return "gap"
            self.enqueuer_next[enqueuer] = seq + 1
        self.ready.append(body)
        return "stored"

    def checkout(self, cid: ConsumerId, prefetch: int, timeout_ms: int | None = None) -> None:
        existing = self.consumers.get(cid)
        timeout = CONSUMER_TIMEOUT_MS_DEFAULT if timeout_ms is None else timeout_ms
        if existing is None:
            self.consumers[cid] = ModelConsumer(cid, prefetch, prefetch, timeout_ms=timeout)
            return
        existing.timeout_ms = timeout
        existing.credit = max(0, prefetch - len(existing.held))
        existing.prefetch = prefetch
        if existing.status == "cancelled":
            existing.status = "up"

    def attach_credited(self, cid: ConsumerId, initial_delivery_count: int) -> None:
        """A new credited consumer: no credit until the receiver grants some."""
        self.consumers[cid] = ModelConsumer(cid, 0, 0, credited=True,
                                            delivery_count=initial_delivery_count)

    def grant_credit(self, cid: ConsumerId, credit: int, delivery_count: int) -> None:
        """AMQP 1.0 flow: credit = receiver's delivery_count + credit - ours (RFC 1982)."""
        consumer = self.consumers[cid]
        link = (delivery_count + credit - consumer.delivery_count) % SERIAL
        consumer.credit = max(0, link - SERIAL if link >= SERIAL // 2 else link)

    def drain(self, cid: ConsumerId) -> None:
        """After the deliveries of a drain: the rest of the credit is consumed."""
        consumer = self.consumers[cid]
        consumer.delivery_count = (consumer.delivery_count + consumer.credit) % SERIAL
        consumer.credit = 0

    def deliver_batch(
        self, batch: list[tuple[ConsumerId, int, bytes, bool, int]], now: int = 0
    ) -> None:
        """Check the deliveries of one command: the next k messages, in order per consumer.

        Effects of one command may come in any order (one Deliver per consumer), so only each
        consumer's own sequence has to follow the queue order.
        """
        queue = self.returns + self.ready
        head = queue[: len(batch)]
        if sorted(body for _, _, body, _, _ in batch) != sorted(head):
            raise ModelMismatch(f"delivered {[b for _, _, b, _, _ in batch]}, model expected "
                                f"{head}")
        last: dict[ConsumerId, int] = {}
        for cid, msg_id, body, redelivered, failed_count in batch:
            position = head.index(body)
            if position < last.get(cid, -1):
                raise ModelMismatch(f"{cid.tag} got {body!r} out of queue order")
            last[cid] = position
            self._deliver_one(cid, msg_id, body, redelivered, failed_count, now)
        for body in head:
            (self.returns if body in self.returns else self.ready).remove(body)

    def _deliver_one(
        self, cid: ConsumerId, msg_id: int, body: bytes, redelivered: bool, failed_count: int,
        now: int,
    ) -> None:
        consumer = self.consumers.get(cid)
        if consumer is None or not consumer.eligible() or consumer.credit <= 0:
            state = "unknown" if consumer is None else (
                f"{consumer.status}/{consumer.credit}/timed out {sorted(consumer.timed_out)}")
            raise ModelMismatch(f"delivery to {cid.tag} which is {state}")
        if redelivered != (body in self.delivered_before):
            raise ModelMismatch(f"{body!r} redelivered={redelivered}")
        if failed_count != self.failed.get(body, 0):
            raise ModelMismatch(f"{body!r} delivery_count {failed_count}, model "
                                f"{self.failed.get(body, 0)}")
        self.delivered_before.add(body)
        if msg_id in consumer.held:
            raise ModelMismatch(f"msg id {msg_id} reused for {cid.tag}")
        consumer.held[msg_id] = body
        consumer.locks[msg_id] = now + consumer.timeout_ms
        consumer.credit -= 1
        consumer.delivery_count = (consumer.delivery_count + 1) % SERIAL

    def settle(self, cid: ConsumerId, msg_ids: tuple[int, ...], outcome: str) -> None:
        """settle | return | discard | modify_return | modify_failed | modify_drop of held ids
        (unknown ids are ignored, as in rabbit_fifo). Without a dead-letter target, discard
        and modify_drop (undeliverable here) drop the message."""
        consumer = self.consumers.get(cid)
        if consumer is None:
            return
        consumer.timed_out -= set(msg_ids)  # naming a timed-out id clears it
        done = [i for i in dict.fromkeys(msg_ids) if i in consumer.held]
        for msg_id in done:
            body = consumer.held.pop(msg_id)
            consumer.locks.pop(msg_id, None)
            if outcome in ("return", "modify_return", "modify_failed"):
                self._come_back(body, failed=outcome == "modify_failed")
        if not consumer.credited:  # settles never add link credit
            consumer.credit = min(consumer.prefetch, consumer.credit + len(done))
        self._maybe_leave(consumer)

    def cancel(self, cid: ConsumerId) -> None:
        consumer = self.consumers.get(cid)
        if consumer is not None:
            consumer.status = "cancelled"
            self._maybe_leave(consumer)

    def connection_down(self, conn: ConnectionId, reason: str, now: int = 0) -> None:
        for consumer in [c for c in self.consumers.values() if c.cid.connection == conn]:
            if reason == "normal":  # a crash: a failed delivery
                self._return_all(consumer, failed=True)
                del self.consumers[consumer.cid]
            elif self.version == 1 or consumer.status == "cancelled":
                # v1 returns at once; v2 does so only for a cancelled consumer, which then
                # leaves. DESIGN.md: only downs other than noconnection are failed deliveries.
                self._return_all(consumer, failed=False)
                consumer.status = "suspected" if consumer.status == "up" else consumer.status
                if not consumer.credited:
                    consumer.credit = consumer.prefetch
                self._maybe_leave(consumer)
            elif consumer.status == "up":
                consumer.status = "suspected"
                consumer.suspected_since = now
                consumer.disconnected_fired = False

    def node_up(self, node: str) -> None:
        for consumer in self.consumers.values():
            if consumer.cid.connection.node != node:
                continue
            consumer.suspected_since = None  # also for one cancelled while suspected
            consumer.disconnected_fired = False
            if consumer.status == "suspected":
                consumer.status = "up"

    def purge(self) -> int:
        count = self.ready_count()
        self.ready.clear()
        self.returns.clear()
        return count

    def _return_all(self, consumer: ModelConsumer, failed: bool) -> None:
        for msg_id in sorted(consumer.held):
            self._come_back(consumer.held.pop(msg_id), failed)
        consumer.locks.clear()

    # --- v2 timers -------------------------------------------------------------------------

    def due(
        self, now: int, disconnected_timeout_ms: int
    ) -> tuple[list[ConsumerId], list[ConsumerId]]:
        """Consumers with an expired lock, and suspected ones past their disconnected timeout."""
        locked = [c.cid for c in self.consumers.values()
                  if any(lock <= now for lock in c.locks.values())]
        away = [c.cid for c in self.consumers.values()
                if c.suspected_since is not None and not c.disconnected_fired
                and c.suspected_since + disconnected_timeout_ms <= now]
        return locked, away

    def time_out(self, cid: ConsumerId, now: int) -> list[int]:
        """Return the expired locks (not a failed delivery); the consumer is timed out."""
        consumer = self.consumers[cid]
        expired = sorted(i for i, lock in consumer.locks.items() if lock <= now)
        for msg_id in expired:
            self._come_back(consumer.held.pop(msg_id), failed=False)
            del consumer.locks[msg_id]
        consumer.timed_out |= set(expired)
        if not consumer.credited:
            consumer.credit = min(consumer.prefetch, consumer.credit + len(expired))
        self._maybe_leave(consumer)
        return expired

    def renew(self, cid: ConsumerId, msg_ids: tuple[int, ...], now: int) -> None:
        """RenewLocks: each held lock expires at now + timeout; timed-out ids named are cleared."""
        consumer = self.consumers[cid]
        consumer.timed_out -= set(msg_ids)
        for msg_id in msg_ids:
            if msg_id in consumer.held:
                consumer.locks[msg_id] = now + consumer.timeout_ms

    def disconnected_timeout(self, cid: ConsumerId) -> None:
        """A suspected consumer stayed away: its messages come back (not failed), it stays
        suspected until its node is up again; a cancelled one leaves."""
        consumer = self.consumers[cid]
        consumer.disconnected_fired = True
        self._return_all(consumer, failed=False)
        if not consumer.credited:
            consumer.credit = consumer.prefetch
        self._maybe_leave(consumer)

    def _come_back(self, body: bytes, failed: bool) -> None:
        """A message back from a consumer: requeued, or dead-lettered over the delivery limit.

        v1 counts every return against the limit; v2 only failed deliveries.
        """
        self.acquired[body] = self.acquired.get(body, 0) + 1
        if failed:
            self.failed[body] = self.failed.get(body, 0) + 1
        count = self.acquired[body] if self.version == 1 else self.failed.get(body, 0)
        if self.delivery_limit is not None and count > self.delivery_limit:
            self.dead_lettered += 1  # no dead-letter target: dropped
        else:
            self.returns.append(body)

    def _maybe_leave(self, consumer: ModelConsumer) -> None:
        if consumer.status == "cancelled" and not consumer.held:
            del self.consumers[consumer.cid]


# --- Hypothesis settings profiles for the fifo property suites -------------------------------
# "ci" keeps the whole fifo property suite at about 2-3 minutes on 2 busy cores; "thorough" is for
# a nightly or pre-release run: QUORUMQ_HYPOTHESIS_PROFILE=thorough pytest tests/fifo

PROFILE = os.environ.get("QUORUMQ_HYPOTHESIS_PROFILE", "ci")
settings.register_profile("ci", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
SCALE = 10 if PROFILE == "thorough" else 1


def examples(count: int) -> int:
    """`max_examples` for a test, scaled up by the thorough profile."""
    return count * SCALE


def fifo_settings(max_examples: int, **overrides: Any) -> settings:
    """Settings of one property: the active profile with a deliberate `max_examples`."""
    return settings(settings.get_profile(PROFILE), max_examples=examples(max_examples),
                    **overrides)


# --- single active consumer ------------------------------------------------------------------


@dataclass
class SacConsumer:
    """A simple_prefetch consumer of a SAC queue."""

    cid: ConsumerId
    prefetch: int
    priority: int
    attach: int  # Raft index of the checkout that created it (v2 tie-break)
    credit: int
    held: dict[int, bytes] = field(default_factory=dict)
    quiescing: bool = False


@dataclass
class SacModel:
    """Who is active on a SAC queue. v1: first attached, attach order, no priorities. v2: higher
    priority takes over once the active one has nothing pending (it quiesces meanwhile);
    waiting order is priority, then credit, then earliest attached."""

    version: int
    active: SacConsumer | None = None
    waiting: list[SacConsumer] = field(default_factory=list)
    cancelled: dict[ConsumerId, SacConsumer] = field(default_factory=dict)  # with pending
    ready: list[bytes] = field(default_factory=list)
    returns: list[bytes] = field(default_factory=list)

    def find(self, cid: ConsumerId) -> SacConsumer | None:
        if self.active is not None and self.active.cid == cid:
            return self.active
        return next((c for c in self.waiting if c.cid == cid), None) or self.cancelled.get(cid)

    def checkout(self, cid: ConsumerId, prefetch: int, priority: int, index: int) -> None:
        consumer = self.find(cid)
        if consumer is None:
            consumer = SacConsumer(cid, prefetch, priority if self.version >= 2 else 0, index,
                                   prefetch)
            if self.active is None:
                self.active = consumer
            else:
                self._add_waiting(consumer)
        else:
            consumer.prefetch = prefetch
            consumer.priority = priority if self.version >= 2 else 0
            consumer.credit = max(0, prefetch - len(consumer.held))
            # the rules decide afresh whether an updated active consumer still has to quiesce
            # (DESIGN.md leaves this open; the machine re-evaluates, and so does the model)
            consumer.quiescing = False
            if cid in self.cancelled:
                del self.cancelled[cid]
                if self.active is None:
                    self.active = consumer
                else:
                    self._add_waiting(consumer)
            elif consumer is not self.active:
                self._sort()
        self.settle_activation()

    def cancel(self, cid: ConsumerId) -> None:
        consumer = self.find(cid)
        if consumer is None or cid in self.cancelled:
            return
        if consumer is self.active:
            self.active = None
            consumer.quiescing = False
            if consumer.held:
                self.cancelled[cid] = consumer
        else:
            self.waiting.remove(consumer)
            if consumer.held:  # a soft cancel keeps pending messages until they are settled
                self.cancelled[cid] = consumer
        self.settle_activation()

    def down(self, cid: ConsumerId) -> None:
        """Its connection closed: the consumer is gone, its messages come back in id order."""
        consumer = self.find(cid)
        if consumer is None:
            return
        self.returns += [consumer.held.pop(i) for i in sorted(consumer.held)]
        if consumer is self.active:
            self.active = None
        elif cid in self.cancelled:
            del self.cancelled[cid]
        else:
            self.waiting.remove(consumer)
        self.settle_activation()

    def settle(self, cid: ConsumerId, msg_ids: tuple[int, ...], give_back: bool) -> None:
        consumer = self.find(cid)
        if consumer is None:
            return
        done = [i for i in dict.fromkeys(msg_ids) if i in consumer.held]
        for msg_id in done:
            body = consumer.held.pop(msg_id)
            if give_back:
                self.returns.append(body)
        consumer.credit = min(consumer.prefetch, consumer.credit + len(done))
        if cid in self.cancelled and not consumer.held:
            del self.cancelled[cid]
        self._sort()
        self.settle_activation()

    def deliver(self, cid: ConsumerId, msg_id: int, body: bytes) -> None:
        active = self.active
        if active is None or active.cid != cid or active.quiescing or active.credit <= 0:
            raise ModelMismatch(f"delivery to {cid.tag}; model active: "
                                f"{None if active is None else active.cid.tag}")
        source = self.returns if self.returns else self.ready
        if not source or source[0] != body:
            raise ModelMismatch(f"delivered {body!r}, expected {source[:1]}")
        source.pop(0)
        active.held[msg_id] = body
        active.credit -= 1

    def can_deliver(self) -> bool:
        active = self.active
        busy = active is not None and not active.quiescing and active.credit > 0
        return busy and bool(self.ready or self.returns)

    def settle_activation(self) -> None:
        """The activation rules, run after every command until nothing changes."""
        for _ in range(4):
            if not self._activation_step():
                return

    def _activation_step(self) -> bool:
        active = self.active
        if active is None:
            if not self.waiting:
                return False
            self.active = self.waiting.pop(0)
            return True
        if self.version < 2:
            return False
        if active.quiescing:
            if active.held:
                return False
            active.quiescing = False
            self.active = None
            self._add_waiting(active)
            return True
        if not self.waiting or self.waiting[0].priority <= active.priority:
            return False
        if active.held:
            active.quiescing = True
            return False
        self.active = None
        self._add_waiting(active)
        return True

    def _add_waiting(self, consumer: SacConsumer) -> None:
        self.waiting.append(consumer)
        self._sort()

    def _sort(self) -> None:
        if self.version >= 2:
            self.waiting.sort(key=lambda c: (-c.priority, -c.credit, c.attach))
