"""Machine v4, layer 1 of the per-queue machine: lookups, counters, limits, the service ring,
storing and taking waiting messages, and message-group ownership.

The per-queue machine is one chain of classes (`basics` -> `flow` -> `consumers` -> `messages`
-> `machine`), each defining its own methods only (no method is defined twice: a test checks it),
each calling only itself and the layers below. v4 is a copy of v3's behaviour, never a subclass.
"""

from __future__ import annotations

from collections import deque

from fifo import limits
from fifo import validate as v
from fifo.commands import ConsumerId, ConsumerKey
from fifo.replies import Error
from fifo.shared import Ctx, invalid, key_text, unknown_consumer
from fifo.state import Consumer, Group, GroupId, Grouping, Message, Queue, compact, inflate
from fifo.v4 import groups as group_index


def waiting_order(consumer: Consumer) -> tuple[int, int, int, int]:
    """SAC waiting order: up first, then higher priority, more credit, earliest attached."""
    down = 0 if consumer.suspected_since is None and not consumer.timed_out else 1
    return (down, -consumer.priority, -consumer.credit, consumer.attach_index)


class QueueBasics:
    """What every handler of machine v4 builds on."""

    # --- lookups -------------------------------------------------------------------------------

    def key_of(self, queue: Queue, key: object) -> ConsumerKey | None:
        """A consumer is named by its compact key (the checkout's index) or by its id."""
        if type(key) is int:
            return key
        if type(key) is ConsumerId:
            return queue.key_by_id.get(key)
        return None

    def resolve(self, queue: Queue, key: object) -> Consumer | None:
        """Find a consumer (active or waiting) by key or id; None if unknown."""
        found_key = self.key_of(queue, key)
        if found_key is None:
            return None
        found = queue.consumers.get(found_key)
        if found is not None:
            return found
        for waiting_consumer in queue.waiting:
            if waiting_consumer.key == found_key:
                return waiting_consumer
        return None

    def find_key(self, queue: Queue, key: object) -> tuple[Consumer | None, Error | None]:
        """Validate then resolve a consumer key given by a command."""
        err = v.key_error(key)
        if err:
            return None, invalid(err)
        consumer = self.resolve(queue, key)
        return consumer, (None if consumer is not None else unknown_consumer(key))

    def holder(self, queue: Queue, key: object, msg_ids: object) -> Consumer | Error:
        """The consumer a return/discard/modify/renew names (ids validated), or the error."""
        consumer, err = self.find_key(queue, key)
        if consumer is None:
            return err or unknown_consumer(key)
        if msg := v.msg_ids_error(msg_ids):
            return invalid(msg)
        return consumer

    def owner_refusal(self, queue: Queue, key: object, connection: object) -> Error | None:
        """The refusal of a bound settle, return, discard, modify or renew submitted by a
        connection other than the one that holds consumer `key` (issue 31); None when it may
        go on (an unknown consumer is left to the handler: `unknown_consumer`)."""
        if err := v.connection_error(connection):
            return invalid(err)
        consumer = self.resolve(queue, key) if v.key_error(key) is None else None
        if consumer is None or consumer.connection == connection:
            return None
        return Error("not_owner", f"consumer {key_text(key)} of queue {queue.name!r} belongs "
                     "to another connection: only the connection that holds a consumer may "
                     "settle, return, discard, modify or renew its messages; nothing was "
                     "applied")  # fmt: skip

    def expiry(self, ctx: Ctx, queue: Queue, ttl_ms: int | None) -> int | None:
        """Absolute expiry from the queue TTL and the message TTL (TTL 0 -> now + 1)."""
        queue_ttl = queue.config.message_ttl_ms
        if ttl_ms is None:
            if queue_ttl is None:
                return None
            ttl = queue_ttl
        else:
            ttl = ttl_ms if queue_ttl is None else min(ttl_ms, queue_ttl)
        return ctx.now + (ttl or 1)

    # --- counters and limits -------------------------------------------------------------------

    def waiting_count(self, queue: Queue) -> int:
        """Ready plus returned messages (in groups for a grouped queue)."""
        grouping = queue.grouping
        return len(queue.ready) + len(queue.returns) if grouping is None else grouping.waiting

    def over_limit(self, queue: Queue) -> bool:
        """Waiting messages above max_length, or their bytes above max_bytes."""
        length_max, bytes_max = queue.config.max_length, queue.config.max_bytes
        return (length_max is not None and self.waiting_count(queue) > length_max) or (
            bytes_max is not None and queue.bytes_ready > bytes_max
        )

    def below_soft_limit(self, queue: Queue) -> bool:
        """At or below 80% of every set limit."""
        length_max, bytes_max = queue.config.max_length, queue.config.max_bytes
        return (length_max is None or self.waiting_count(queue) <= length_max * 8 // 10) and (
            bytes_max is None or queue.bytes_ready <= bytes_max * 8 // 10
        )

    def over_delivery_limit(self, queue: Queue, message: Message) -> bool:
        """Only failed deliveries count towards the delivery limit."""
        limit = queue.config.delivery_limit
        return limit is not None and message.delivery_count > limit

    # --- the service ring ----------------------------------------------------------------------

    def eligible(self, consumer: Consumer) -> bool:
        """Can this consumer receive a message now?"""
        return (consumer.credit > 0 and consumer.status == "up"
                and consumer.suspected_since is None and not consumer.timed_out)  # fmt: skip

    def service_add(self, queue: Queue, consumer: Consumer) -> None:
        """Queue a consumer for delivery if it can take messages."""
        if (not consumer.in_service and self.eligible(consumer)
                and queue.consumers.get(consumer.key) is consumer):  # fmt: skip
            consumer.in_service = True
            ring = queue.service.get(consumer.priority)
            if ring is None:
                ring = queue.service[consumer.priority] = deque()
            ring.append(consumer.key)

    def service_remove(self, queue: Queue, consumer: Consumer) -> None:
        """Take a consumer out of the service ring (it leaves or changes priority)."""
        if consumer.in_service:
            ring = queue.service[consumer.priority]
            ring.remove(consumer.key)
            if not ring:
                del queue.service[consumer.priority]
            consumer.in_service = False

    def next_consumer(self, queue: Queue) -> Consumer | None:
        """Highest priority eligible consumer at the front of its ring."""
        service = queue.service
        consumers = queue.consumers
        while service:
            priority = next(iter(service)) if len(service) == 1 else max(service)
            ring = service[priority]
            while ring:
                consumer = consumers.get(ring[0])
                if (consumer is not None and consumer.credit > 0 and consumer.status == "up"
                        and consumer.suspected_since is None
                        and not consumer.timed_out):  # fmt: skip
                    return consumer
                ring.popleft()
                if consumer is not None:
                    consumer.in_service = False
            del service[priority]
        return None

    def is_active(self, queue: Queue, consumer: Consumer) -> bool:
        """Competing: up and not cancelled; SAC: the active consumer."""
        if queue.consumers.get(consumer.key) is not consumer:
            return False
        return consumer.status in ("up", "quiescing")

    def active(self, queue: Queue) -> Consumer | None:
        """The SAC active consumer (up or quiescing, suspected or not)."""
        for consumer in queue.consumers.values():
            if consumer.status in ("up", "quiescing"):
                return consumer
        return None

    def waiting_eligible(self, consumer: Consumer) -> bool:
        """A waiting consumer that may be activated."""
        return (consumer.suspected_since is None and not consumer.timed_out
                and consumer.status == "up")  # fmt: skip

    # --- storing and taking --------------------------------------------------------------------

    def store(self, ctx: Ctx, queue: Queue, message: Message) -> None:
        """A dead-lettered copy: to the ready queue, or into its group (the default group if no
        room is left)."""
        grouping = queue.grouping
        if grouping is None:
            queue.ready.append(compact(message))
            queue.messages_total += 1
            queue.bytes_ready += message.size
            return
        group_id = group_index.group_of(grouping.config, message.annotations)
        if not group_index.has_room(grouping, group_id, limits.groups_per_queue_max):
            group_id = None
        self.store_grouped(ctx, queue, grouping, message, group_id)

    def store_grouped(
        self, ctx: Ctx, queue: Queue, grouping: Grouping, message: Message, group_id: GroupId
    ) -> None:
        """Add a new message to its group (room was made by the caller)."""
        group_index.make_room(grouping, group_id, limits.groups_per_queue_max)
        message.pos = grouping.next_pos
        grouping.next_pos += 1
        message.group = group_id
        message.enqueued_at = ctx.now
        group_index.add_ready(grouping, group_index.group_for(grouping, group_id), message)
        queue.messages_total += 1
        queue.bytes_ready += message.size

    def take_from(self, queue: Queue, grouping: Grouping, group: Group) -> Message:
        """Remove the head of a group from the waiting messages."""
        message = group_index.take_head(grouping, group)
        queue.bytes_ready -= message.size
        return message

    def pop_head(self, queue: Queue) -> Message | None:
        """drop-head: the next message in delivery order (returns first), or the oldest waiting
        message of any group (which may free its group), fixing the byte counter."""
        grouping = queue.grouping
        if grouping is not None:
            group = group_index.oldest(grouping)
            return None if group is None else self.take_from(queue, grouping, group)
        source = queue.returns if queue.returns else queue.ready
        if not source:
            return None
        message = inflate(source.popleft())
        queue.bytes_ready -= message.size
        return message

    # --- message-group ownership ---------------------------------------------------------------

    def sticky(self, queue: Queue, consumer: Consumer) -> bool:
        """Whether `consumer` keeps its groups while it holds nothing of them (exclusive, alive)."""
        grouping = queue.grouping
        return (
            grouping is not None
            and grouping.config.policy == "exclusive"
            and not queue.config.single_active_consumer
            and queue.consumers.get(consumer.key) is consumer
            and consumer.status == "up"
            and not consumer.once
            and not consumer.timed_out
            and not consumer.disconnected_fired
        )

    def left(self, queue: Queue, grouping: Grouping, consumer: Consumer, message: Message) -> None:
        """A message of `consumer` was settled, returned or dead-lettered: its group may be
        freed."""
        group = grouping.groups[message.group]
        held = group.checked_out - 1
        group.checked_out = held
        if held == 0 and (grouping.config.policy == "sequenced"
                          or not self.sticky(queue, consumer)):  # fmt: skip
            group_index.release(grouping, group)
        else:
            group_index.tidy(grouping, group)

    def release_consumer(self, queue: Queue, consumer: Consumer) -> None:
        """`consumer` may have stopped being a sticky owner: free its idle groups if so."""
        grouping = queue.grouping
        if (grouping is not None and consumer.key in grouping.by_owner
                and not self.sticky(queue, consumer)):  # fmt: skip
            group_index.release_idle(grouping, consumer.key)
