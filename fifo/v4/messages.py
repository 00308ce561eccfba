"""Machine v4, layer 4a of the per-queue machine: the handlers of commands about messages.
Publish (plain, annotated, grouped; enqueuer dedup), settle, return, discard, modify, lock
renewal, credit, purge and expiry.
"""

from __future__ import annotations

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    AnnotatedEnqueue,
    BoundDiscard,
    BoundModify,
    BoundRenewLocks,
    BoundReturn,
    BoundSettle,
    ConnectionId,
    ConsumerId,
    Credit,
    Discard,
    Enqueue,
    Expire,
    Modify,
    Purge,
    PurgeGroup,
    RegisterEnqueuer,
    RenewLocks,
    Return,
    Settle,
)
from fifo.effects import CreditReply
from fifo.fastbuild import delivery as fast_delivery
from fifo.fastbuild import fresh_delivery, ref_deliver
from fifo.replies import Error, NotEnqueued, PurgeOk, RejectPublish, Reply
from fifo.shared import OK, SERIAL, Annotations, Ctx, invalid, unknown_consumer
from fifo.state import (
    Consumer,
    Enqueuer,
    Group,
    GroupId,
    Grouping,
    Message,
    Queue,
    RefMessage,
    compact,
)
from fifo.v4 import deadlines
from fifo.v4 import groups as group_index
from fifo.v4.consumers import ConsumerLife


def group_limit_error(queue: Queue) -> Error:
    """The reply to a publish that would make the queue track too many groups."""
    return Error("unsupported", f"queue {queue.name!r} already tracks groups_per_queue_max = "
                 f"{limits.groups_per_queue_max} message groups: a new group is refused until "
                 "some groups are settled or purged")  # fmt: skip


def _one_short_pair(annotations: object) -> bool:
    """The common annotations of a grouped publish, valid for sure: one (key, short text) pair
    (63 characters are at most 252 UTF-8 bytes, below annotation_bytes_max)."""
    if type(annotations) is not tuple or len(annotations) != 1:
        return False
    pair = annotations[0]
    if type(pair) is not tuple or len(pair) != 2:
        return False
    key, value = pair
    return (type(key) is str and 0 < len(key) <= 63 and type(value) is str
            and len(value) <= 63)  # fmt: skip


def _body_error(cmd: Enqueue) -> str | None:
    """What is wrong with a publish's body or TTL, or None."""
    body = cmd.body
    if type(body) is not bytes or len(body) > limits.body_bytes_max:
        return f"body must be bytes of at most {limits.body_bytes_max}"
    ttl = cmd.ttl_ms
    if ttl is not None and not v.int_in(ttl, 0, limits.ttl_ms_max):
        return "ttl_ms out of range"
    return None


class MessageHandlers(ConsumerLife):
    """Per-queue handlers of machine v4 for commands about messages."""

    # --- publishing ----------------------------------------------------------------------------

    def enqueue(self, ctx: Ctx, queue: Queue, cmd: Enqueue) -> Reply:
        """Store a message (with enqueuer dedup), deliver, then apply the length limits; a grouped
        queue puts it in the default group."""
        if queue.grouping is not None:
            return self.enqueue_with(ctx, queue, cmd, ())
        if err := _body_error(cmd):
            return invalid(err)
        if cmd.enqueuer is not None or cmd.seq is not None:
            reply = self.track_enqueue(ctx, queue, cmd)
            if reply is not None:
                return reply
        config = queue.config
        message = RefMessage(ctx.index, len(cmd.body), None)
        if cmd.ttl_ms is not None or config.message_ttl_ms is not None:
            message.expiry = self.expiry(ctx, queue, cmd.ttl_ms)
        queue.messages_total += 1
        limited = config.max_length is not None or config.max_bytes is not None
        if queue.service and not queue.ready and not queue.returns:
            consumer = self.next_consumer(queue)
            if consumer is not None:  # fast path: hand the new message straight to a consumer
                self.assign_one(ctx, queue, consumer, message, cmd.body)
                if queue.blocked_count or limited:
                    self.evaluate_limit(ctx, queue)
                return OK
        queue.ready.append(compact(message))
        queue.bytes_ready += len(cmd.body)
        if queue.service:
            self.deliver(ctx, queue)
        if limited or queue.blocked_count:
            self.evaluate_limit(ctx, queue)
        return OK

    def assign_one(
        self, ctx: Ctx, queue: Queue, consumer: Consumer, message: Message, body: bytes
    ) -> None:
        """Deliver one never-delivered message to `consumer`, at the front of its service ring;
        its `body` is in hand (the publish being applied): the delivery carries it."""
        msg_id = self.check_out(ctx, queue, consumer, message)
        ring = queue.service[consumer.priority]
        if consumer.credit > 0:
            ring.rotate(-1)
        else:
            ring.popleft()
            consumer.in_service = False
            if not ring:
                del queue.service[consumer.priority]
        delivery = fresh_delivery(msg_id, body)
        ctx.effects.append(
            ref_deliver(consumer.connection, queue.name, consumer.tag, consumer.key, (delivery,))
        )

    def enqueue_annotated(self, ctx: Ctx, queue: Queue, cmd: AnnotatedEnqueue) -> Reply:
        """A publish with annotations; a grouped queue reads the message's group from them."""
        annotations = cmd.annotations
        if not _one_short_pair(annotations) and (msg := v.annotations_error(annotations)):
            return invalid(msg)
        if queue.grouping is None and not annotations:
            return self.enqueue(ctx, queue, cmd)
        return self.enqueue_with(ctx, queue, cmd, annotations)

    @staticmethod
    def resent(queue: Queue, cmd: Enqueue) -> bool:
        """A publish the enqueuer's dedup will answer as already stored (seq below next_seq)."""
        enqueuer = queue.enqueuers.get(cmd.enqueuer) if type(cmd.enqueuer) is str else None
        seq = cmd.seq
        return enqueuer is not None and type(seq) is int and 1 <= seq < enqueuer.next_seq

    def message_group(self, grouping: Grouping | None, annotations: Annotations) -> GroupId:
        """The group a new message of a grouped queue joins (None: the default group)."""
        if grouping is None:
            return None
        first = annotations[0] if len(annotations) == 1 else None
        if first is not None and first[0] == grouping.config.group_key and type(first[1]) is str:
            return first[1]  # the common case of `group_of`
        return group_index.group_of(grouping.config, annotations)

    def enqueue_with(self, ctx: Ctx, queue: Queue, cmd: Enqueue, annotations: Annotations) -> Reply:
        """Store a message with annotations (into its group), deliver, then apply the limits."""
        if err := _body_error(cmd):
            return invalid(err)
        grouping = queue.grouping
        group_id = self.message_group(grouping, annotations)
        if (grouping is not None and group_id not in grouping.groups and not self.resent(queue, cmd)
                and not group_index.has_room(grouping, group_id,
                                             limits.groups_per_queue_max)):  # fmt: skip
            return group_limit_error(queue)  # (a resend is answered by the dedup below, as stored)
        if cmd.enqueuer is not None or cmd.seq is not None:
            reply = self.track_enqueue(ctx, queue, cmd)
            if reply is not None:
                return reply
        config = queue.config
        message = RefMessage(ctx.index, len(cmd.body), None)
        message.annotations = annotations
        if cmd.ttl_ms is not None or config.message_ttl_ms is not None:
            message.expiry = self.expiry(ctx, queue, cmd.ttl_ms)
        limited = config.max_length is not None or config.max_bytes is not None
        if grouping is None:
            queue.ready.append(compact(message))
            queue.messages_total += 1
            queue.bytes_ready += len(cmd.body)
        elif queue.service and self.hand_over(ctx, queue, grouping, message, group_id,
                                              cmd.body):  # fmt: skip
            if queue.blocked_count or limited:
                self.evaluate_limit(ctx, queue)
            return OK
        else:
            self.store_grouped(ctx, queue, grouping, message, group_id)
        if queue.service:
            self.deliver(ctx, queue)
        if limited or queue.blocked_count:
            self.evaluate_limit(ctx, queue)
        return OK

    def hand_over_to(self, queue: Queue, group: Group | None) -> Consumer | None:
        """Who a grouped publish's fast path gives the message to: the group's owner if it can
        take it, else (free group) the first eligible consumer of the highest priority."""
        if group is not None and group.owner is not None:
            owner = queue.consumers.get(group.owner)
            if owner is None or not owner.in_service or not self.eligible(owner):
                return None
            return owner
        return self.next_consumer(queue)

    def hand_over(
        self,
        ctx: Ctx,
        queue: Queue,
        grouping: Grouping,
        message: Message,
        group_id: GroupId,
        body: bytes,
    ) -> bool:
        """Fast path of a grouped publish: when its group has nothing waiting, the message is the
        only new thing any consumer can take, so it goes straight to the consumer `deliver`
        would pick (the delivery carries `body`, in hand). False: store it, let `deliver` run."""
        group = grouping.groups.get(group_id)
        if group is not None and (group.returns or group.ready):
            return False
        consumer = self.hand_over_to(queue, group)
        if consumer is None:
            return False
        key = consumer.key
        if group is None:
            if len(grouping.groups) >= limits.groups_per_queue_max:
                group_index.make_room(grouping, group_id, limits.groups_per_queue_max)
            group = grouping.groups[group_id] = Group(group_id)
        message.pos = grouping.next_pos
        grouping.next_pos += 1
        message.group = group_id
        message.enqueued_at = ctx.now
        group_index.assign(grouping, group, key)
        queue.messages_total += 1
        msg_id = self.check_out(ctx, queue, consumer, message)
        ring = queue.service[consumer.priority]
        if ring[0] == key:  # rotate as `deliver` does: served, to the back (or out)
            ring.popleft()
        else:
            ring.remove(key)
        if consumer.credit > 0:
            ring.append(key)
        else:
            consumer.in_service = False
            if not ring:
                del queue.service[consumer.priority]
        delivery = fast_delivery(msg_id, body, False, 0, message.annotations)
        ctx.effects.append(ref_deliver(consumer.connection, queue.name, consumer.tag, key,
                                        (delivery,)))  # fmt: skip
        return True

    # --- enqueuers -----------------------------------------------------------------------------

    def track_enqueue(self, ctx: Ctx, queue: Queue, cmd: Enqueue) -> Reply | None:
        """Dedup by (enqueuer, seq): None means store the message, else the reply to give."""
        err = v.name_error(cmd.enqueuer, "enqueuer", limits.enqueuer_name_bytes_max)
        if err:
            return invalid(err)
        if not v.int_in(cmd.seq, 1, limits.seq_max):
            return invalid("seq must be an int >= 1 when enqueuer is set")
        if cmd.connection is not None and (err := v.connection_error(cmd.connection)):
            return invalid(err)
        assert cmd.enqueuer is not None and cmd.seq is not None
        enqueuer = queue.enqueuers.get(cmd.enqueuer)
        if enqueuer is None:
            added = self.add_enqueuer(ctx, queue, cmd.enqueuer, cmd.connection)
            if isinstance(added, Error):
                return added
            enqueuer = added
        elif cmd.connection is not None:
            self.bind_enqueuer(enqueuer, cmd.connection)
        if cmd.seq == enqueuer.next_seq:
            enqueuer.next_seq += 1
            return None
        if cmd.seq > enqueuer.next_seq:
            return NotEnqueued(enqueuer.next_seq)
        return OK  # duplicate: already stored

    def add_enqueuer(
        self, ctx: Ctx, queue: Queue, name: str, connection: ConnectionId | None
    ) -> Enqueuer | Error:
        """Create an enqueuer, evicting the earliest-down one at the cap."""
        if len(queue.enqueuers) >= limits.enqueuers_per_queue_max:
            down = [e for e in queue.enqueuers.values() if e.status == "down"]
            if not down:
                return Error("unsupported", "enqueuers_per_queue_max reached")
            victim = min(down, key=lambda e: (e.down_index, e.name))
            if victim.blocked is not None:
                queue.blocked_count -= 1
            del queue.enqueuers[victim.name]
        enqueuer = Enqueuer(name, connection)
        queue.enqueuers[name] = enqueuer
        return enqueuer

    def bind_enqueuer(self, enqueuer: Enqueuer, connection: ConnectionId) -> None:
        """(Re)bind an enqueuer to the connection it now publishes on."""
        enqueuer.connection = connection
        enqueuer.status = "up"

    def register_enqueuer(self, ctx: Ctx, queue: Queue, cmd: RegisterEnqueuer) -> Reply:
        """Make an enqueuer known; RejectPublish while over a reject_publish limit."""
        err = v.name_error(cmd.enqueuer, "enqueuer", limits.enqueuer_name_bytes_max)
        err = err or v.connection_error(cmd.connection)
        if err:
            return invalid(err)
        enqueuer = queue.enqueuers.get(cmd.enqueuer)
        if enqueuer is None:
            added = self.add_enqueuer(ctx, queue, cmd.enqueuer, cmd.connection)
            if isinstance(added, Error):
                return added
            enqueuer = added
        else:
            self.bind_enqueuer(enqueuer, cmd.connection)
        if queue.config.overflow == "reject_publish" and self.over_limit(queue):
            if enqueuer.blocked is None:
                enqueuer.blocked = ctx.index
                queue.blocked_count += 1
            return RejectPublish()
        return OK

    # --- settling ------------------------------------------------------------------------------

    def settle(self, ctx: Ctx, queue: Queue, cmd: Settle) -> Reply:
        """Acknowledge messages; credit is refilled for simple_prefetch consumers; settled
        messages free their groups."""
        key = cmd.consumer_key
        grouping = queue.grouping
        fast_key = type(key) is int or (grouping is None and type(key) is ConsumerId)
        consumer = queue.consumers.get(key) if fast_key else None
        if consumer is None:
            consumer, err = self.find_key(queue, key)
            if consumer is None:
                return err or unknown_consumer(key)
        ids = cmd.msg_ids
        fast_ids = type(ids) is tuple and len(ids) == 1 and type(ids[0]) is int and ids[0] >= 0
        if not fast_ids and (msg := v.msg_ids_error(ids)):
            return invalid(msg)
        if consumer.timed_out:
            self.untimeout(queue, consumer, ids)
        if grouping is None:
            count = self.settle_plain(queue, consumer, ids)
        else:
            count = self.settle_grouped(queue, grouping, consumer, ids)
        queue.messages_total -= count
        if (consumer.status == "up" and not consumer.once and not consumer.credited
                and queue.consumers.get(consumer.key) is consumer):  # fmt: skip
            if count:  # fast path: a plain consumer acked; refill credit and hand out more
                consumer.credit = min(consumer.prefetch, consumer.credit + count)
            if not consumer.in_service:
                self.service_add(queue, consumer)
            config = queue.config
            if (grouping is None or grouping.waiting or config.single_active_consumer
                    or queue.blocked_count or config.max_length is not None
                    or config.max_bytes is not None):  # fmt: skip
                self.after_change(ctx, queue)  # (else it would do nothing)
        else:
            self.consumer_done(ctx, queue, consumer, count)
        return OK

    def settle_plain(self, queue: Queue, consumer: Consumer, ids: tuple[int, ...]) -> int:
        """Drop settled messages of an ungrouped queue; returns how many were held."""
        checked_out = consumer.checked_out
        count = 0
        for msg_id in ids:
            message = checked_out.pop(msg_id, None)
            if message is not None:
                count += 1
                queue.bytes_checkout -= message.size
        return count

    def settle_grouped(
        self, queue: Queue, grouping: Grouping, consumer: Consumer, ids: tuple[int, ...]
    ) -> int:
        """Drop settled messages of a grouped queue, freeing their groups; returns how many."""
        count = 0
        checked_out, groups, owner = consumer.checked_out, grouping.groups, consumer.key
        plain = grouping.config.policy == "sequenced"
        for msg_id in ids:
            message = checked_out.pop(msg_id, None)
            if message is None:
                continue
            count += 1
            queue.bytes_checkout -= message.size
            group = groups[message.group]
            if (plain and group.checked_out == 1 and group.owner == owner and not group.returns
                    and not group.ready):  # fmt: skip
                # the common case of `left`, inlined: the last held message of a group with
                # nothing waiting: the group is free and empty, so it is no longer tracked
                group.checked_out = 0
                owned = grouping.by_owner[owner]
                del owned[group.gid]
                if not owned:
                    del grouping.by_owner[owner]
                del groups[group.gid]
                if grouping.idle:
                    grouping.idle.pop(group.gid, None)
            else:
                self.left(queue, grouping, consumer, message)
        return count

    def return_(self, ctx: Ctx, queue: Queue, cmd: Return) -> Reply:
        """Give messages back to the returns queue, in the order listed."""
        consumer = self.holder(queue, cmd.consumer_key, cmd.msg_ids)
        if isinstance(consumer, Error):
            return consumer
        self.untimeout(queue, consumer, cmd.msg_ids)
        count = self.return_msgs(ctx, queue, consumer, cmd.msg_ids, delivery_failed=False)
        self.consumer_done(ctx, queue, consumer, count)
        return OK

    def discard(self, ctx: Ctx, queue: Queue, cmd: Discard) -> Reply:
        """Reject messages: a failed delivery; they are dead-lettered in the order given."""
        consumer = self.holder(queue, cmd.consumer_key, cmd.msg_ids)
        if isinstance(consumer, Error):
            return consumer
        self.untimeout(queue, consumer, cmd.msg_ids)
        count = self.discard_msgs(ctx, queue, consumer, cmd.msg_ids, True, ())
        self.consumer_done(ctx, queue, consumer, count)
        return OK

    def modify(self, ctx: Ctx, queue: Queue, cmd: Modify) -> Reply:
        """AMQP modified: return (or dead-letter if undeliverable here) with annotations."""
        consumer = self.holder(queue, cmd.consumer_key, cmd.msg_ids)
        if isinstance(consumer, Error):
            return consumer
        if msg := v.annotations_error(cmd.annotations):
            return invalid(msg)
        if not (v.is_bool(cmd.delivery_failed) and v.is_bool(cmd.undeliverable_here)):
            return invalid("delivery_failed and undeliverable_here must be bool")
        self.untimeout(queue, consumer, cmd.msg_ids)
        if cmd.undeliverable_here:
            count = self.discard_msgs(ctx, queue, consumer, cmd.msg_ids, cmd.delivery_failed,
                                      cmd.annotations)  # fmt: skip
        else:
            count = self.return_msgs(ctx, queue, consumer, cmd.msg_ids, cmd.delivery_failed,
                                     cmd.annotations)  # fmt: skip
        self.consumer_done(ctx, queue, consumer, count)
        return OK

    def renew_locks(self, ctx: Ctx, queue: Queue, cmd: RenewLocks) -> Reply:
        """Each named lock now expires at now + the consumer's timeout."""
        consumer = self.holder(queue, cmd.consumer_key, cmd.msg_ids)
        if isinstance(consumer, Error):
            return consumer
        self.untimeout(queue, consumer, cmd.msg_ids)
        expiry = ctx.now + consumer.timeout_ms
        for msg_id in cmd.msg_ids:
            message = consumer.checked_out.get(msg_id)
            if message is not None:
                message.lock = expiry
                deadlines.track(ctx.state, queue, consumer, msg_id, message)
        self.consumer_done(ctx, queue, consumer, 0)
        return OK

    # --- the same, bound to the submitting connection (issue 31) ------------------------------

    def settle_bound(self, ctx: Ctx, queue: Queue, cmd: BoundSettle) -> Reply:
        """A Settle accepted only from the consumer's own connection."""
        refusal = self.owner_refusal(queue, cmd.consumer_key, cmd.connection)
        return refusal if refusal is not None else self.settle(ctx, queue, cmd)

    def return_bound(self, ctx: Ctx, queue: Queue, cmd: BoundReturn) -> Reply:
        """A Return accepted only from the consumer's own connection."""
        refusal = self.owner_refusal(queue, cmd.consumer_key, cmd.connection)
        return refusal if refusal is not None else self.return_(ctx, queue, cmd)

    def discard_bound(self, ctx: Ctx, queue: Queue, cmd: BoundDiscard) -> Reply:
        """A Discard accepted only from the consumer's own connection."""
        refusal = self.owner_refusal(queue, cmd.consumer_key, cmd.connection)
        return refusal if refusal is not None else self.discard(ctx, queue, cmd)

    def modify_bound(self, ctx: Ctx, queue: Queue, cmd: BoundModify) -> Reply:
        """A Modify accepted only from the consumer's own connection."""
        refusal = self.owner_refusal(queue, cmd.consumer_key, cmd.connection)
        return refusal if refusal is not None else self.modify(ctx, queue, cmd)

    def renew_locks_bound(self, ctx: Ctx, queue: Queue, cmd: BoundRenewLocks) -> Reply:
        """A RenewLocks accepted only from the consumer's own connection."""
        refusal = self.owner_refusal(queue, cmd.consumer_key, cmd.connection)
        return refusal if refusal is not None else self.renew_locks(ctx, queue, cmd)

    # --- credit, purge, expiry -----------------------------------------------------------------

    def credit(self, ctx: Ctx, queue: Queue, cmd: Credit) -> Reply:
        """AMQP 1.0 flow: credit = receiver's delivery_count + credit - ours (serial numbers)."""
        consumer, err = self.find_key(queue, cmd.consumer_key)
        if consumer is None:
            return err or unknown_consumer(cmd.consumer_key)
        if not v.int_in(cmd.credit, 0, SERIAL - 1):
            return invalid("credit must be 0..2**32-1")
        if not v.int_in(cmd.delivery_count, 0, SERIAL - 1):
            return invalid("delivery_count must be a 32-bit serial number")
        if not v.is_bool(cmd.drain):
            return invalid("drain must be a bool")
        if not consumer.credited:
            return Error("unsupported", "credit is only for credited consumers")
        diff = (cmd.delivery_count + cmd.credit - consumer.delivery_count) % SERIAL
        if diff >= SERIAL // 2:
            diff -= SERIAL  # receiver is behind: messages are in flight
        consumer.credit = 0 if consumer.once else max(0, diff)  # a cancelled one takes none
        consumer.drain = cmd.drain
        active = queue.consumers.get(consumer.key) is consumer
        if active:
            self.service_add(queue, consumer)
            if queue.service:
                self.deliver(ctx, queue)
        if cmd.drain and consumer.credit > 0:
            consumer.delivery_count = (consumer.delivery_count + consumer.credit) % SERIAL
            consumer.credit = 0
        if not active:
            self.resort_waiting(queue)
        available = self.waiting_count(queue) if active else 0
        ctx.effects.append(
            CreditReply(consumer.connection, queue.name, consumer.tag, consumer.key,
                        consumer.delivery_count, consumer.credit, available, cmd.drain,
                        active and self.is_active(queue, consumer))
        )  # fmt: skip
        self.after_change(ctx, queue)
        return OK

    def purge(self, ctx: Ctx, queue: Queue, cmd: Purge) -> Reply:
        """Drop every waiting message (of every group); checked-out ones stay."""
        grouping = queue.grouping
        if grouping is not None:
            count = 0
            for group in list(grouping.groups.values()):
                count += self.clear_group(queue, grouping, group)
            grouping.rebuild()  # every head changed: drop the stale entries at once
        else:
            count = len(queue.ready) + len(queue.returns)
            queue.ready.clear()
            queue.returns.clear()
            queue.bytes_ready = 0
            queue.messages_total -= count
        self.after_change(ctx, queue)
        return PurgeOk(count)

    def clear_group(self, queue: Queue, grouping: Grouping, group: Group) -> int:
        """Drop a group's waiting messages (counters fixed); returns how many."""
        count = len(group.returns) + len(group.ready)
        size = sum(message.size for message in (*group.returns, *group.ready))
        group.returns.clear()
        group.ready.clear()
        grouping.waiting -= count
        queue.bytes_ready -= size
        queue.messages_total -= count
        group_index.tidy(grouping, group)
        return count

    def purge_group(self, ctx: Ctx, queue: Queue, cmd: PurgeGroup) -> Reply:
        """Drop the waiting messages of one group; checked-out ones stay."""
        group_id = cmd.group
        if group_id is not None and (
                err := v.name_error(group_id, "group", limits.annotation_bytes_max)):  # fmt: skip
            return invalid(err)
        grouping = queue.grouping
        if grouping is None:
            return Error("unsupported", f"queue {queue.name!r} has no message groups")
        group = grouping.groups.get(group_id)
        count = 0 if group is None else self.clear_group(queue, grouping, group)
        self.after_change(ctx, queue)
        return PurgeOk(count)

    def expire(self, ctx: Ctx, queue: Queue, cmd: Expire) -> Reply:
        """Leader timer: dead-letter expired head messages, then deliver."""
        self.expire_head(ctx, queue)
        self.after_change(ctx, queue)
        return OK
