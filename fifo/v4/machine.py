"""Machine v4, layer 4b of the per-queue machine: consumers' commands and the handler table.
Checkout (attach, cancel, remove, dequeue), rebalancing idle message groups on join, consumer
timeouts by deadline (`fifo.v4.deadlines`), disconnected timeouts, connections and nodes going
down or up, and a queue's deletion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    AnnotatedEnqueue,
    BoundDiscard,
    BoundModify,
    BoundRenewLocks,
    BoundReturn,
    BoundSettle,
    Cancel,
    Checkout,
    ConnectionDown,
    ConnectionId,
    ConsumerDisconnectedTimeout,
    ConsumerId,
    ConsumerKey,
    Credit,
    Credited,
    Dequeue,
    Discard,
    Enqueue,
    EvalConsumerTimeouts,
    Expire,
    Modify,
    NodeDown,
    NodeUp,
    Purge,
    PurgeGroup,
    RegisterEnqueuer,
    Remove,
    RenewLocks,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import ConsumerCancelled, ConsumerUpdate, Released
from fifo.replies import CancelOk, CheckoutOk, DequeueOk, Error, Reply
from fifo.shared import OK, SERIAL, Ctx, invalid, unknown_consumer
from fifo.state import Consumer, Grouping, Message, Queue
from fifo.v4 import deadlines
from fifo.v4 import groups as group_index
from fifo.v4.messages import MessageHandlers
from fifo.v4.refs import dequeued
from fifo.v4.routing import partitioned_of

Handler = Callable[[Ctx, Queue, Any], Reply]


def _checkout_spec_error(cmd: Checkout) -> str | None:
    """What is wrong with an attaching checkout's spec, priority or timeout, or None."""
    spec = cmd.spec
    if type(spec) is SimplePrefetch:
        if not v.int_in(spec.prefetch, 0, limits.prefetch_max):
            return f"prefetch must be 0..{limits.prefetch_max}"
    elif type(spec) is Credited:
        if not v.int_in(spec.initial_delivery_count, 0, SERIAL - 1):
            return "initial_delivery_count must be a 32-bit serial number"
    else:
        return "unknown checkout spec"
    if not v.int_in(cmd.priority, -limits.priority_abs_max, limits.priority_abs_max):
        return "priority out of range"
    if not v.opt_int_in(cmd.timeout_ms, 1, limits.timeout_ms_max):
        return "timeout_ms out of range"
    return None


class QueueMachine(MessageHandlers):
    """The per-queue command handlers of machine version 4 (`handlers`: command type -> handler)."""

    def __init__(self) -> None:
        self.handlers: dict[type, Handler] = {
            Enqueue: self.enqueue,
            RegisterEnqueuer: self.register_enqueuer,
            Checkout: self.checkout,
            Settle: self.settle,
            Return: self.return_,
            Discard: self.discard,
            Credit: self.credit,
            Purge: self.purge,
            Expire: self.expire,
            Modify: self.modify,
            RenewLocks: self.renew_locks,
            EvalConsumerTimeouts: self.eval_consumer_timeouts,
            ConsumerDisconnectedTimeout: self.consumer_disconnected_timeout,
            AnnotatedEnqueue: self.enqueue_annotated,
            PurgeGroup: self.purge_group,
            BoundSettle: self.settle_bound,
            BoundReturn: self.return_bound,
            BoundDiscard: self.discard_bound,
            BoundModify: self.modify_bound,
            BoundRenewLocks: self.renew_locks_bound,
        }

    # --- checkout ------------------------------------------------------------------------------

    def checkout(self, ctx: Ctx, queue: Queue, cmd: Checkout) -> Reply:
        """Attach or update a consumer, cancel or remove one, or dequeue one message; refused
        on a partition queue (consumer groups check out there themselves)."""
        if ctx.state.partitioned and partitioned_of(ctx.state, queue.name) is not None:
            return Error("unsupported", f"{queue.name!r} is a partition: consume it through a "
                         "consumer group (JoinGroup)")  # fmt: skip
        if err := v.consumer_id_error(cmd.consumer):
            return invalid(err)
        kind = type(cmd.spec)
        if kind is Cancel:
            return self.cancel(ctx, queue, cmd)
        if kind is Dequeue:
            return self.dequeue(ctx, queue, cmd)
        if kind is Remove:
            return self.remove(ctx, queue, cmd)
        if err := _checkout_spec_error(cmd):
            return invalid(err)
        return self.consume(ctx, queue, cmd)

    def consume(self, ctx: Ctx, queue: Queue, cmd: Checkout) -> Reply:
        """Register (or update) a competing or SAC consumer, then deliver; with
        rebalance_groups_on_join a new consumer takes over idle groups."""
        grouping = queue.grouping
        consumer = self.resolve(queue, cmd.consumer)
        fresh = consumer is None
        if consumer is None:
            if len(queue.consumers) + len(queue.waiting) >= limits.consumers_per_queue_max:
                return Error("unsupported", "consumers_per_queue_max reached")
            key = ctx.index  # a new consumer is keyed by the Raft index of its checkout
            if key in queue.consumers or any(waiting.key == key for waiting in queue.waiting):
                return invalid("consumer key already in use")
            consumer = Consumer(key, cmd.consumer.tag, cmd.consumer.connection, ctx.index)
            self.configure(queue, consumer, cmd, fresh=True)
            queue.key_by_id[cmd.consumer] = key
            if queue.config.single_active_consumer:
                self.add_waiting(queue, consumer)
            else:
                queue.consumers[key] = consumer
        else:
            was = consumer.status
            self.service_remove(queue, consumer)
            self.configure(queue, consumer, cmd, fresh=False)
            if queue.config.single_active_consumer:
                self.sac_reattach(ctx, queue, consumer, was)
        if queue.config.single_active_consumer:
            self.activate_next(ctx, queue)
        self.service_add(queue, consumer)
        reply = CheckoutOk(consumer.key, consumer.next_msg_id, consumer.credit,
                           consumer.delivery_count, self.is_active(queue, consumer),
                           len(consumer.checked_out))  # fmt: skip
        self.after_change(ctx, queue)
        if (fresh and grouping is not None and grouping.config.rebalance_groups_on_join
                and grouping.config.policy == "exclusive"
                and not queue.config.single_active_consumer
                and self.rebalance(queue, grouping)):  # fmt: skip
            self.after_change(ctx, queue)
        return reply

    def rebalance(self, queue: Queue, grouping: Grouping) -> int:
        """Move groups with nothing checked out from the fullest owner to the emptiest, until
        owners differ by at most one group; returns the number of moves."""
        live = [each for each in queue.consumers.values() if self.sticky(queue, each)]
        if len(live) < 2:
            return 0
        count = {owner.key: len(grouping.by_owner.get(owner.key, ())) for owner in live}
        order = {owner.key: owner.attach_index for owner in live}
        stuck: set[object] = set()  # donors with nothing movable left
        moves = 0
        while True:
            low = min(count, key=lambda k: (count[k], order[k]))
            donors = [k for k in count if k not in stuck]
            if not donors:
                return moves
            high = max(donors, key=lambda k: (count[k], -order[k]))
            if count[high] - count[low] <= 1:
                return moves
            movable = [group_id for group_id in grouping.by_owner.get(high, ())
                       if grouping.groups[group_id].checked_out == 0]  # fmt: skip
            if not movable:
                stuck.add(high)
                continue
            group_id = max(movable, key=group_index.sort_key)
            group_index.move(grouping, grouping.groups[group_id], low)
            count[high] -= 1
            count[low] += 1
            moves += 1

    def cancel(self, ctx: Ctx, queue: Queue, cmd: Checkout) -> Reply:
        """Soft cancel: no new messages; the consumer leaves once its pending ones are done (it
        keeps only the groups it still holds messages of)."""
        consumer = self.resolve(queue, cmd.consumer)
        if consumer is None:
            return unknown_consumer(cmd.consumer)
        self.release_later(queue, consumer)
        if queue.consumers.get(consumer.key) is not consumer:
            if not consumer.checked_out:
                self.drop_waiting(ctx, queue, consumer, "cancel")
                self.after_change(ctx, queue)
                return CancelOk(None, 0)
            # a waiting consumer still holding messages (a cancelled one that checked out again)
            # keeps them until they are settled or returned, like any cancelled consumer
            queue.waiting.remove(consumer)
            queue.consumers[consumer.key] = consumer
        if consumer.status != "cancelled":
            self.service_remove(queue, consumer)
            consumer.status, consumer.once, consumer.credit = "cancelled", True, 0
            ctx.effects.append(ConsumerCancelled(consumer.connection, queue.name, consumer.tag,
                                                 consumer.key, "cancel"))  # fmt: skip
        queue.last_active = ctx.now
        held = len(consumer.checked_out)
        if not held:
            self.drop_consumer(queue, consumer)
        self.after_change(ctx, queue)
        return CancelOk(consumer.key if held else None, held)

    def remove(self, ctx: Ctx, queue: Queue, cmd: Checkout) -> Reply:
        """Hard cancel: pending messages are returned at once (not a failed delivery)."""
        consumer = self.resolve(queue, cmd.consumer)
        if consumer is None:
            return unknown_consumer(cmd.consumer)
        if queue.consumers.get(consumer.key) is not consumer:
            self.drop_waiting(ctx, queue, consumer, "remove")
        else:
            self.return_all(ctx, queue, consumer, delivery_failed=False)
            self.drop_consumer(queue, consumer)
            ctx.effects.append(ConsumerCancelled(consumer.connection, queue.name, consumer.tag,
                                                 consumer.key, "remove"))  # fmt: skip
        queue.last_active = ctx.now
        self.after_change(ctx, queue)
        return CancelOk(None, 0)

    # --- dequeue -------------------------------------------------------------------------------

    def dequeue(self, ctx: Ctx, queue: Queue, cmd: Checkout) -> Reply:
        """basic.get: one message; settled at once, or held by a once-consumer until settled (a
        grouped queue hands out the oldest head of a free group, owned until settled)."""
        assert isinstance(cmd.spec, Dequeue)
        if not v.is_bool(cmd.spec.settled):
            return invalid("settled must be a bool")
        if queue.config.single_active_consumer:
            return Error(
                "unsupported", "dequeue is not supported on a single active consumer queue"
            )
        if self.resolve(queue, cmd.consumer) is not None:
            # the id names a consumer already on the queue: `empty`, nothing changes (rabbit_fifo)
            return DequeueOk(None, self.waiting_count(queue))
        key = ctx.index
        if not cmd.spec.settled:
            if len(queue.consumers) + len(queue.waiting) >= limits.consumers_per_queue_max:
                return Error("unsupported", "consumers_per_queue_max reached")
            if key in queue.consumers:
                return invalid("consumer key already in use")
        queue.last_active = ctx.now
        message = self.dequeue_take(ctx, queue, key, bool(cmd.spec.settled))
        if message is None:
            if queue.grouping is not None:
                self.after_change(ctx, queue)  # expired heads may have been dead-lettered
            return DequeueOk(None, 0)
        if cmd.spec.settled:
            queue.messages_total -= 1
            self.after_change(ctx, queue)
            return dequeued(message, self.waiting_count(queue), None)
        consumer = Consumer(key, cmd.consumer.tag, cmd.consumer.connection, ctx.index)
        consumer.once, consumer.prefetch, consumer.next_msg_id = True, 1, 1
        consumer.timeout_ms = cmd.timeout_ms or queue.config.consumer_timeout_ms
        consumer.checked_out[0] = message
        message.lock = ctx.now + consumer.timeout_ms
        consumer.delivery_count = 1
        queue.bytes_checkout += message.size
        queue.consumers[key] = consumer
        queue.key_by_id[cmd.consumer] = key
        deadlines.track(ctx.state, queue, consumer, 0, message)
        self.after_change(ctx, queue)
        return dequeued(message, self.waiting_count(queue), key)

    def dequeue_take(self, ctx: Ctx, queue: Queue, key: ConsumerKey, settled: bool) -> (
            Message | None):  # fmt: skip
        """The message a dequeue gets, taken off the waiting ones (grouped: the oldest head of a
        free group, which an unsettled dequeue's consumer `key` then owns)."""
        grouping = queue.grouping
        if grouping is None:
            return self.take(ctx, queue)
        found = self.grouped_take(ctx, queue, grouping, None)
        if found is None:
            return None
        group, message = found
        if not settled:
            group_index.assign(grouping, group, key)
        self.take_from(queue, grouping, group)
        return message

    # --- timeouts ------------------------------------------------------------------------------

    def eval_consumer_timeouts(self, ctx: Ctx, queue: Queue, cmd: EvalConsumerTimeouts) -> Reply:
        """Return expired locks; their consumers are timed out (a SAC active one is replaced)."""
        keys = cmd.consumer_keys
        if type(keys) is not tuple or len(keys) > limits.consumer_keys_per_command_max:
            return invalid("consumer_keys must be a short tuple")
        for key in keys:
            if err := v.key_error(key):
                return invalid(err)
        done: list[Consumer] = []
        for key in keys:
            consumer = self.resolve(queue, key)  # stale keys (gone since the timer) are skipped
            if consumer is None or any(d is consumer for d in done):
                continue
            if (queue.consumers.get(consumer.key) is not consumer
                    and not any(waiting is consumer for waiting in queue.waiting)):  # fmt: skip
                continue
            done.append(consumer)
            self.time_out(ctx, queue, consumer)
        self.after_change(ctx, queue)
        return OK

    def time_out(self, ctx: Ctx, queue: Queue, consumer: Consumer) -> None:
        """Time out one consumer whose locks expired at `ctx.now` (found by deadline, not by a
        scan); a timed-out owner's groups are freed as its messages come back."""
        expired = deadlines.expired_ids(ctx.state, queue, consumer, ctx.now)
        if expired:
            self.return_expired(ctx, queue, consumer, expired)
        self.release_consumer(queue, consumer)

    def return_expired(
        self, ctx: Ctx, queue: Queue, consumer: Consumer, expired: list[int]
    ) -> None:
        """Return what timed out (all a SAC active consumer holds) and mark the consumer."""
        waiting = queue.consumers.get(consumer.key) is not consumer  # a waiting holder
        sac_active = (not waiting and queue.config.single_active_consumer
                      and consumer.status in ("up", "quiescing"))  # fmt: skip
        ids = sorted(consumer.checked_out) if sac_active else expired
        count = self.return_msgs(ctx, queue, consumer, ids, delivery_failed=False)
        consumer.timed_out = sorted(dict.fromkeys((*consumer.timed_out, *ids)))
        ctx.effects.append(Released(consumer.connection, queue.name, consumer.tag, consumer.key,
                                    tuple(ids), "timeout"))  # fmt: skip
        if not consumer.credited and not consumer.once:
            consumer.credit = min(consumer.prefetch, consumer.credit + count)
        if waiting:
            self.resort_waiting(queue)  # timed out: behind every up consumer until it settles
            return
        if consumer.status == "cancelled" or consumer.once:
            if not consumer.checked_out:
                self.drop_consumer(queue, consumer)
        elif sac_active:
            self.to_waiting(ctx, queue, consumer, notify=True)

    def consumer_disconnected_timeout(
        self, ctx: Ctx, queue: Queue, cmd: ConsumerDisconnectedTimeout
    ) -> Reply:
        """A suspected consumer stayed away too long: its messages are returned (and its groups
        freed)."""
        grouping = queue.grouping
        consumer = self.resolve(queue, cmd.consumer_key) if grouping is not None else None
        if (grouping is not None and consumer is not None
                and consumer.suspected_since is not None
                and not consumer.disconnected_fired):  # fmt: skip
            group_index.release_idle(grouping, consumer.key)  # before it is marked fired
        consumer, err = self.find_key(queue, cmd.consumer_key)
        if consumer is None:
            return err or unknown_consumer(cmd.consumer_key)
        if consumer.suspected_since is None or consumer.disconnected_fired:
            return OK  # stale timer: it came back or the timeout already ran
        consumer.disconnected_fired = True
        if queue.consumers.get(consumer.key) is consumer:
            self.return_all(ctx, queue, consumer, delivery_failed=False)
            if not consumer.credited:
                consumer.credit = consumer.prefetch
            if consumer.status == "cancelled" or consumer.once:
                self.drop_consumer(queue, consumer)
            elif queue.config.single_active_consumer:
                self.to_waiting(ctx, queue, consumer, notify=False)
            queue.last_active = ctx.now
        elif consumer.checked_out:  # a waiting holder (cancelled, then back): it stays waiting
            self.return_all(ctx, queue, consumer, delivery_failed=False)
            if not consumer.credited:
                consumer.credit = consumer.prefetch
            self.resort_waiting(queue)
            queue.last_active = ctx.now
        self.after_change(ctx, queue)
        return OK

    # --- connections and nodes -----------------------------------------------------------------

    def connection_down(self, ctx: Ctx, queue: Queue, cmd: ConnectionDown) -> None:
        """A connection closed (`normal`) or is unreachable (`noconnection`)."""
        connection = cmd.connection
        if cmd.reason == "normal":
            self.down_normal(ctx, queue, lambda x: x == connection)
        else:
            self.down_noconnection(ctx, queue, lambda x: x == connection)

    def node_down(self, ctx: Ctx, queue: Queue, cmd: NodeDown) -> None:
        """Every connection of the node is treated as `noconnection`."""
        node = cmd.node
        self.down_noconnection(ctx, queue, lambda x: x.node == node)

    def down_normal(self, ctx: Ctx, queue: Queue, match: Callable[[ConnectionId], bool]) -> None:
        """Enqueuers go down (keeping dedup); consumers leave with a failed delivery each."""
        self.enqueuers_status(ctx, queue, match, "down")
        for waiting_consumer in [each for each in queue.waiting if match(each.connection)]:
            self.drop_waiting(ctx, queue, waiting_consumer, "down", delivery_failed=True)
        for consumer in [each for each in queue.consumers.values() if match(each.connection)]:
            self.return_all(ctx, queue, consumer, delivery_failed=True)
            self.drop_consumer(queue, consumer)
            ctx.effects.append(ConsumerCancelled(consumer.connection, queue.name, consumer.tag,
                                                 consumer.key, "down"))  # fmt: skip
            queue.last_active = ctx.now
        self.after_change(ctx, queue)

    def enqueuers_status(
        self, ctx: Ctx, queue: Queue, match: Callable[[ConnectionId], bool], status: str
    ) -> None:
        """Mark the enqueuers bound to matching connections."""
        for enqueuer in queue.enqueuers.values():
            if (enqueuer.connection is not None and match(enqueuer.connection)
                    and enqueuer.status != "down"):  # fmt: skip
                enqueuer.status = status
                if status == "down":
                    enqueuer.down_index = ctx.index

    def down_noconnection(
        self, ctx: Ctx, queue: Queue, match: Callable[[ConnectionId], bool]
    ) -> None:
        """Consumers are only suspected (they keep their messages, get nothing new)."""
        self.enqueuers_status(ctx, queue, match, "suspected")
        for waiting_consumer in queue.waiting:
            if match(waiting_consumer.connection) and waiting_consumer.suspected_since is None:
                waiting_consumer.suspected_since = ctx.now
                waiting_consumer.disconnected_fired = False
        self.resort_waiting(queue)
        for consumer in [each for each in queue.consumers.values() if match(each.connection)]:
            if consumer.status == "cancelled" or consumer.once:
                self.return_all(ctx, queue, consumer, delivery_failed=False)
                self.drop_consumer(queue, consumer)
            elif consumer.suspected_since is None:
                consumer.suspected_since = ctx.now
                consumer.disconnected_fired = False
                self.service_remove(queue, consumer)
                update = ConsumerUpdate(consumer.connection, queue.name, consumer.tag,
                                        consumer.key, False, "suspected_down")  # fmt: skip
                ctx.effects.append(update)
        queue.last_active = ctx.now
        self.after_change(ctx, queue)

    def node_up(self, ctx: Ctx, queue: Queue, cmd: NodeUp) -> None:
        """Suspected consumers and enqueuers of the node are up again."""
        node = cmd.node
        for enqueuer in queue.enqueuers.values():
            if (enqueuer.status == "suspected" and enqueuer.connection is not None
                    and enqueuer.connection.node == node):  # fmt: skip
                enqueuer.status = "up"
        for waiting_consumer in queue.waiting:
            if (waiting_consumer.suspected_since is not None
                    and waiting_consumer.connection.node == node):  # fmt: skip
                waiting_consumer.suspected_since = None
                waiting_consumer.disconnected_fired = False
        self.resort_waiting(queue)
        for consumer in queue.consumers.values():
            if consumer.suspected_since is not None and consumer.connection.node == node:
                consumer.suspected_since = None
                consumer.disconnected_fired = False
                if not queue.config.single_active_consumer:
                    up = not consumer.timed_out
                    ctx.effects.append(ConsumerUpdate(consumer.connection, queue.name,
                                                      consumer.tag, consumer.key, up,
                                                      "up" if up else "timeout"))  # fmt: skip
                self.service_add(queue, consumer)
        self.after_change(ctx, queue)

    def delete(self, ctx: Ctx, queue: Queue) -> int:
        """The queue is deleted: tell every consumer; return the number of messages lost."""
        for consumer in (*queue.consumers.values(), *queue.waiting):
            ctx.effects.append(ConsumerCancelled(consumer.connection, queue.name, consumer.tag,
                                                 consumer.key, "queue_deleted"))  # fmt: skip
        return queue.messages_total

    def end_consumer(self, ctx: Ctx, queue: Queue, consumer: Consumer) -> None:
        """A revoked consumer-group member's consumer leaves its partition at once (its messages
        come back)."""
        if consumer.checked_out:
            self.return_all(ctx, queue, consumer, delivery_failed=False)
        if queue.consumers.get(consumer.key) is consumer:
            self.drop_consumer(queue, consumer)
        elif consumer in queue.waiting:
            queue.waiting.remove(consumer)
            queue.key_by_id.pop(ConsumerId(consumer.tag, consumer.connection), None)
        queue.last_active = ctx.now
        self.after_change(ctx, queue)
