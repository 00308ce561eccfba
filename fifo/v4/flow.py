"""Machine v4, layer 2 of the per-queue machine: how messages move. Dead-lettering (routed
into a partitioned queue's partitions), length limits, expiry, delivery (plain and grouped) and
messages coming back from consumers. Every lock set here is indexed (`fifo.v4.deadlines`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fifo import limits
from fifo.effects import DeadLettered, Delivery, QueueStatus, RefDelivery
from fifo.fastbuild import ref_deliver
from fifo.shared import DEATH_KEYS, SERIAL, Annotations, Ctx, merge_annotations
from fifo.state import Consumer, Group, Grouping, Message, Queue, compact, expiry_of, inflate
from fifo.v4 import deadlines, exchanges, routing
from fifo.v4 import groups as group_index
from fifo.v4.basics import QueueBasics
from fifo.v4.refs import copy_message, delivery_of


class MessageFlow(QueueBasics):
    """Dead-lettering, limits, expiry, delivery and returns of machine v4."""

    # --- dead-lettering ------------------------------------------------------------------------

    def dead_letter(self, ctx: Ctx, queue: Queue, messages: list[Message], reason: Any) -> None:
        """Messages leave `queue`: enqueue them into the dead-letter target, or drop them. A
        target that names a partitioned queue is routed (`dead_letter_routed`)."""
        if not messages:
            return
        name = queue.config.dead_letter_queue
        count = ctx.state.partitioned.get(name) if name is not None else None
        if count is not None and ctx.depth < limits.dead_letter_hops_max:
            assert name is not None
            self.dead_letter_routed(ctx, queue, messages, reason, name, count)
            return
        queue.messages_total -= len(messages)
        target = ctx.state.queues.get(name) if name is not None else None
        through = exchanges.dead_letter_exchange(name) if name and target is None else None
        if through is not None and ctx.depth < limits.dead_letter_hops_max:
            self.dead_letter_through(ctx, queue, messages, reason, through)
            return
        if target is None or ctx.depth >= limits.dead_letter_hops_max:
            ctx.effects.append(DeadLettered(queue.name, reason, len(messages), None))
            return
        for message in messages:
            self.store(ctx, target, self.dead_copy(ctx, queue, target, message, reason))
        self.mark_dirty(ctx, target)
        ctx.effects.append(DeadLettered(queue.name, reason, len(messages), name))

    def dead_letter_through(self, ctx: Ctx, queue: Queue, messages: list[Message], reason: Any,
                            through: tuple[str, str]) -> None:  # fmt: skip
        """Each message routed through an exchange (`fifo.v4.exchanges.dead_letter_route`), a
        copy in every matching queue; one DeadLettered effect per queue reached (in the order
        first reached), one without a target for the messages no queue took."""
        reached: dict[str, int] = {}
        dropped = 0
        for message in messages:
            names = exchanges.dead_letter_route(ctx.state, through, queue.name,
                                                message.annotations)  # fmt: skip
            dropped += not names
            for name in names:
                target = ctx.state.queues[name]
                self.store(ctx, target, self.dead_copy(ctx, queue, target, message, reason))
                reached[name] = reached.get(name, 0) + 1
                self.mark_dirty(ctx, target)
        for name, number in reached.items():
            ctx.effects.append(DeadLettered(queue.name, reason, number, name))
        if dropped:
            ctx.effects.append(DeadLettered(queue.name, reason, dropped, None))

    def dead_copy(
        self, ctx: Ctx, queue: Queue, target: Queue, message: Message, reason: Any
    ) -> Message:
        """The copy a target receives: it keeps how often the message failed (rabbit_fifo's
        annotate_msg) and says why and from where it came."""
        copy = copy_message(message, self.expiry(ctx, target, None))
        copy.delivery_count, copy.acquired_count = message.delivery_count, message.acquired_count
        kept = tuple(a for a in message.annotations if a[0] not in DEATH_KEYS)
        annotations = (*kept, ("x-death-reason", reason), ("x-death-queue", queue.name))
        copy.annotations = annotations[-limits.annotations_per_message_max :]
        return copy

    def mark_dirty(self, ctx: Ctx, target: Queue) -> None:
        """A dead-letter target received messages: deliver there after the command's queue."""
        if ctx.dirty is None:
            ctx.dirty = [target]
        elif not any(dirty is target for dirty in ctx.dirty):
            ctx.dirty.append(target)

    def dead_letter_routed(
        self, ctx: Ctx, queue: Queue, messages: list[Message], reason: Any, name: str, count: int
    ) -> None:
        """Each message goes to the partition a publish of it would (its partition key, else
        round robin), one DeadLettered effect per partition reached, in the order first reached."""
        queue.messages_total -= len(messages)
        routed = ctx.state.routing[name]
        reached: dict[str, int] = {}
        for message in messages:
            key = routing.partition_key(message.annotations)
            index = routed.cursor if key is None else routing.partition_index(key, count)
            if key is None:
                routed.cursor = routing.next_cursor(index, count)
            target = ctx.state.queues[routing.partition_name(name, index)]
            self.store(ctx, target, self.dead_copy(ctx, queue, target, message, reason))
            reached[target.name] = reached.get(target.name, 0) + 1
            self.mark_dirty(ctx, target)
        for target_name, number in reached.items():
            ctx.effects.append(DeadLettered(queue.name, reason, number, target_name))

    # --- limits --------------------------------------------------------------------------------

    def evaluate_limit(self, ctx: Ctx, queue: Queue) -> None:
        """drop_head drops from the head; reject_publish blocks and later unblocks enqueuers."""
        if queue.config.overflow == "drop_head":
            dropped: list[Message] = []
            while self.over_limit(queue):
                message = self.pop_head(queue)
                if message is None:
                    break
                dropped.append(message)
            self.dead_letter(ctx, queue, dropped, "maxlen")
        elif self.over_limit(queue):
            for enqueuer in queue.enqueuers.values():
                if (enqueuer.blocked is None and enqueuer.connection is not None
                        and enqueuer.status != "down"):  # fmt: skip
                    enqueuer.blocked = ctx.index
                    queue.blocked_count += 1
                    ctx.effects.append(
                        QueueStatus(
                            enqueuer.connection, queue.name, enqueuer.name, "reject_publish"
                        )
                    )
            return
        if queue.blocked_count and self.below_soft_limit(queue):
            self.unblock_all(ctx, queue)

    def unblock_all(self, ctx: Ctx, queue: Queue) -> None:
        """Tell every blocked enqueuer to go on publishing."""
        for enqueuer in queue.enqueuers.values():
            if enqueuer.blocked is not None:
                enqueuer.blocked = None
                if enqueuer.connection is not None and enqueuer.status != "down":
                    ctx.effects.append(QueueStatus(enqueuer.connection, queue.name, enqueuer.name,
                                                   "go"))  # fmt: skip
        queue.blocked_count = 0

    # --- expiry and taking ---------------------------------------------------------------------

    def expire_head(self, ctx: Ctx, queue: Queue) -> None:
        """Shallow expiry: drop the expired prefix of returns and of ready (grouped: the expired
        oldest waiting messages)."""
        now = ctx.now
        expired: list[Message] = []
        grouping = queue.grouping
        if grouping is not None:
            while True:
                group = group_index.oldest(grouping)
                message = None if group is None else group_index.head(group)
                if group is None or message is None or message.expiry is None \
                        or message.expiry > now:  # fmt: skip
                    break
                expired.append(self.take_from(queue, grouping, group))
        else:
            for source in (queue.returns, queue.ready):
                while source and (expiry := expiry_of(source[0])) is not None and expiry <= now:
                    message = inflate(source.popleft())
                    queue.bytes_ready -= message.size
                    expired.append(message)
        self.dead_letter(ctx, queue, expired, "expired")

    def take(self, ctx: Ctx, queue: Queue) -> Message | None:
        """Next message of an ungrouped queue to hand out, expiring an expired head first."""
        source = queue.returns if queue.returns else queue.ready
        if not source:
            return None
        expiry = expiry_of(source[0])
        if expiry is not None and expiry <= ctx.now:
            self.expire_head(ctx, queue)
            source = queue.returns if queue.returns else queue.ready
            if not source:
                return None
        message = inflate(source.popleft())
        queue.bytes_ready -= message.size
        return message

    def grouped_take(
        self, ctx: Ctx, queue: Queue, grouping: Grouping, consumer: Consumer | None
    ) -> tuple[Group, Message] | None:
        """The next message for `consumer` (None: a dequeue, free groups only); an expired head
        met on the way is dead-lettered. Ownership is the caller's (`assign`, before taking)."""
        key = None if consumer is None else consumer.key
        while True:
            group = group_index.pick(grouping, key)
            if group is None:
                return None
            message = group_index.head(group)
            assert message is not None
            if message.expiry is not None and message.expiry <= ctx.now:
                self.dead_letter(ctx, queue, [self.take_from(queue, grouping, group)], "expired")
                continue
            return group, message

    # --- delivery ------------------------------------------------------------------------------

    def check_out(self, ctx: Ctx, queue: Queue, consumer: Consumer, message: Message) -> int:
        """Hand `message` to `consumer`: a new message id, a lock, credit and counters."""
        msg_id = consumer.next_msg_id
        consumer.next_msg_id = msg_id + 1
        consumer.checked_out[msg_id] = message
        message.lock = ctx.now + consumer.timeout_ms
        deadlines.track(ctx.state, queue, consumer, msg_id, message)
        consumer.credit -= 1
        consumer.delivery_count = (consumer.delivery_count + 1) % SERIAL
        queue.bytes_checkout += message.size
        return msg_id

    def deliver(self, ctx: Ctx, queue: Queue) -> None:
        """Hand out waiting messages to consumers with credit, round robin within a priority."""
        if queue.grouping is not None:
            self.deliver_grouped(ctx, queue, queue.grouping)
            return
        batches: dict[Any, list[Delivery | RefDelivery]] = {}
        owners: list[Consumer] = []
        while queue.returns or queue.ready:
            consumer = self.next_consumer(queue)
            if consumer is None:
                break
            message = self.take(ctx, queue)
            if message is None:
                break
            msg_id = self.check_out(ctx, queue, consumer, message)
            self.batch(batches, owners, consumer, msg_id, message)
            ring = queue.service[consumer.priority]
            ring.popleft()
            if consumer.credit > 0:
                ring.append(consumer.key)
            else:
                consumer.in_service = False
                if not ring:
                    del queue.service[consumer.priority]
        self.send(ctx, queue, batches, owners)

    def batch(
        self,
        batches: dict[Any, list[Delivery | RefDelivery]],
        owners: list[Consumer],
        consumer: Consumer,
        msg_id: int,
        message: Message,
    ) -> None:
        """Add one delivery to its consumer's batch (consumers in first-served order)."""
        delivery = delivery_of(msg_id, message)
        found = batches.get(consumer.key)
        if found is None:
            batches[consumer.key] = [delivery]
            owners.append(consumer)
        else:
            found.append(delivery)

    def send(
        self,
        ctx: Ctx,
        queue: Queue,
        batches: dict[Any, list[Delivery | RefDelivery]],
        owners: list[Consumer],
    ) -> None:
        """One Deliver effect per consumer served, in first-served order."""
        for consumer in owners:
            batch = tuple(batches[consumer.key])
            ctx.effects.append(
                ref_deliver(consumer.connection, queue.name, consumer.tag, consumer.key, batch)
            )

    def deliver_grouped(self, ctx: Ctx, queue: Queue, grouping: Grouping) -> None:
        """By priority, round robin, each consumer takes the oldest head among groups free or
        owned by it, skipping a consumer nothing is available for."""
        batches: dict[Any, list[Delivery | RefDelivery]] = {}
        owners: list[Consumer] = []
        service = queue.service
        for priority in sorted(service, reverse=True):
            ring = service[priority]
            skipped = 0
            while ring and skipped < len(ring) and grouping.waiting:
                consumer = queue.consumers.get(ring[0])
                if consumer is None or not self.eligible(consumer):
                    ring.popleft()
                    if consumer is not None:
                        consumer.in_service = False
                    continue
                found = self.grouped_take(ctx, queue, grouping, consumer)
                if found is None:
                    ring.rotate(-1)
                    skipped += 1
                    continue
                skipped = 0
                group, message = found
                group_index.assign(grouping, group, consumer.key)
                self.take_from(queue, grouping, group)
                msg_id = self.check_out(ctx, queue, consumer, message)
                self.batch(batches, owners, consumer, msg_id, message)
                ring.popleft()
                if consumer.credit > 0:
                    ring.append(consumer.key)
                else:
                    consumer.in_service = False
            if not ring:
                del service[priority]
        self.send(ctx, queue, batches, owners)

    # --- messages coming back ------------------------------------------------------------------

    def return_msgs(
        self,
        ctx: Ctx,
        queue: Queue,
        consumer: Consumer,
        ids: Iterable[int],
        delivery_failed: bool,
        annotations: Annotations = (),
    ) -> int:
        """Move checked-out messages back (a grouped one to the front of its group, in position
        order), or dead-letter them over the delivery limit; returns how many came back."""
        grouping = queue.grouping
        over: list[Message] = []
        count = 0
        for msg_id in ids:
            message = consumer.checked_out.pop(msg_id, None)
            if message is None:
                continue
            count += 1
            size = message.size
            queue.bytes_checkout -= size
            message.lock = 0
            message.acquired_count += 1
            if delivery_failed:
                message.delivery_count += 1
            if annotations:  # (a grouped message stays in the group it was enqueued with)
                message.annotations = merge_annotations(message.annotations, annotations)
            if self.over_delivery_limit(queue, message):
                over.append(message)
            elif grouping is None:
                queue.returns.append(compact(message))
                queue.bytes_ready += size
            else:
                group_index.add_returned(grouping, grouping.groups[message.group], message)
                queue.bytes_ready += size
            if grouping is not None:
                self.left(queue, grouping, consumer, message)
        self.dead_letter(ctx, queue, over, "delivery_limit")
        return count

    def return_all(self, ctx: Ctx, queue: Queue, consumer: Consumer, delivery_failed: bool) -> int:
        """Return every checked-out message of a consumer in msg-id order."""
        return self.return_msgs(ctx, queue, consumer, sorted(consumer.checked_out),
                                delivery_failed)  # fmt: skip

    def discard_msgs(
        self,
        ctx: Ctx,
        queue: Queue,
        consumer: Consumer,
        ids: tuple[int, ...],
        delivery_failed: bool,
        annotations: Annotations,
    ) -> int:
        """Take messages from a consumer and dead-letter them with reason `rejected`."""
        grouping = queue.grouping
        gone: list[Message] = []
        for msg_id in ids:
            message = consumer.checked_out.pop(msg_id, None)
            if message is None:
                continue
            queue.bytes_checkout -= message.size
            message.acquired_count += 1
            if delivery_failed:
                message.delivery_count += 1
            if annotations:
                message.annotations = merge_annotations(message.annotations, annotations)
            gone.append(message)
            if grouping is not None:
                self.left(queue, grouping, consumer, message)
        self.dead_letter(ctx, queue, gone, "rejected")
        return len(gone)
