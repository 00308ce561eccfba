"""Machine v3: the per-queue handlers of message groups, on top of v2's.

Every override leaves an ungrouped queue (`q.grouping is None`) to v2's code unchanged; a grouped
queue keeps its waiting messages in its groups (`fifo.v3.groups`), its `ready` and `returns`
stay empty.

Rules (issue 9):
- `sequenced`: a group's owner is the consumer holding checked-out messages of it; nobody else
  gets messages of the group meanwhile; when it holds none, the group is free again.
- `exclusive`: the first consumer to get a message of a group owns it for as long as it lives
  (up, not cancelled, not timed out, not past its disconnected timeout); when it stops being so,
  its groups with nothing checked out are freed at once, the others as their messages come back.
  With `rebalance_groups_on_join`, a joining consumer gets idle groups until owners differ by at
  most one group (fewest moves: always from the fullest owner to the emptiest).
- With single_active_consumer the policy does not matter (one consumer gets everything): groups
  are then owned only while held, as in `sequenced`.
- Dispatch: among groups free or owned by the consumer, the oldest head; consumers are served by
  priority then round robin, as in v2, skipping a consumer nothing is available for.
- Returned messages go back to the front of their group in position order; expiry, drop-head
  and purge work on the oldest waiting messages; dead-lettered copies join the target's groups.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    AnnotatedEnqueue,
    Checkout,
    ConsumerDisconnectedTimeout,
    Credit,
    Dequeue,
    Enqueue,
    Purge,
    PurgeGroup,
)
from fifo.effects import CreditReply, Delivery
from fifo.fastbuild import deliver as fast_deliver
from fifo.fastbuild import delivery as fast_delivery
from fifo.replies import (
    CheckoutOk,
    DequeuedMessage,
    DequeueOk,
    Error,
    PurgeOk,
    Reply,
)
from fifo.shared import OK, SERIAL, Ctx, invalid, merge_annotations, unknown_consumer
from fifo.state import Annotations, Consumer, Group, GroupId, Grouping, Message, Queue
from fifo.v2.machine import QueueMachineV2
from fifo.v3 import groups as G


def group_limit_error(q: Queue) -> Error:
    """The reply to a publish that would make the queue track too many groups."""
    return Error("unsupported", f"queue {q.name!r} already tracks groups_per_queue_max = "
                 f"{limits.groups_per_queue_max} message groups: a new group is refused until "
                 "some groups are settled or purged")  # fmt: skip


def _one_short_pair(anns: object) -> bool:
    """The common annotations of a grouped publish, valid for sure: one (key, short text) pair
    (63 characters are at most 252 UTF-8 bytes, below annotation_bytes_max)."""
    if type(anns) is not tuple or len(anns) != 1:
        return False
    pair = anns[0]
    if type(pair) is not tuple or len(pair) != 2:
        return False
    k, value = pair
    return (type(k) is str and 0 < len(k) <= 63 and type(value) is str
            and len(value) <= 63)  # fmt: skip


class GroupedQueue(QueueMachineV2):
    """v2's per-queue handlers, with message groups for queues declared grouped."""

    # --- ownership ---------------------------------------------------------------------------

    def sticky(self, q: Queue, c: Consumer) -> bool:
        """Whether `c` keeps its groups while it holds nothing of them (exclusive, alive)."""
        gr = q.grouping
        return (
            gr is not None
            and gr.config.policy == "exclusive"
            and not q.config.single_active_consumer
            and q.consumers.get(c.key) is c
            and c.status == "up"
            and not c.once
            and not c.timed_out
            and not c.disconnected_fired
        )

    def left(self, q: Queue, gr: Grouping, c: Consumer, m: Message) -> None:
        """A message of `c` was settled, returned or dead-lettered: the group may be freed."""
        g = gr.groups[m.group]
        n = g.checked_out - 1
        g.checked_out = n
        if n == 0 and (gr.config.policy == "sequenced" or not self.sticky(q, c)):
            G.release(gr, g)
        else:
            G.tidy(gr, g)

    def release_consumer(self, q: Queue, c: Consumer) -> None:
        """`c` may have stopped being a sticky owner: free its idle groups if so."""
        gr = q.grouping
        if gr is not None and c.key in gr.by_owner and not self.sticky(q, c):
            G.release_idle(gr, c.key)

    # --- storing and taking --------------------------------------------------------------------

    def store_grouped(self, ctx: Ctx, q: Queue, gr: Grouping, m: Message, gid: GroupId) -> None:
        """Add a new message to its group (room was made by the caller)."""
        G.make_room(gr, gid, limits.groups_per_queue_max)
        m.pos = gr.next_pos
        gr.next_pos += 1
        m.group = gid
        m.enqueued_at = ctx.now
        G.add_ready(gr, G.group_for(gr, gid), m)
        q.messages_total += 1
        q.bytes_ready += len(m.body)

    def store(self, ctx: Ctx, q: Queue, m: Message) -> None:
        """A dead-lettered copy: into its group (the default group if no room is left)."""
        gr = q.grouping
        if gr is None:
            super().store(ctx, q, m)
            return
        gid = G.group_of(gr.config, m.annotations)
        if not G.has_room(gr, gid, limits.groups_per_queue_max):
            gid = None
        self.store_grouped(ctx, q, gr, m, gid)

    def waiting_count(self, q: Queue) -> int:
        """Ready plus returned messages."""
        gr = q.grouping
        return len(q.ready) + len(q.returns) if gr is None else gr.waiting

    def over_limit(self, q: Queue) -> bool:
        """As v2, counting the messages waiting in groups."""
        gr = q.grouping
        if gr is None:
            return super().over_limit(q)
        ml, mb = q.config.max_length, q.config.max_bytes
        return (ml is not None and gr.waiting > ml) or (mb is not None and q.bytes_ready > mb)

    def below_soft_limit(self, q: Queue) -> bool:
        """As v2, counting the messages waiting in groups."""
        gr = q.grouping
        if gr is None:
            return super().below_soft_limit(q)
        ml, mb = q.config.max_length, q.config.max_bytes
        return (ml is None or gr.waiting <= ml * 8 // 10) and (
            mb is None or q.bytes_ready <= mb * 8 // 10
        )

    def take_from(self, q: Queue, gr: Grouping, g: Group) -> Message:
        """Remove the head of a group from the waiting messages."""
        m = G.take_head(gr, g)
        q.bytes_ready -= len(m.body)
        return m

    def pop_head(self, q: Queue) -> Message | None:
        """drop-head: the oldest waiting message of any group (which may free its group)."""
        gr = q.grouping
        if gr is None:
            return super().pop_head(q)
        g = G.oldest(gr)
        return None if g is None else self.take_from(q, gr, g)

    def expire_head(self, ctx: Ctx, q: Queue) -> None:
        """Shallow expiry: drop the expired oldest waiting messages."""
        gr = q.grouping
        if gr is None:
            super().expire_head(ctx, q)
            return
        expired: list[Message] = []
        while True:
            g = G.oldest(gr)
            if g is None:
                break
            m = G.head(g)
            if m is None or m.expiry is None or m.expiry > ctx.now:
                break
            expired.append(self.take_from(q, gr, g))
        self.dead_letter(ctx, q, expired, "expired")

    def grouped_take(self, ctx: Ctx, q: Queue, gr: Grouping, c: Consumer | None) -> (
            tuple[Group, Message] | None):  # fmt: skip
        """The next message for `c` (None: a dequeue, free groups only); an expired head met on
        the way is dead-lettered. Ownership is the caller's (`G.assign`, before taking)."""
        key = None if c is None else c.key
        while True:
            g = G.pick(gr, key)
            if g is None:
                return None
            m = G.head(g)
            assert m is not None
            if m.expiry is not None and m.expiry <= ctx.now:
                self.dead_letter(ctx, q, [self.take_from(q, gr, g)], "expired")
                continue
            return g, m

    def deliver(self, ctx: Ctx, q: Queue) -> None:
        """Hand out waiting messages: by priority, round robin, oldest available head each."""
        gr = q.grouping
        if gr is None:
            super().deliver(ctx, q)
            return
        batches: dict[Any, list[Delivery]] = {}
        owners: list[Consumer] = []
        locks = self.uses_locks
        service = q.service
        for prio in sorted(service, reverse=True):
            ring = service[prio]
            skipped = 0
            while ring and skipped < len(ring) and gr.waiting:
                c = q.consumers.get(ring[0])
                if not (c is not None and c.credit > 0 and c.status == "up"
                        and c.suspected_since is None and not c.timed_out):  # fmt: skip
                    ring.popleft()
                    if c is not None:
                        c.in_service = False
                    continue
                found = self.grouped_take(ctx, q, gr, c)
                if found is None:
                    ring.rotate(-1)
                    skipped += 1
                    continue
                skipped = 0
                g, m = found
                G.assign(gr, g, c.key)
                self.take_from(q, gr, g)
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
                ring.popleft()
                if c.credit > 0:
                    ring.append(c.key)
                else:
                    c.in_service = False
            if not ring:
                del service[prio]
        for c in owners:
            ctx.effects.append(
                fast_deliver(c.connection, q.name, c.tag, c.key, tuple(batches[c.key]))
            )

    def after_change(self, ctx: Ctx, q: Queue) -> None:
        """As v2: activate (SAC), deliver, apply limits (waiting messages live in groups)."""
        gr = q.grouping
        if gr is None:
            super().after_change(ctx, q)
            return
        cfg = q.config
        if cfg.single_active_consumer:
            self.activate_next(ctx, q)
        if q.service and gr.waiting:
            self.deliver(ctx, q)
        if cfg.max_length is not None or cfg.max_bytes is not None or q.blocked_count:
            self.evaluate_limit(ctx, q)

    # --- messages leaving consumers --------------------------------------------------------------

    def return_msgs(
        self,
        ctx: Ctx,
        q: Queue,
        c: Consumer,
        ids: Iterable[int],
        delivery_failed: bool,
        annotations: tuple[tuple[str, str | int], ...] = (),
    ) -> int:
        """As v2; a returned message goes back to the front of its group, in position order."""
        gr = q.grouping
        if gr is None:
            return super().return_msgs(ctx, q, c, ids, delivery_failed, annotations)
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
            if annotations:  # the group stays the one it was enqueued with
                m.annotations = merge_annotations(m.annotations, annotations)
            if self.over_delivery_limit(q, m):
                over.append(m)
            else:
                G.add_returned(gr, gr.groups[m.group], m)
                q.bytes_ready += size
            self.left(q, gr, c, m)
        self.dead_letter(ctx, q, over, "delivery_limit")
        return n

    def discard_msgs(
        self,
        ctx: Ctx,
        q: Queue,
        c: Consumer,
        ids: tuple[int, ...],
        delivery_failed: bool,
        annotations: tuple[tuple[str, str | int], ...],
    ) -> int:
        """As v2; the messages' groups may be freed."""
        gr = q.grouping
        if gr is None:
            return super().discard_msgs(ctx, q, c, ids, delivery_failed, annotations)
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
            self.left(q, gr, c, m)
        self.dead_letter(ctx, q, gone, "rejected")
        return len(gone)

    def settle(self, ctx: Ctx, q: Queue, cmd: Any) -> Reply:
        """As v2; settled messages free their groups."""
        gr = q.grouping
        if gr is None:
            return super().settle(ctx, q, cmd)
        key = cmd.consumer_key
        c = q.consumers.get(key) if type(key) is int else None
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
        n = 0
        checked_out, groups, owner = c.checked_out, gr.groups, c.key
        plain = gr.config.policy == "sequenced"
        for i in ids:
            m = checked_out.pop(i, None)
            if m is None:
                continue
            n += 1
            q.bytes_checkout -= len(m.body)
            g = groups[m.group]
            if (plain and g.checked_out == 1 and g.owner == owner and not g.returns
                    and not g.ready):  # fmt: skip
                # the common case of `left`, inlined: the last held message of a group with
                # nothing waiting: the group is free and empty, so it is no longer tracked
                g.checked_out = 0
                owned = gr.by_owner[owner]
                del owned[g.gid]
                if not owned:
                    del gr.by_owner[owner]
                del groups[g.gid]
                if gr.idle:
                    gr.idle.pop(g.gid, None)
            else:
                self.left(q, gr, c, m)
        q.messages_total -= n
        if c.status == "up" and not c.once and not c.credited and q.consumers.get(c.key) is c:
            if n:  # a plain consumer acked (as v2's fast path): refill credit, hand out more
                c.credit = min(c.prefetch, c.credit + n)
            if not c.in_service:
                self.service_add(q, c)
            cfg = q.config
            if (gr.waiting or cfg.single_active_consumer or q.blocked_count
                    or cfg.max_length is not None or cfg.max_bytes is not None):  # fmt: skip
                self.after_change(ctx, q)  # (else it would do nothing)
        else:
            self.consumer_done(ctx, q, c, n)
        return OK

    # --- consumers leaving ---------------------------------------------------------------------

    def drop_consumer(self, q: Queue, c: Consumer) -> None:
        """As v2; an exclusive owner's idle groups are freed."""
        super().drop_consumer(q, c)
        self.release_consumer(q, c)

    def cancel(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """As v2; a cancelled consumer keeps only the groups it still holds messages of."""
        c = self.resolve(q, cmd.consumer) if q.grouping is not None else None
        if c is not None:
            self.release_later(ctx, q, c)
        return super().cancel(ctx, q, cmd)

    def release_later(self, ctx: Ctx, q: Queue, c: Consumer) -> None:
        """Mark `c` as leaving before v2's handler delivers (status is set by the handler):
        its idle groups are freed first so the delivery at the end of the command sees them."""
        gr = q.grouping
        if gr is not None and c.key in gr.by_owner:
            G.release_idle(gr, c.key)

    def time_out(self, ctx: Ctx, q: Queue, c: Consumer) -> None:
        """As v2; a timed-out owner's groups are freed as its messages come back."""
        super().time_out(ctx, q, c)
        self.release_consumer(q, c)

    def consumer_disconnected_timeout(
        self, ctx: Ctx, q: Queue, cmd: ConsumerDisconnectedTimeout
    ) -> Reply:
        """As v2; the consumer's groups are freed (its messages come back)."""
        gr = q.grouping
        c = self.resolve(q, cmd.consumer_key) if gr is not None else None
        if c is not None and c.suspected_since is not None and not c.disconnected_fired:
            # v2 sets disconnected_fired before returning the messages: free idle groups first
            G.release_idle(gr, c.key)  # type: ignore[arg-type]
        return super().consumer_disconnected_timeout(ctx, q, cmd)

    # --- consumers joining ---------------------------------------------------------------------

    def consume(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """As v2; with rebalance_groups_on_join a new consumer takes over idle groups."""
        gr = q.grouping
        fresh = gr is not None and self.resolve(q, cmd.consumer) is None
        reply = super().consume(ctx, q, cmd)
        if (fresh and gr is not None and type(reply) is CheckoutOk
                and gr.config.rebalance_groups_on_join and gr.config.policy == "exclusive"
                and not q.config.single_active_consumer and self.rebalance(q, gr)):  # fmt: skip
            self.after_change(ctx, q)
        return reply

    def rebalance(self, q: Queue, gr: Grouping) -> int:
        """Move groups with nothing checked out from the fullest owner to the emptiest, until
        owners differ by at most one group; returns the number of moves."""
        live = [c for c in q.consumers.values() if self.sticky(q, c)]
        if len(live) < 2:
            return 0
        count = {c.key: len(gr.by_owner.get(c.key, ())) for c in live}
        order = {c.key: c.attach_index for c in live}
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
            movable = [gid for gid in gr.by_owner.get(high, ())
                       if gr.groups[gid].checked_out == 0]  # fmt: skip
            if not movable:
                stuck.add(high)
                continue
            gid = max(movable, key=G.sort_key)
            G.move(gr, gr.groups[gid], low)
            count[high] -= 1
            count[low] += 1
            moves += 1

    # --- commands with grouped variants ----------------------------------------------------------

    def enqueue(self, ctx: Ctx, q: Queue, cmd: Enqueue) -> Reply:
        """As v2 for an ungrouped queue; grouped: the message joins the default group."""
        if q.grouping is None:
            return super().enqueue(ctx, q, cmd)
        return self.enqueue_with(ctx, q, cmd, ())

    def enqueue_annotated(self, ctx: Ctx, q: Queue, cmd: AnnotatedEnqueue) -> Reply:
        """A publish with annotations; a grouped queue reads the message's group from them."""
        anns = cmd.annotations
        if not _one_short_pair(anns) and (msg := v.annotations_error(anns)):
            return invalid(msg)
        if q.grouping is None and not anns:
            return super().enqueue(ctx, q, cmd)
        return self.enqueue_with(ctx, q, cmd, anns)

    @staticmethod
    def resent(q: Queue, cmd: Enqueue) -> bool:
        """A publish the enqueuer's dedup will answer as already stored (seq below next_seq)."""
        en = q.enqueuers.get(cmd.enqueuer) if type(cmd.enqueuer) is str else None
        seq = cmd.seq
        return en is not None and type(seq) is int and 1 <= seq < en.next_seq

    def enqueue_with(self, ctx: Ctx, q: Queue, cmd: Enqueue, anns: Annotations) -> Reply:
        """Store a message with annotations (into its group), deliver, then apply the limits."""
        body = cmd.body
        if type(body) is not bytes or len(body) > limits.body_bytes_max:
            return invalid(f"body must be bytes of at most {limits.body_bytes_max}")
        ttl = cmd.ttl_ms
        if ttl is not None and not v.int_in(ttl, 0, limits.ttl_ms_max):
            return invalid("ttl_ms out of range")
        gr = q.grouping
        gid: GroupId = None
        if gr is not None:
            if len(anns) == 1 and anns[0][0] == gr.config.group_key and type(anns[0][1]) is str:
                gid = anns[0][1]  # the common case of `G.group_of`
            else:
                gid = G.group_of(gr.config, anns)
        if (gr is not None and gid not in gr.groups and not self.resent(q, cmd)
                and not G.has_room(gr, gid, limits.groups_per_queue_max)):  # fmt: skip
            return group_limit_error(q)  # (a resend is answered by the dedup below, as stored)
        if cmd.enqueuer is not None or cmd.seq is not None:
            reply = self.track_enqueue(ctx, q, cmd)
            if reply is not None:
                return reply
        cfg = q.config
        m = Message(body, None)
        m.annotations = anns
        if ttl is not None or cfg.message_ttl_ms is not None:
            m.expiry = self.expiry(ctx, q, ttl)
        if gr is None:
            q.ready.append(m)
            q.messages_total += 1
            q.bytes_ready += len(body)
        elif q.service and self.hand_over(ctx, q, gr, m, gid):
            if q.blocked_count or cfg.max_length is not None or cfg.max_bytes is not None:
                self.evaluate_limit(ctx, q)
            return OK
        else:
            self.store_grouped(ctx, q, gr, m, gid)
        if q.service:
            self.deliver(ctx, q)
        if cfg.max_length is not None or cfg.max_bytes is not None or q.blocked_count:
            self.evaluate_limit(ctx, q)
        return OK

    def hand_over(self, ctx: Ctx, q: Queue, gr: Grouping, m: Message, gid: GroupId) -> bool:
        """Fast path of a grouped publish: when its group has nothing waiting, the message is the
        only new thing any consumer can take (after every command no consumer with credit has
        anything available), so it goes straight to the consumer `deliver` would pick: the
        group's owner if it can take it, else (free group) the first eligible consumer of the
        highest priority. False: store it and let `deliver` run."""
        g = gr.groups.get(gid)
        if g is not None and (g.returns or g.ready):
            return False
        if g is not None and g.owner is not None:
            c = q.consumers.get(g.owner)
            if c is None or not c.in_service or not self.eligible(c):
                return False
        else:
            c = self.next_consumer(q)
            if c is None:
                return False
        key = c.key
        if g is None:
            if len(gr.groups) >= limits.groups_per_queue_max:
                G.make_room(gr, gid, limits.groups_per_queue_max)
            g = gr.groups[gid] = Group(gid)
        m.pos = gr.next_pos
        gr.next_pos += 1
        m.group = gid
        m.enqueued_at = ctx.now
        g.checked_out += 1
        if g.owner is None:  # G.assign, inlined on the hot path
            g.owner = key
            owned = gr.by_owner.get(key)
            if owned is None:
                gr.by_owner[key] = {gid: None}
            else:
                owned[gid] = None
        if gr.idle:
            gr.idle.pop(gid, None)
        q.messages_total += 1
        mid = c.next_msg_id
        c.next_msg_id = mid + 1
        c.checked_out[mid] = m
        m.lock = ctx.now + c.timeout_ms
        c.credit -= 1
        c.delivery_count = (c.delivery_count + 1) % SERIAL
        q.bytes_checkout += len(m.body)
        ring = q.service[c.priority]
        if ring[0] == key:  # rotate as `deliver` does: served, to the back (or out)
            ring.popleft()
        else:
            ring.remove(key)
        if c.credit > 0:
            ring.append(key)
        else:
            c.in_service = False
            if not ring:
                del q.service[c.priority]
        d = fast_delivery(mid, m.body, False, 0, m.annotations)
        ctx.effects.append(fast_deliver(c.connection, q.name, c.tag, key, (d,)))
        return True

    def credit(self, ctx: Ctx, q: Queue, cmd: Credit) -> Reply:
        """As v2; `available` counts the messages waiting in groups."""
        if q.grouping is None:
            return super().credit(ctx, q, cmd)
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
            diff -= SERIAL
        c.credit = 0 if c.once else max(0, diff)
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
        available = self.waiting_count(q) if active else 0
        ctx.effects.append(
            CreditReply(c.connection, q.name, c.tag, c.key, c.delivery_count, c.credit,
                        available, cmd.drain, active and self.is_active(q, c))
        )  # fmt: skip
        self.after_change(ctx, q)
        return OK

    def clear_group(self, q: Queue, gr: Grouping, g: Group) -> int:
        """Drop a group's waiting messages (counters fixed); returns how many."""
        n = len(g.returns) + len(g.ready)
        size = sum(len(m.body) for m in g.returns) + sum(len(m.body) for m in g.ready)
        g.returns.clear()
        g.ready.clear()
        gr.waiting -= n
        q.bytes_ready -= size
        q.messages_total -= n
        G.tidy(gr, g)
        return n

    def purge(self, ctx: Ctx, q: Queue, cmd: Purge) -> Reply:
        """As v2; a grouped queue drops the waiting messages of every group."""
        gr = q.grouping
        if gr is None:
            return super().purge(ctx, q, cmd)
        count = 0
        for g in list(gr.groups.values()):
            count += self.clear_group(q, gr, g)
        gr.rebuild()  # every head changed: drop the stale entries at once
        self.after_change(ctx, q)
        return PurgeOk(count)

    def purge_group(self, ctx: Ctx, q: Queue, cmd: PurgeGroup) -> Reply:
        """Drop the waiting messages of one group; checked-out ones stay."""
        gid = cmd.group
        if gid is not None and (err := v.name_error(gid, "group", limits.annotation_bytes_max)):
            return invalid(err)
        gr = q.grouping
        if gr is None:
            return Error("unsupported", f"queue {q.name!r} has no message groups")
        g = gr.groups.get(gid)
        count = 0 if g is None else self.clear_group(q, gr, g)
        self.after_change(ctx, q)
        return PurgeOk(count)

    def dequeue(self, ctx: Ctx, q: Queue, cmd: Checkout) -> Reply:
        """As v2; a grouped queue hands out the oldest head of a free group, and an unsettled
        dequeue owns that group until it settles."""
        gr = q.grouping
        if gr is None:
            return super().dequeue(ctx, q, cmd)
        assert isinstance(cmd.spec, Dequeue)
        if not v.is_bool(cmd.spec.settled):
            return invalid("settled must be a bool")
        if q.config.single_active_consumer:
            return Error(
                "unsupported", "dequeue is not supported on a single active consumer queue"
            )
        if self.resolve(q, cmd.consumer) is not None:
            return DequeueOk(None, gr.waiting)
        if not cmd.spec.settled:
            if len(q.consumers) + len(q.waiting) >= limits.consumers_per_queue_max:
                return Error("unsupported", "consumers_per_queue_max reached")
            key = self.new_key(ctx, cmd.consumer)
            if key in q.consumers:
                return invalid("consumer key already in use")
        q.last_active = ctx.now
        found = self.grouped_take(ctx, q, gr, None)
        if found is None:
            self.after_change(ctx, q)  # expired heads may have been dead-lettered on the way
            return DequeueOk(None, 0)
        g, m = found
        msg = DequeuedMessage(0, m.body, m.delivery_count,
                              m.acquired_count > 0 or m.delivery_count > 0)  # fmt: skip
        if cmd.spec.settled:
            self.take_from(q, gr, g)
            q.messages_total -= 1
            self.after_change(ctx, q)
            return DequeueOk(msg, gr.waiting)
        c = Consumer(key, cmd.consumer.tag, cmd.consumer.connection, ctx.index)
        c.once, c.prefetch, c.next_msg_id = True, 1, 1
        c.timeout_ms = cmd.timeout_ms or q.config.consumer_timeout_ms
        G.assign(gr, g, key)
        self.take_from(q, gr, g)
        c.checked_out[0] = m
        m.lock = ctx.now + c.timeout_ms
        c.delivery_count = 1
        q.bytes_checkout += len(m.body)
        q.consumers[key] = c
        q.key_by_id[cmd.consumer] = key
        self.after_change(ctx, q)
        return DequeueOk(msg, gr.waiting, key)
