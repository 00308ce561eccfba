"""Machine version 2 ("v4 semantics"): extends v1 only where v1's golden files pin v1.

Compact consumer keys (the Raft index of the creating checkout; ids still accepted); SAC with
priorities and quiescing takeover; `remove`; `modify`; consumer timeouts with lock renewal;
`noconnection` only suspects a consumer until its node is up or its disconnected timeout fires;
the delivery limit counts failed deliveries only.
"""

from __future__ import annotations

from collections.abc import Callable

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    Checkout,
    ConnectionId,
    ConsumerDisconnectedTimeout,
    ConsumerId,
    ConsumerKey,
    EvalConsumerTimeouts,
    Modify,
    RenewLocks,
)
from fifo.effects import ConsumerCancelled, ConsumerUpdate, Released
from fifo.replies import CancelOk, Error, Reply
from fifo.shared import OK, Ctx, invalid, unknown_consumer
from fifo.state import Consumer, Message, Queue
from fifo.v1.machine import QueueMachineV1


def waiting_order(c: Consumer) -> tuple[int, int, int, int]:
    """SAC waiting order: up first, then higher priority, more credit, earliest attached."""
    down = 0 if c.suspected_since is None and not c.timed_out else 1
    return (down, -c.priority, -c.credit, c.attach_index)


class QueueMachineV2(QueueMachineV1):
    """Per-queue command handlers of machine version 2."""

    uses_locks = True

    def __init__(self) -> None:
        super().__init__()
        self.handlers[Modify] = self.modify
        self.handlers[RenewLocks] = self.renew_locks
        self.handlers[EvalConsumerTimeouts] = self.eval_consumer_timeouts
        self.handlers[ConsumerDisconnectedTimeout] = self.consumer_disconnected_timeout

    def new_key(self, ctx: Ctx, consumer: ConsumerId) -> ConsumerKey:
        """v2 keys a new consumer by the Raft index of its checkout."""
        return ctx.index

    def key_of(self, q: Queue, key: object) -> ConsumerKey | None:
        """v2 names consumers by their compact key (the checkout's index) or by their id."""
        if type(key) is int:
            return key
        return super().key_of(q, key)

    def over_delivery_limit(self, q: Queue, m: Message) -> bool:
        """v2: only failed deliveries count towards the delivery limit."""
        limit = q.config.delivery_limit
        return limit is not None and m.delivery_count > limit

    # --- SAC with priorities ------------------------------------------------------------------

    def add_waiting(self, q: Queue, c: Consumer) -> None:
        """Insert into the waiting list, kept in `waiting_order`."""
        q.waiting.append(c)
        q.waiting.sort(key=waiting_order)

    def resort_waiting(self, q: Queue) -> None:
        """Credit, priority or status changed: restore `waiting_order`."""
        q.waiting.sort(key=waiting_order)

    def activate_next(self, ctx: Ctx, q: Queue) -> None:
        """Activate the head when nobody is active; a higher-priority head takes over."""
        active = self.active(q)
        if active is None:
            self.activate_first_waiting(ctx, q)
            return
        if not q.waiting or active.status != "up":
            return
        head = q.waiting[0]
        if not self.waiting_eligible(head) or head.priority <= active.priority:
            return
        if active.checked_out:
            active.status = "quiescing"  # finishes its pending messages, gets nothing new
            self.service_remove(q, active)
            return
        self.to_waiting(ctx, q, active, notify=True)
        self.activate_first_waiting(ctx, q)

    # --- remove, modify, renew ----------------------------------------------------------------

    def remove(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """Hard cancel: pending messages are returned at once (not a failed delivery)."""
        c = self.resolve(q, cmd.consumer)
        if c is None:
            return unknown_consumer(cmd.consumer)
        if q.consumers.get(c.key) is not c:
            self.drop_waiting(ctx, q, c, "remove")
        else:
            self.return_all(ctx, q, c, delivery_failed=False)
            self.drop_consumer(q, c)
            ctx.effects.append(ConsumerCancelled(c.connection, q.name, c.tag, c.key, "remove"))
        q.last_active = ctx.now
        self.after_change(ctx, q)
        return CancelOk(None, 0)

    def untimeout(self, q: Queue, c: Consumer, ids: tuple[int, ...]) -> None:
        """Naming timed-out ids clears them; with none left the consumer is back to normal."""
        if c.timed_out:
            named = dict.fromkeys(ids)
            c.timed_out = [i for i in c.timed_out if i not in named]
            if not c.timed_out and q.consumers.get(c.key) is not c:
                self.resort_waiting(q)

    def modify(self, ctx: Ctx, q: Queue, cmd: Modify) -> Reply:
        """AMQP modified: return (or dead-letter if undeliverable here) with annotations."""
        c = self.holder(q, cmd.consumer_key, cmd.msg_ids)
        if isinstance(c, Error):
            return c
        if msg := v.annotations_error(cmd.annotations):
            return invalid(msg)
        if not (v.is_bool(cmd.delivery_failed) and v.is_bool(cmd.undeliverable_here)):
            return invalid("delivery_failed and undeliverable_here must be bool")
        self.untimeout(q, c, cmd.msg_ids)
        if cmd.undeliverable_here:
            n = self.discard_msgs(ctx, q, c, cmd.msg_ids, cmd.delivery_failed, cmd.annotations)
        else:
            n = self.return_msgs(ctx, q, c, cmd.msg_ids, cmd.delivery_failed, cmd.annotations)
        self.consumer_done(ctx, q, c, n)
        return OK

    def renew_locks(self, ctx: Ctx, q: Queue, cmd: RenewLocks) -> Reply:
        """Each named lock now expires at now + the consumer's timeout."""
        c = self.holder(q, cmd.consumer_key, cmd.msg_ids)
        if isinstance(c, Error):
            return c
        self.untimeout(q, c, cmd.msg_ids)
        expiry = ctx.now + c.timeout_ms
        for i in cmd.msg_ids:
            m = c.checked_out.get(i)
            if m is not None:
                m.lock = expiry
        self.consumer_done(ctx, q, c, 0)
        return OK

    # --- timeouts -----------------------------------------------------------------------------

    def eval_consumer_timeouts(self, ctx: Ctx, q: Queue, cmd: EvalConsumerTimeouts) -> Reply:
        """Return expired locks; their consumers are timed out (a SAC active one is replaced)."""
        keys = cmd.consumer_keys
        if type(keys) is not tuple or len(keys) > limits.consumer_keys_per_command_max:
            return invalid("consumer_keys must be a short tuple")
        for key in keys:
            if err := v.key_error(key):
                return invalid(err)
        done: list[Consumer] = []
        for key in keys:
            c = self.resolve(q, key)  # stale keys (consumer gone since the scan) are skipped
            if c is None or any(d is c for d in done):
                continue
            if q.consumers.get(c.key) is not c and not any(w is c for w in q.waiting):
                continue
            done.append(c)
            self.time_out(ctx, q, c)
        self.after_change(ctx, q)
        return OK

    def time_out(self, ctx: Ctx, q: Queue, c: Consumer) -> None:
        """Time out one consumer whose locks expired at `ctx.now`."""
        now = ctx.now
        expired = [i for i, m in c.checked_out.items() if m.lock <= now]
        if not expired:
            return
        waiting = q.consumers.get(c.key) is not c  # a waiting SAC consumer still holding some
        sac_active = (
            not waiting and q.config.single_active_consumer and c.status in ("up", "quiescing")
        )
        ids = sorted(c.checked_out) if sac_active else sorted(expired)
        n = self.return_msgs(ctx, q, c, ids, delivery_failed=False)
        c.timed_out = sorted(dict.fromkeys((*c.timed_out, *ids)))
        ctx.effects.append(Released(c.connection, q.name, c.tag, c.key, tuple(ids), "timeout"))
        if not c.credited and not c.once:
            c.credit = min(c.prefetch, c.credit + n)
        if waiting:
            self.resort_waiting(q)  # timed out: behind every up consumer until it settles
            return
        if c.status == "cancelled" or c.once:
            if not c.checked_out:
                self.drop_consumer(q, c)
        elif sac_active:
            self.to_waiting(ctx, q, c, notify=True)

    def consumer_disconnected_timeout(
        self, ctx: Ctx, q: Queue, cmd: ConsumerDisconnectedTimeout
    ) -> Reply:
        """A suspected consumer stayed away too long: its messages are returned."""
        c, err = self.find_key(q, cmd.consumer_key)
        if c is None:
            return err or unknown_consumer(cmd.consumer_key)
        if c.suspected_since is None or c.disconnected_fired:
            return OK  # stale timer: it came back or the timeout already ran
        c.disconnected_fired = True
        if q.consumers.get(c.key) is c:
            self.return_all(ctx, q, c, delivery_failed=False)
            if not c.credited:
                c.credit = c.prefetch
            if c.status == "cancelled" or c.once:
                self.drop_consumer(q, c)
            elif q.config.single_active_consumer:
                self.to_waiting(ctx, q, c, notify=False)
            q.last_active = ctx.now
        elif c.checked_out:  # a waiting holder (cancelled, then back): it stays waiting
            self.return_all(ctx, q, c, delivery_failed=False)
            if not c.credited:
                c.credit = c.prefetch
            self.resort_waiting(q)
            q.last_active = ctx.now
        self.after_change(ctx, q)
        return OK

    def down_noconnection(self, ctx: Ctx, q: Queue, match: Callable[[ConnectionId], bool]) -> None:
        """v2: consumers are only suspected (they keep their messages, get nothing new)."""
        self.enqueuers_status(ctx, q, match, "suspected")
        for w in q.waiting:
            if match(w.connection) and w.suspected_since is None:
                w.suspected_since = ctx.now
                w.disconnected_fired = False
        self.resort_waiting(q)
        for c in [c for c in q.consumers.values() if match(c.connection)]:
            if c.status == "cancelled" or c.once:
                self.return_all(ctx, q, c, delivery_failed=False)
                self.drop_consumer(q, c)
            elif c.suspected_since is None:
                c.suspected_since = ctx.now
                c.disconnected_fired = False
                self.service_remove(q, c)
                ctx.effects.append(
                    ConsumerUpdate(c.connection, q.name, c.tag, c.key, False, "suspected_down")
                )
        q.last_active = ctx.now
        self.after_change(ctx, q)
