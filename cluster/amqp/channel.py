"""One AMQP channel: publishing (with confirms), consumers, basic.get and acknowledgements,
each turned into the replicated command the native client would send."""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any

from pamqp import base, commands

from cluster.amqp import deaths, envelope, exchanges, frames, limits, node_link
from cluster.amqp.consumers import Batches, Consumer, UnackedMap, chunks
from cluster.amqp.errors import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_FOUND,
    PRECONDITION_FAILED,
    ChannelRefusal,
    not_implemented,
)
from cluster.amqp.queues import cluster_failure, not_found
from fifo.codec import constructor
from fifo.commands import (
    EXCHANGES_SINCE_VERSION,
    AnnotatedEnqueue,
    Cancel,
    Checkout,
    ConsumerId,
    Dequeue,
    Discard,
    Enqueue,
    HeaderPairs,
    Modify,
    PublishToExchange,
    QueueConfig,
    Remove,
    Return,
    SimplePrefetch,
)
from fifo.effects import Deliver, Delivery
from fifo.replies import CheckoutOk, DequeueOk, Error, Routed, Unroutable
from raft.replica import Reply

if TYPE_CHECKING:
    from cluster.amqp.connection import AmqpConnection

# the fifo tags of this listener's consumers: `amqp.c<channel>.<n>`, exclusive ones `amqp.x...`
# (seen from every node: a consumer on any node refuses to share the queue with one)
TAG_PREFIX = "amqp."
EXCLUSIVE_MARK = TAG_PREFIX + "x"
CONSUME_ARGUMENTS = ("x-priority",)
# the machine's refusals of a publish through an exchange that close the channel, as RabbitMQ's
CLOSING_CODES = {"unknown_exchange": NOT_FOUND, "access_refused": ACCESS_REFUSED}
HEADERS_FLAG_HIGH_BYTE = commands.Basic.Properties.flags["headers"] >> 8
# Enqueue without its frozen __init__'s setattrs (the publish path), while its fields are known
_ENQUEUE_FIELDS = ("queue", "body", "enqueuer", "seq", "connection", "ttl_ms")
_FIELDS_KNOWN = tuple(field.name for field in dataclasses.fields(Enqueue)) == _ENQUEUE_FIELDS
make_enqueue = constructor(Enqueue) if _FIELDS_KNOWN else Enqueue
# the properties of a message stored bare (see `envelope`)
PERSISTENT_PROPERTIES = envelope.properties_of(None).marshal()


class Channel:
    """State of one open channel; methods are called by the connection in frame order."""

    def __init__(self, connection: AmqpConnection, number: int) -> None:
        self.connection = connection
        self.server = connection.server
        self.number = number
        self.prefetch = 0
        self.global_prefetch = 0
        self.confirming = False
        self._publish_seq = 0
        self.consumers: dict[str, Consumer] = {}
        self.unacked = UnackedMap()
        self._serials = itertools.count(1)
        self.closing = False  # we sent channel.close: frames are dropped until close-ok

    def send(self, method: base.Frame) -> None:
        """Send a method on this channel."""
        self.connection.send_method(self.number, method)

    def _new_fifo_tag(self, kind: str) -> str:
        return f"{TAG_PREFIX}{kind}{self.number}.{next(self._serials)}"

    # --- publishing ---------------------------------------------------------------------------

    def confirm_select(self, method: commands.Confirm.Select) -> None:
        """confirm.select: every later publish is acked once the cluster committed it."""
        self.confirming = True
        if not method.nowait:
            self.send(commands.Confirm.SelectOk())

    def publish(self, method: commands.Basic.Publish, properties: bytes, body: bytes) -> None:
        """basic.publish: to the default exchange one Enqueue into the queue named by the key;
        to another exchange (v4) one PublishToExchange, routed by the machine."""
        if method.immediate:
            raise not_implemented("immediate=true")
        if len(body) > limits.body_bytes_max:
            raise message_too_large(len(body))
        ttl_ms = _ttl_ms(properties)
        if method.exchange:
            self._publish_to_exchange(method, properties, body, ttl_ms)
            return
        seq = self._next_publish_seq() if self.confirming else 0
        config, group_key = self.connection.cached_config(method.routing_key)
        stored = envelope.wrap(properties, body)
        group = _group_of(properties, group_key) if group_key else None
        if group is not None:  # a grouped queue (v3) reads the group from the annotation
            command: Enqueue = AnnotatedEnqueue(
                method.routing_key, stored, None, None, self.connection.connection_id, ttl_ms,
                ((group_key or "", group),),
            )  # fmt: skip
        else:
            command = make_enqueue(  # == Enqueue(queue, body, enqueuer, seq, connection, ttl_ms)
                method.routing_key, stored, None, None, self.connection.connection_id, ttl_ms
            )
        if config is not None and self._over_limit(method.routing_key, config):
            self._confirm(seq, ok=False)
            return
        self.connection.publish_started()
        self.connection.block_if_alarmed()
        returnable = body if method.mandatory else b""  # kept until the reply only if needed

        def sink(reply: Reply) -> None:
            self.connection.publish_done()
            self._published(method, properties, returnable, seq, reply)

        self.connection.propose(command, sink)

    def _publish_to_exchange(
        self, method: commands.Basic.Publish, properties: bytes, body: bytes, ttl_ms: int | None
    ) -> None:
        """One PublishToExchange: the machine stores it in every queue bound to match it."""
        what = f"publishing to exchange '{method.exchange}'"
        version, exchange_type, internal = exchanges.exchange_type_here(
            self.server, method.exchange
        )
        if version < EXCHANGES_SINCE_VERSION:
            raise exchanges.exchanges_need_v4(what)
        if exchange_type is None:
            raise ChannelRefusal(NOT_FOUND, f"no exchange '{method.exchange}' in vhost '/'")
        if internal:
            raise ChannelRefusal(ACCESS_REFUSED, f"cannot publish to internal exchange "
                                 f"'{method.exchange}' in vhost '/'")  # fmt: skip
        headers: HeaderPairs = ()
        if exchange_type == "headers":
            headers = exchanges.header_pairs(envelope.properties_of(properties).headers)
        command = PublishToExchange(
            method.exchange, method.routing_key,
            envelope.wrap(properties, body, (method.exchange, method.routing_key)), headers,
            method.mandatory, ttl_ms,
        )  # fmt: skip
        seq = self._next_publish_seq() if self.confirming else 0
        self.connection.publish_started()
        self.connection.block_if_alarmed()
        returnable = body if method.mandatory else b""

        def sink(reply: Reply) -> None:
            self.connection.publish_done()
            self._routed(method, properties, returnable, seq, reply)

        self.connection.propose(command, sink)

    def _routed(
        self, method: commands.Basic.Publish, properties: bytes, body: bytes, seq: int, reply: Reply
    ) -> None:
        """The machine's answer to a publish through an exchange: a mandatory one that reached
        no queue is returned (312 NO_ROUTE) before its ack, as RabbitMQ orders them; one a
        matching queue refused is nacked; an exchange deleted meanwhile closes the channel."""
        if isinstance(reply, Unroutable):
            returned = commands.Basic.Return(
                NO_ROUTE, "NO_ROUTE", method.exchange, method.routing_key
            )
            self.connection.send_content(self.number, returned, properties, body)
            self._confirm(seq, ok=True)
        elif isinstance(reply, Routed):
            self._confirm(seq, ok=not reply.refused)
        elif isinstance(reply, Error) and reply.code in CLOSING_CODES and not self.closing:
            self._confirm(seq, ok=False)  # the exchange was deleted, or made internal, meanwhile
            refusal = ChannelRefusal(CLOSING_CODES[reply.code], reply.message)
            self.connection.refuse_channel(self, refusal, method)
        else:
            self._confirm(seq, ok=False)

    def _next_publish_seq(self) -> int:
        self._publish_seq += 1
        return self._publish_seq

    def _over_limit(self, queue: str, config: QueueConfig) -> bool:
        """x-overflow reject-publish: refuse (nack) while the queue is at its limit here."""
        if config.overflow != "reject_publish":
            return False
        found = node_link.overview(self.server, queue)
        if found is None:
            return False
        waiting = found.ready + found.returned
        return (config.max_length is not None and waiting >= config.max_length) or (
            config.max_bytes is not None and found.bytes >= config.max_bytes
        )

    def _published(
        self, method: commands.Basic.Publish, properties: bytes, body: bytes, seq: int, reply: Reply
    ) -> None:
        if isinstance(reply, Error) and reply.code == "unknown_queue":
            if method.mandatory:  # RabbitMQ: unroutable + mandatory = basic.return, then ack
                returned = commands.Basic.Return(NO_ROUTE, "NO_ROUTE", "", method.routing_key)
                self.connection.send_content(self.number, returned, properties, body)
            self._confirm(seq, ok=True)
            return
        failed = isinstance(reply, Error) or node_link.failure_text(reply) is not None
        self._confirm(seq, ok=not failed)

    def _confirm(self, seq: int, ok: bool) -> None:
        if seq and not self.closing:
            self.connection.send_bytes(frames.encode_confirm(self.number, seq, ok))

    # --- consuming ----------------------------------------------------------------------------

    def qos(self, method: commands.Basic.Qos) -> None:
        """basic.qos: prefetch per consumer (global: per channel, which quorum queues refuse
        at basic.consume, as RabbitMQ's do)."""
        if method.prefetch_size:
            raise not_implemented(f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.global_prefetch = method.prefetch_count
        else:
            self.prefetch = method.prefetch_count
        self.send(commands.Basic.QosOk())

    async def consume(self, method: commands.Basic.Consume) -> None:
        """basic.consume: a Checkout with simple prefetch (consume-ok before any delivery)."""
        queue, tag = (
            method.queue,
            method.consumer_tag or f"amq.ctag-{self.number}.{next(self._serials)}",
        )
        if tag in self.consumers:
            raise ChannelRefusal(PRECONDITION_FAILED, f"consumer tag '{tag}' already in use")
        if len(self.consumers) >= limits.consumers_per_channel_max:
            raise ChannelRefusal(PRECONDITION_FAILED, "too many consumers on this channel")
        if self.global_prefetch:
            raise not_implemented(f"queue '{queue}' in vhost '/' does not support global qos")
        priority = _consume_priority(method.arguments)
        self._check_exclusive(queue, method.exclusive)
        kind = "x" if method.exclusive else "c"
        consumer = Consumer(tag, self._new_fifo_tag(kind), queue, method.no_ack)
        self.consumers[tag] = consumer
        self.connection.consumers[consumer.fifo_tag] = (self, consumer)
        prefetch = self.prefetch or limits.prefetch_unlimited
        reply = await self.connection.submit(Checkout(
            queue, self._consumer_id(consumer.fifo_tag), SimplePrefetch(prefetch), priority
        ))  # fmt: skip
        if not isinstance(reply, CheckoutOk):
            self._forget(consumer)
            cluster_failure(reply)
            raise not_found(queue) if _unknown_queue(reply) else _refused(reply)
        consumer.key = reply.consumer_key
        if not method.nowait:
            self.send(commands.Basic.ConsumeOk(consumer_tag=tag))
        consumer.announced = True
        for held in consumer.held:
            self.deliver(consumer, held)
        consumer.held.clear()

    def _check_exclusive(self, queue: str, exclusive: bool) -> None:
        tags = node_link.consumer_tags(self.server, queue)
        if any(tag.startswith(EXCLUSIVE_MARK) for tag in tags) or (exclusive and tags):
            raise ChannelRefusal(ACCESS_REFUSED, f"queue '{queue}' in vhost '/' in exclusive use")

    def _consumer_id(self, fifo_tag: str) -> ConsumerId:
        return ConsumerId(fifo_tag, self.connection.connection_id)

    def _forget(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.tag, None)
        self.connection.consumers.pop(consumer.fifo_tag, None)

    def deliver(self, consumer: Consumer, effect: Deliver) -> None:
        """Send a Deliver effect's messages as basic.deliver (held until consume-ok is out)."""
        if not consumer.announced:
            consumer.held.append(effect)
            return
        if consumer.no_ack:
            self.connection.settle_later(
                effect.queue, effect.consumer_key, [message.msg_id for message in effect.messages]
            )
        for message in effect.messages:
            if consumer.no_ack:
                tag = self.unacked.skip_tag()
            else:
                tag = self.unacked.add(effect.queue, effect.consumer_key, message.msg_id)
            properties, body, route = envelope.unwrap(message.body)
            exchange, key = route or ("", effect.queue)
            method = frames.encode_deliver(
                self.number, consumer.tag, tag, message.redelivered, key, exchange
            )
            self._send_message(method, message, properties, body, route)

    def _send_message(
        self, method: base.Frame | bytes, message: Delivery | Any, properties: bytes | None,
        body: bytes, route: tuple[str, str] | None,
    ) -> None:  # fmt: skip
        death = deaths.death_of(getattr(message, "annotations", ()))
        if message.delivery_count > 0 or death is not None:
            properties = _with_headers(properties, message.delivery_count, death, route)
        elif properties is None:
            properties = PERSISTENT_PROPERTIES
        self.connection.send_content(self.number, method, properties, body)

    async def cancel(self, method: commands.Basic.Cancel) -> None:
        """basic.cancel: the consumer gets nothing new; what it holds may still be acked."""
        consumer = self.consumers.get(method.consumer_tag or "")
        if consumer is not None:
            self._forget(consumer)
            await self.connection.submit(Checkout(
                consumer.queue, self._consumer_id(consumer.fifo_tag), Cancel()
            ))  # fmt: skip
        if not method.nowait:
            self.send(commands.Basic.CancelOk(consumer_tag=method.consumer_tag))

    def cancelled_by_server(self, consumer: Consumer) -> None:
        """The queue went away: tell a client that asked for it (consumer_cancel_notify)."""
        self._forget(consumer)
        if self.connection.cancel_notify:
            self.send(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    async def get(self, method: commands.Basic.Get) -> None:
        """basic.get: a Dequeue (settled when no-ack) under a fresh consumer id."""
        fifo_tag = self._new_fifo_tag("g")
        reply = await self.connection.submit(Checkout(
            method.queue, self._consumer_id(fifo_tag), Dequeue(settled=method.no_ack)
        ))  # fmt: skip
        cluster_failure(reply)
        if not isinstance(reply, DequeueOk):
            raise not_found(method.queue) if _unknown_queue(reply) else _refused(reply)
        message = reply.message
        if message is None:
            self.send(commands.Basic.GetEmpty())
            return
        if method.no_ack or reply.consumer_key is None:
            tag = self.unacked.skip_tag()
        else:
            tag = self.unacked.add(method.queue, reply.consumer_key, message.msg_id)
        properties, body, route = envelope.unwrap(message.body)
        exchange, key = route or ("", method.queue)
        get_ok = commands.Basic.GetOk(tag, message.redelivered, exchange, key, reply.ready)
        self._send_message(get_ok, message, properties, body, route)

    # --- acknowledgements ---------------------------------------------------------------------

    def ack(self, method: commands.Basic.Ack) -> None:
        """basic.ack (multiple): Settle, gathered with the connection's other acks."""
        batches = self.unacked.take(method.delivery_tag or 0, method.multiple)
        for (queue, key), msg_ids in batches.items():
            self.connection.settle_later(queue, key, msg_ids)

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        """basic.nack / reject: requeue as a failed delivery (counted against x-delivery-limit),
        or dead-letter (Discard)."""
        batches = self.unacked.take(delivery_tag, multiple)
        if not requeue:
            self._settle(batches, Discard)
        elif node_link.effective_version(self.server) >= 2:
            for (queue, key), ids in batches.items():
                for part in chunks(ids):
                    self.connection.propose(Modify(queue, key, part, True, False), _ignore)
        else:  # v1 counts every return as a failed delivery
            self._settle(batches, Return)

    def recover(self, requeue: bool) -> None:
        """basic.recover: every unacked message goes back to its queue."""
        if not requeue:
            raise not_implemented("basic.recover with requeue=false")
        self._settle(self.unacked.take_all(), Return)

    def _settle(self, batches: Batches, command: type[Return | Discard]) -> None:
        for (queue, key), ids in batches.items():
            for part in chunks(ids):
                self.connection.propose(command(queue, key, part), _ignore)

    def release(self) -> None:
        """The channel is closing: its consumers leave and what they hold goes back to their
        queues, ahead of the ready messages (v2+: Remove returns a consumer's messages at once,
        before the next single active consumer starts; v1 has no Remove: cancel, then return)."""
        removing = node_link.effective_version(self.server) >= 2
        spec = Remove() if removing else Cancel()
        removed = set()
        for consumer in list(self.consumers.values()):
            self._forget(consumer)
            removed.add((consumer.queue, consumer.key))
            self.connection.propose(Checkout(
                consumer.queue, self._consumer_id(consumer.fifo_tag), spec
            ), _ignore)  # fmt: skip
        batches = self.unacked.take_all()
        if removing:
            batches = {where: ids for where, ids in batches.items() if where not in removed}
        self._settle(batches, Return)


def message_too_large(size: int) -> ChannelRefusal:
    """RabbitMQ's 406 for a message over the size limit."""
    return ChannelRefusal(
        PRECONDITION_FAILED,
        f"message size {size} is larger than configured max size {limits.body_bytes_max}",
    )


def _group_of(properties: bytes, group_key: str | None) -> str | int | None:
    """The message's group: its header named by the queue's group key, when a str or int."""
    if len(properties) < 2 or not properties[0] & HEADERS_FLAG_HIGH_BYTE:
        return None
    headers = envelope.properties_of(properties).headers or {}
    value = headers.get(group_key or "")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return value


def _ttl_ms(properties: bytes) -> int | None:
    """The per-message TTL of the `expiration` property (406 when it is not an integer)."""
    if len(properties) < 2 or not properties[0] & 0x01:  # expiration's flag bit is 0x0100
        return None
    expiration = envelope.properties_of(properties).expiration
    if expiration is None:
        return None
    if not expiration.isdigit():
        raise ChannelRefusal(PRECONDITION_FAILED, f"invalid expiration '{expiration}': no_integer")
    return int(expiration)


def _with_headers(
    properties: bytes | None, count: int, death: tuple[str, str] | None,
    route: tuple[str, str] | None,
) -> bytes:  # fmt: skip
    """The properties with RabbitMQ's `x-delivery-count` header (quorum queues add it) and, for
    a dead letter, its x-death headers (`cluster.amqp.deaths`)."""
    decoded = envelope.properties_of(properties)
    if count > 0:
        decoded.headers = {**(decoded.headers or {}), "x-delivery-count": count}
    if death is not None:
        deaths.add_death(decoded, death, route)
    return decoded.marshal()


def _consume_priority(arguments: dict[str, Any] | None) -> int:
    for name in arguments or {}:
        if name not in CONSUME_ARGUMENTS:
            raise not_implemented(f"consumer argument '{name}'")
    priority = (arguments or {}).get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 255:
        raise ChannelRefusal(PRECONDITION_FAILED, f"invalid x-priority {priority!r}")
    return priority


def _unknown_queue(reply: Reply) -> bool:
    return isinstance(reply, Error) and reply.code == "unknown_queue"


def _refused(reply: Reply) -> ChannelRefusal:
    message = reply.message if isinstance(reply, Error) else repr(reply)
    code = NOT_FOUND if _unknown_queue(reply) else PRECONDITION_FAILED
    return ChannelRefusal(code, message)


def _ignore(_reply: Reply) -> None:
    """Settles and returns need no answer: a failed one leaves the message checked out, and
    the connection's close returns it."""
