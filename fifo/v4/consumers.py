"""Machine v4, layer 3 of the per-queue machine: consumers' lives. Single-active-consumer with
priorities (waiting order, activation, quiescing takeover), what follows any change
(`after_change`), consumers leaving, and consumer timeouts being cleared.
"""

from __future__ import annotations

from typing import Any

from fifo.commands import Checkout, ConsumerId, Credited, SimplePrefetch
from fifo.effects import ConsumerCancelled, ConsumerUpdate
from fifo.shared import Ctx
from fifo.state import Consumer, Queue
from fifo.v4 import groups as group_index
from fifo.v4.basics import waiting_order
from fifo.v4.flow import MessageFlow


class ConsumerLife(MessageFlow):
    """Consumer registration rules, SAC and the delivery that follows every change."""

    # --- after any change ----------------------------------------------------------------------

    def after_change(self, ctx: Ctx, queue: Queue) -> None:
        """After anything that may free credit or add messages: activate, deliver, limits."""
        config = queue.config
        if config.single_active_consumer:
            self.activate_next(ctx, queue)
        if queue.service and self.waiting_count(queue):
            self.deliver(ctx, queue)
        if config.max_length is not None or config.max_bytes is not None or queue.blocked_count:
            self.evaluate_limit(ctx, queue)

    def process_dirty(self, ctx: Ctx) -> None:
        """Deliver and apply limits in dead-letter targets, one hop per round (bounded)."""
        while ctx.dirty:
            ctx.depth += 1
            batch, ctx.dirty = ctx.dirty, None
            for target in batch:
                self.after_change(ctx, target)

    # --- single active consumer ----------------------------------------------------------------

    def add_waiting(self, queue: Queue, consumer: Consumer) -> None:
        """Insert into the waiting list, kept in `waiting_order`."""
        queue.waiting.append(consumer)
        queue.waiting.sort(key=waiting_order)

    def resort_waiting(self, queue: Queue) -> None:
        """Credit, priority or status changed: restore `waiting_order`."""
        queue.waiting.sort(key=waiting_order)

    def activate_next(self, ctx: Ctx, queue: Queue) -> None:
        """Activate the head when nobody is active; a higher-priority head takes over (the
        active one quiesces while it holds messages)."""
        active = self.active(queue)
        if active is None:
            self.activate_first_waiting(ctx, queue)
            return
        if not queue.waiting or active.status != "up":
            return
        head = queue.waiting[0]
        if not self.waiting_eligible(head) or head.priority <= active.priority:
            return
        if active.checked_out:
            active.status = "quiescing"  # finishes its pending messages, gets nothing new
            self.service_remove(queue, active)
            return
        self.to_waiting(ctx, queue, active, notify=True)
        self.activate_first_waiting(ctx, queue)

    def activate_first_waiting(self, ctx: Ctx, queue: Queue) -> None:
        """Move the first eligible waiting consumer into the active slot."""
        for position, waiting_consumer in enumerate(queue.waiting):
            if self.waiting_eligible(waiting_consumer):
                del queue.waiting[position]
                queue.consumers[waiting_consumer.key] = waiting_consumer
                ctx.effects.append(ConsumerUpdate(waiting_consumer.connection, queue.name,
                                                  waiting_consumer.tag, waiting_consumer.key, True,
                                                  "single_active"))  # fmt: skip
                self.service_add(queue, waiting_consumer)
                return

    def to_waiting(self, ctx: Ctx, queue: Queue, consumer: Consumer, notify: bool) -> None:
        """Move the active SAC consumer to the waiting list."""
        self.service_remove(queue, consumer)
        del queue.consumers[consumer.key]
        consumer.status = "up"
        self.add_waiting(queue, consumer)
        if notify:
            ctx.effects.append(ConsumerUpdate(consumer.connection, queue.name, consumer.tag,
                                              consumer.key, False, "waiting"))  # fmt: skip

    def sac_reattach(self, ctx: Ctx, queue: Queue, consumer: Consumer, was: str) -> None:
        """A known consumer checks out again: update in place, revive, or make it wait."""
        if queue.consumers.get(consumer.key) is not consumer:
            self.resort_waiting(queue)
            return
        if was in ("up", "quiescing"):
            return
        for other in queue.consumers.values():
            if other is not consumer and other.status in ("up", "quiescing"):
                # a cancelled consumer coming back while another is active waits (with pending)
                self.service_remove(queue, consumer)
                del queue.consumers[consumer.key]
                self.add_waiting(queue, consumer)
                return
        ctx.effects.append(ConsumerUpdate(consumer.connection, queue.name, consumer.tag,
                                          consumer.key, True, "single_active"))  # fmt: skip

    def configure(self, queue: Queue, consumer: Consumer, cmd: Checkout, fresh: bool) -> None:
        """Apply a checkout spec: credit mode, prefetch, priority, timeout; status up."""
        spec = cmd.spec
        consumer.credited = type(spec) is Credited
        consumer.prefetch = spec.prefetch if isinstance(spec, SimplePrefetch) else 0
        consumer.priority = cmd.priority
        consumer.timeout_ms = cmd.timeout_ms or queue.config.consumer_timeout_ms
        consumer.status = "up"
        consumer.once = False
        consumer.credit = max(0, consumer.prefetch - len(consumer.checked_out))
        if fresh and isinstance(spec, Credited):
            consumer.delivery_count = spec.initial_delivery_count

    # --- consumers leaving ---------------------------------------------------------------------

    def drop_consumer(self, queue: Queue, consumer: Consumer) -> None:
        """Forget a consumer of `queue.consumers`; an exclusive owner's idle groups are freed."""
        self.service_remove(queue, consumer)
        del queue.consumers[consumer.key]
        queue.key_by_id.pop(_id_of(consumer), None)
        self.release_consumer(queue, consumer)

    def drop_waiting(
        self, ctx: Ctx, queue: Queue, consumer: Consumer, reason: Any, delivery_failed: bool = False
    ) -> None:
        """Forget a waiting SAC consumer (returning anything it still holds)."""
        if consumer.checked_out:
            self.return_all(ctx, queue, consumer, delivery_failed=delivery_failed)
        queue.waiting.remove(consumer)
        queue.key_by_id.pop(_id_of(consumer), None)
        ctx.effects.append(ConsumerCancelled(consumer.connection, queue.name, consumer.tag,
                                             consumer.key, reason))  # fmt: skip

    def release_later(self, queue: Queue, consumer: Consumer) -> None:
        """A grouped queue's consumer is about to stop taking messages (cancel): its idle groups
        are freed first, so the delivery at the end of the command sees them."""
        grouping = queue.grouping
        if grouping is not None and consumer.key in grouping.by_owner:
            group_index.release_idle(grouping, consumer.key)

    def consumer_done(self, ctx: Ctx, queue: Queue, consumer: Consumer, count: int) -> None:
        """After `count` messages left a consumer: refill, remove or hand over, then deliver."""
        if count and not consumer.credited and not consumer.once:
            consumer.credit = min(consumer.prefetch, consumer.credit + count)
        if queue.consumers.get(consumer.key) is consumer:
            if consumer.once and not consumer.checked_out and consumer.credit == 0:
                self.drop_consumer(queue, consumer)
                queue.last_active = ctx.now
            elif consumer.status == "quiescing" and not consumer.checked_out:
                self.to_waiting(ctx, queue, consumer, notify=True)
            else:
                self.service_add(queue, consumer)
        elif count:
            self.resort_waiting(queue)  # a waiting holder's credit rose: waiting order by credit
        self.after_change(ctx, queue)

    def untimeout(self, queue: Queue, consumer: Consumer, ids: tuple[int, ...]) -> None:
        """Naming timed-out ids clears them; with none left the consumer is back to normal."""
        if consumer.timed_out:
            named = dict.fromkeys(ids)
            consumer.timed_out = [i for i in consumer.timed_out if i not in named]
            if not consumer.timed_out and queue.consumers.get(consumer.key) is not consumer:
                self.resort_waiting(queue)


def _id_of(consumer: Consumer) -> ConsumerId:
    """The ConsumerId a consumer was attached with (the key of `Queue.key_by_id`)."""
    return ConsumerId(consumer.tag, consumer.connection)
