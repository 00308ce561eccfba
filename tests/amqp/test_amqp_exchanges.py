"""Exchanges over AMQP (machine v4, issue 27): pika, aio-pika and kombu, unchanged, against a
real 3-node cluster: fanout, direct, topic and headers routing, bind / unbind, mandatory
publishes returned with NO_ROUTE before their confirm, exchange declare / delete refusals, and
the 540 naming v4 while the cluster is still before it."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import body, commands, header

from cluster.launcher import start_cluster, wait_until
from tests.amqp.conftest import AmqpCluster, restart_at_v4
from tests.amqp.pika_select import Delivery, SelectSession
from tests.amqp.test_protocol import RawAmqp

pika = pytest.importorskip("pika")
aio_pika = pytest.importorskip("aio_pika")
kombu = pytest.importorskip("kombu")
from pika.adapters.blocking_connection import BlockingChannel  # noqa: E402
from pika.exceptions import (  # noqa: E402
    ChannelClosedByBroker,
    ConnectionClosedByBroker,
    NackError,
    UnroutableError,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def before_v4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpCluster]:
    """3 nodes capped at machine v3 (code from before v4): the cluster runs v3 (until `v4`
    restarts them)."""
    cluster = start_cluster(
        Path(tmp_path_factory.mktemp("amqp-x")) / "D", nodes=3, max_machine_version=3
    )
    try:
        yield AmqpCluster(cluster, cluster.key.decode("ascii"))
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def v4(before_v4: AmqpCluster) -> AmqpCluster:
    """The same cluster after a rolling restart onto code that runs v4 (the cap lifted)."""
    restart_at_v4(before_v4.cluster)
    return before_v4


@pytest.fixture
def channel(v4: AmqpCluster) -> Iterator[BlockingChannel]:
    """A channel with confirms on node n2, closed after the test."""
    connection = pika.BlockingConnection(v4.params(1))
    opened = connection.channel()
    opened.confirm_delivery()
    try:
        yield opened
    finally:
        if connection.is_open:
            connection.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _queues(channel: BlockingChannel, count: int) -> list[str]:
    names = [_name("q") for _ in range(count)]
    for name in names:
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    return names


def _drain(channel: BlockingChannel, queue: str) -> list[bytes]:
    """Every message waiting in `queue` (acked), in order."""
    bodies: list[bytes] = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def _got(got: tuple[Any, Any, Any]) -> tuple[Any, Any, Any] | None:
    """basic_get's answer when it got a message, else None (for wait_until)."""
    return got if got[0] is not None else None


def _got_from(channel: BlockingChannel, queue: str) -> tuple[Any, Any, Any] | None:
    """One basic_get from `queue` (auto-acked), if it gave a message."""
    return _got(channel.basic_get(queue, auto_ack=True))


def test_before_v4_exchanges_are_refused_with_540_naming_v4(before_v4: AmqpCluster) -> None:
    """On a cluster still before v4 (this module's first test: the `v4` fixture upgrades the
    same cluster later), declaring, binding and publishing to an exchange are 540."""
    refusals: list[Callable[[BlockingChannel], object]] = [
        lambda ch: ch.exchange_declare("early", "fanout"),
        lambda ch: ch.queue_bind("any", "early"),
        lambda ch: ch.basic_publish("early", "k", b"x"),
        lambda ch: ch.basic_publish("amq.topic", "k", b"x"),  # built-ins come with v4 too
        lambda ch: ch.queue_declare("early-q", durable=True, arguments={
            "x-dead-letter-exchange": "early", "x-dead-letter-routing-key": "k"}),
    ]  # fmt: skip
    for refused in refusals:
        connection = pika.BlockingConnection(before_v4.params(0))
        opened = connection.channel()
        opened.confirm_delivery()
        with pytest.raises(ConnectionClosedByBroker) as info:
            refused(opened)
        assert info.value.reply_code == 540
        assert "machine v4" in info.value.reply_text
        assert "quorumq machine upgrade --to 4" in info.value.reply_text


def test_fanout_with_confirms_stores_each_publish_in_three_queues(
    channel: BlockingChannel,
) -> None:
    """Every confirmed publish to a fanout lands in each of its 3 queues, properties kept."""
    exchange = _name("fan")
    channel.exchange_declare(exchange, "fanout", durable=True)
    queues = _queues(channel, 3)
    for queue in queues:
        channel.queue_bind(queue, exchange)
    properties = pika.BasicProperties(content_type="text/plain", headers={"h": "v"})
    for number in range(10):
        channel.basic_publish(exchange, "ignored", f"m{number}".encode(), properties)
    expected = [f"m{number}".encode() for number in range(10)]
    for queue in queues:
        method, got, body = channel.basic_get(queue, auto_ack=True)
        assert (method.exchange, method.routing_key, body) == (exchange, "ignored", b"m0")
        assert (got.content_type, got.headers) == ("text/plain", {"h": "v"})
        assert [body, *_drain(channel, queue)] == expected


def test_topic_routes_star_and_hash_as_rabbitmq(channel: BlockingChannel) -> None:
    """`*` is one word, `#` zero or more; a queue matched by two bindings gets one copy."""
    exchange = _name("topic")
    channel.exchange_declare(exchange, "topic")
    star, hashed, both = _queues(channel, 3)
    channel.queue_bind(star, exchange, "a.*")
    channel.queue_bind(hashed, exchange, "a.#")
    channel.queue_bind(both, exchange, "*.b")
    channel.queue_bind(both, exchange, "#.b")
    for key in ("a", "a.b", "a.b.c", "x.b", "b", "c"):
        channel.basic_publish(exchange, key, key.encode())
    assert _drain(channel, star) == [b"a.b"]
    assert _drain(channel, hashed) == [b"a", b"a.b", b"a.b.c"]
    assert _drain(channel, both) == [b"a.b", b"x.b", b"b"]


def test_direct_routes_by_equal_key_and_unbind_stops_it(channel: BlockingChannel) -> None:
    """Direct: the binding key equals the routing key; after queue.unbind nothing more comes."""
    exchange = _name("direct")
    channel.exchange_declare(exchange, "direct")
    first, second = _queues(channel, 2)
    channel.queue_bind(first, exchange, "k1")
    channel.queue_bind(second, exchange, "k1")
    channel.queue_bind(second, exchange, "k2")
    for key in ("k1", "k2", "k3"):
        channel.basic_publish(exchange, key, key.encode())
    assert (_drain(channel, first), _drain(channel, second)) == ([b"k1"], [b"k1", b"k2"])
    channel.queue_unbind(second, exchange, "k1")
    channel.basic_publish(exchange, "k1", b"after")
    assert (_drain(channel, first), _drain(channel, second)) == ([b"after"], [])


def test_headers_exchange_matches_all_and_any(channel: BlockingChannel) -> None:
    """x-match all needs every bound header, any one of them; x- keys are not matched."""
    exchange = _name("headers")
    channel.exchange_declare(exchange, "headers")
    every, some = _queues(channel, 2)
    channel.queue_bind(every, exchange, arguments={"x-match": "all", "kind": "pdf", "size": 3})
    channel.queue_bind(some, exchange, arguments={"x-match": "any", "kind": "pdf", "size": 3})
    samples = [{"kind": "pdf", "size": 3, "x-other": "y"}, {"kind": "pdf"}, {"size": 4}, {}]
    for number, headers in enumerate(samples):
        properties = pika.BasicProperties(headers=headers)
        channel.basic_publish(exchange, "", str(number).encode(), properties)
    assert _drain(channel, every) == [b"0"]
    assert _drain(channel, some) == [b"0", b"1"]


def test_mandatory_unroutable_publish_is_returned_before_its_ack(
    channel: BlockingChannel,
) -> None:
    """pika raises UnroutableError only when basic.return (312 NO_ROUTE) came before the ack;
    a routable mandatory publish and an unroutable plain one are simply confirmed."""
    exchange = _name("direct")
    channel.exchange_declare(exchange, "direct")
    [queue] = _queues(channel, 1)
    channel.queue_bind(queue, exchange, "bound")
    with pytest.raises(UnroutableError) as info:
        channel.basic_publish(exchange, "nobody", b"lost", mandatory=True)
    [returned] = info.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert (returned.method.exchange, returned.method.routing_key) == (exchange, "nobody")
    assert returned.body == b"lost"
    channel.basic_publish(exchange, "bound", b"kept", mandatory=True)
    channel.basic_publish(exchange, "nobody", b"dropped")
    assert _drain(channel, queue) == [b"kept"]


def test_a_copy_refused_by_a_full_queue_nacks_the_publish(channel: BlockingChannel) -> None:
    """x-overflow reject-publish on one bound queue: the publish that finds it full is nacked
    (pika's NackError), while the other bound queue keeps its copy, as RabbitMQ does."""
    exchange = _name("fan")
    channel.exchange_declare(exchange, "fanout")
    [roomy] = _queues(channel, 1)
    full = _name("q")
    channel.queue_declare(full, durable=True, arguments={
        "x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "reject-publish"})  # fmt: skip
    for queue in (roomy, full):
        channel.queue_bind(queue, exchange)
    channel.basic_publish(exchange, "", b"first")
    with pytest.raises(NackError):
        channel.basic_publish(exchange, "", b"second")
    assert (_drain(channel, roomy), _drain(channel, full)) == ([b"first", b"second"], [b"first"])


def test_the_return_frames_come_before_the_ack(v4: AmqpCluster) -> None:
    """At the frame level: basic.return, its header and body, then basic.ack (RabbitMQ's
    order, which clients rely on to tell a returned message from a delivered one)."""
    raw = RawAmqp(v4.port(0))
    try:
        raw.open(v4.password)
        raw.send(1, commands.Channel.Open())
        assert isinstance(raw.next_frame()[1], commands.Channel.OpenOk)
        raw.send(1, commands.Confirm.Select())
        assert isinstance(raw.next_frame()[1], commands.Confirm.SelectOk)
        exchange = _name("direct")
        raw.send(1, commands.Exchange.Declare(exchange=exchange, exchange_type="direct"))
        assert isinstance(raw.next_frame()[1], commands.Exchange.DeclareOk)
        raw.send(1, commands.Basic.Publish(exchange=exchange, routing_key="k", mandatory=True))
        raw.send(1, header.ContentHeader(body_size=2))
        raw.send(1, body.ContentBody(b"hi"))
        kinds = [type(raw.next_frame()[1]) for _ in range(4)]
        assert kinds == [
            commands.Basic.Return, header.ContentHeader, body.ContentBody, commands.Basic.Ack
        ]  # fmt: skip
    finally:
        raw.close()


def test_built_in_exchanges_route_and_cannot_be_deleted(channel: BlockingChannel) -> None:
    """amq.direct, amq.fanout, amq.topic, amq.headers, amq.match: declared passively or with
    their own type, used without a declare, never deleted (403)."""
    for name, kind in (("amq.direct", "direct"), ("amq.fanout", "fanout"),
                       ("amq.topic", "topic"), ("amq.headers", "headers"),
                       ("amq.match", "headers")):  # fmt: skip
        channel.exchange_declare(name, passive=True)
        channel.exchange_declare(name, kind, durable=True)
    [queue] = _queues(channel, 1)
    channel.queue_bind(queue, "amq.topic", f"{queue}.#")
    channel.basic_publish("amq.topic", f"{queue}.a.b", b"routed")
    channel.basic_publish("amq.topic", "elsewhere", b"not")
    assert _drain(channel, queue) == [b"routed"]
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.exchange_delete("amq.fanout")
    assert info.value.reply_code == 403 and "deletion of system exchange" in info.value.reply_text


def test_nack_without_requeue_dead_letters_through_the_exchange(channel: BlockingChannel) -> None:
    """x-dead-letter-exchange + x-dead-letter-routing-key: a rejected message lands in every
    queue bound to the dead-letter exchange with that key, properties kept; others get none."""
    dlx = _name("dlx")
    channel.exchange_declare(dlx, "direct")
    dead, also_dead, elsewhere = _queues(channel, 3)
    channel.queue_bind(dead, dlx, "dead")
    channel.queue_bind(also_dead, dlx, "dead")
    channel.queue_bind(elsewhere, dlx, "other")
    [work] = _queues(channel, 1)
    channel.queue_delete(work)
    channel.queue_declare(work, durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": dlx,
        "x-dead-letter-routing-key": "dead"})  # fmt: skip
    channel.basic_publish("", work, b"job", pika.BasicProperties(message_id="m-1"))
    method, _properties, _body = channel.basic_get(work)
    channel.basic_nack(method.delivery_tag, requeue=False)
    for queue in (dead, also_dead):
        got = wait_until(functools.partial(_got_from, channel, queue), 10, queue)
        assert (got[2], got[1].message_id) == (b"job", "m-1")
    assert _drain(channel, elsewhere) == [] and _drain(channel, work) == []


def test_exchange_delete_if_unused_and_publish_after_delete(v4: AmqpCluster) -> None:
    """if_unused refuses an exchange with bindings (406); deleted, a publish to it is 404."""
    connection = pika.BlockingConnection(v4.params(2))
    try:
        channel = connection.channel()
        exchange = _name("fan")
        channel.exchange_declare(exchange, "fanout")
        [queue] = _queues(channel, 1)
        channel.queue_bind(queue, exchange)
        with pytest.raises(ChannelClosedByBroker) as in_use:
            channel.exchange_delete(exchange, if_unused=True)
        assert in_use.value.reply_code == 406 and "in use" in in_use.value.reply_text
        channel = connection.channel()
        channel.exchange_delete(exchange)
        channel.exchange_delete(exchange)  # RabbitMQ: deleting what is not there is ok
        channel.confirm_delivery()
        with pytest.raises(ChannelClosedByBroker) as gone:
            channel.basic_publish(exchange, "", b"x")
        assert gone.value.reply_code == 404 and f"no exchange '{exchange}'" in gone.value.reply_text
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("declare", "code", "text"),
    [
        (lambda ch, n: ch.exchange_declare(n, "topic"), 406, "inequivalent arg 'type'"),
        (lambda ch, n: ch.exchange_declare(n + "x", passive=True), 404, "no exchange"),
        (lambda ch, n: ch.exchange_declare("amq.mine", "direct"), 403, "reserved prefix"),
        (lambda ch, n: ch.queue_bind("no-such-queue", n), 404, "no queue 'no-such-queue'"),
        (lambda ch, n: ch.queue_bind("x", ""), 403, "default exchange"),
    ],
    ids=[
        "other-type",
        "passive-missing",
        "amq-prefix",
        "bind-no-queue",
        "bind-default",
    ],
)
def test_declare_and_bind_refusals_close_the_channel(
    v4: AmqpCluster, declare: Any, code: int, text: str
) -> None:
    """RabbitMQ's channel errors (the connection stays): 406, 404, 403, each naming why."""
    connection = pika.BlockingConnection(v4.params(0))
    try:
        channel = connection.channel()
        name = _name("direct")
        channel.exchange_declare(name, "direct", durable=False)  # transient: kept as durable
        channel.exchange_declare(name, "direct", passive=True)
        with pytest.raises(ChannelClosedByBroker) as info:
            declare(channel, name)
        assert info.value.reply_code == code and text in info.value.reply_text
        assert connection.is_open
    finally:
        connection.close()


def test_an_unknown_exchange_type_is_503_as_rabbitmq(v4: AmqpCluster) -> None:
    """RabbitMQ's COMMAND_INVALID (a connection error) for a type it does not know."""
    connection = pika.BlockingConnection(v4.params(0))
    with pytest.raises(ConnectionClosedByBroker) as info:
        connection.channel().exchange_declare(_name("x"), "x-delayed-message")
    assert info.value.reply_code == 503
    assert "unknown exchange type 'x-delayed-message'" in info.value.reply_text


@pytest.mark.parametrize(
    ("options", "feature"),
    [
        ({"arguments": {"alternate-exchange": "ae"}}, "alternate-exchange"),
        ({"arguments": {"x-anything": 1}}, "exchange argument 'x-anything'"),
    ],
    ids=["alternate-exchange", "another-argument"],
)
def test_what_exchanges_lack_is_refused_with_540(
    v4: AmqpCluster, options: dict[str, Any], feature: str
) -> None:
    """Never accepted and ignored: 540 naming the feature."""
    connection = pika.BlockingConnection(v4.params(0))
    with pytest.raises(ConnectionClosedByBroker) as info:
        connection.channel().exchange_declare(_name("x"), "fanout", **options)
    assert info.value.reply_code == 540 and feature in info.value.reply_text


def test_an_auto_delete_exchange_goes_with_its_last_binding(v4: AmqpCluster) -> None:
    """RabbitMQ's auto-delete exchange (aio-pika's tests declare theirs so): it lives until its
    last binding is removed; declared again with another auto_delete: 406."""
    connection = pika.BlockingConnection(v4.params(0))
    try:
        channel = connection.channel()
        exchange = _name("auto")
        channel.exchange_declare(exchange, "direct", auto_delete=True)
        [first, second] = _queues(channel, 2)
        channel.queue_bind(first, exchange, "k")
        channel.queue_bind(second, exchange, "k")
        channel.queue_unbind(first, exchange, "k")
        channel.exchange_declare(exchange, passive=True)
        channel.queue_delete(second)
        with pytest.raises(ChannelClosedByBroker) as gone:
            channel.exchange_declare(exchange, passive=True)
        assert gone.value.reply_code == 404
        channel = connection.channel()
        channel.exchange_declare(exchange, "direct")
        with pytest.raises(ChannelClosedByBroker) as other:
            channel.exchange_declare(exchange, "direct", auto_delete=True)
        assert other.value.reply_code == 406
        assert "inequivalent arg 'auto_delete'" in other.value.reply_text
    finally:
        connection.close()


def test_exchange_to_exchange_bindings_route_on_and_unbind(channel: BlockingChannel) -> None:
    """exchange.bind: a topic exchange's matches go on through a fanout bound to it (a cycle
    back is walked once); exchange.unbind stops it; a missing source is 404."""
    topic, fanout = _name("topic"), _name("fan")
    channel.exchange_declare(topic, "topic")
    channel.exchange_declare(fanout, "fanout")
    channel.exchange_bind(fanout, topic, "log.#")
    channel.exchange_bind(topic, fanout)  # a cycle
    queues = _queues(channel, 2)
    for queue in queues:
        channel.queue_bind(queue, fanout)
    channel.basic_publish(topic, "log.a", b"through")
    channel.basic_publish(topic, "other", b"not")
    assert [_drain(channel, queue) for queue in queues] == [[b"through"], [b"through"]]
    channel.exchange_unbind(fanout, topic, "log.#")
    channel.basic_publish(topic, "log.a", b"after")
    assert [_drain(channel, queue) for queue in queues] == [[], []]
    with pytest.raises(ChannelClosedByBroker) as missing:
        channel.exchange_bind(fanout, _name("none"))
    assert missing.value.reply_code == 404 and "no exchange" in missing.value.reply_text


def test_an_internal_exchange_refuses_publishes_and_routes_from_a_bound_one(
    v4: AmqpCluster,
) -> None:
    """RabbitMQ's internal exchange: a publish to it closes the channel 403 (aio-pika's own
    test_consumer_publish_errors relies on it); through an exchange bound to it, it routes."""
    connection = pika.BlockingConnection(v4.params(1))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        internal, front = _name("internal"), _name("front")
        channel.exchange_declare(internal, "fanout", internal=True)
        channel.exchange_declare(front, "direct")
        channel.exchange_bind(internal, front, "in")
        [queue] = _queues(channel, 1)
        channel.queue_bind(queue, internal)
        channel.basic_publish(front, "in", b"through")
        assert _drain(channel, queue) == [b"through"]
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.basic_publish(internal, "", b"direct")
        assert refused.value.reply_code == 403
        assert f"cannot publish to internal exchange '{internal}'" in refused.value.reply_text
        assert _drain(connection.channel(), queue) == []
    finally:
        connection.close()


def test_aio_pika_fanout_and_topic(v4: AmqpCluster) -> None:
    """aio-pika: confirmed publishes through a fanout (3 queues) and a topic exchange."""
    asyncio.run(_aio_pika_exchanges(v4.url(2)))


async def _aio_pika_exchanges(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        fanout = await channel.declare_exchange(_name("fan"), aio_pika.ExchangeType.FANOUT)
        topic = await channel.declare_exchange(_name("topic"), aio_pika.ExchangeType.TOPIC)
        queues = [await channel.declare_queue(_name("aio"), durable=True) for _ in range(4)]
        for queue in queues[:3]:
            await queue.bind(fanout)
        await queues[3].bind(topic, routing_key="log.*.error")
        await fanout.publish(aio_pika.Message(b"all", headers={"n": 1}), routing_key="")
        for key in ("log.db.error", "log.db.info", "log.error"):
            await topic.publish(aio_pika.Message(key.encode()), routing_key=key)
        for queue in queues[:3]:  # consumed: basic.deliver names the exchange and key
            async with queue.iterator() as messages:
                async for got in messages:
                    assert (got.body, got.headers) == (b"all", {"n": 1})
                    assert (got.exchange, got.routing_key) == (fanout.name, "")
                    await got.ack()
                    break
        got = await queues[3].get(timeout=5)
        assert got is not None and got.body == b"log.db.error"
        assert (got.exchange, got.routing_key) == (topic.name, "log.db.error")
        await got.ack()
        assert await queues[3].get(fail=False) is None


def test_aio_pika_rejected_message_dead_letters_through_a_topic_exchange(v4: AmqpCluster) -> None:
    """aio-pika: reject(requeue=False) routes the message through x-dead-letter-exchange."""
    asyncio.run(_aio_pika_dead_letter(v4.url(0)))


async def _aio_pika_dead_letter(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        dlx = await channel.declare_exchange(_name("dlx"), aio_pika.ExchangeType.TOPIC)
        dead = await channel.declare_queue(_name("dead"), durable=True)
        await dead.bind(dlx, routing_key="dead.#")
        arguments = {"x-dead-letter-exchange": dlx.name, "x-dead-letter-routing-key": "dead.w"}
        work = await channel.declare_queue(_name("work"), durable=True, arguments=arguments)
        await channel.default_exchange.publish(aio_pika.Message(b"job"), routing_key=work.name)
        got = await work.get(timeout=5)
        assert got is not None
        await got.reject(requeue=False)
        incoming = await asyncio.wait_for(_first(dead), 10)
        assert incoming.body == b"job"
        await incoming.ack()


async def _first(queue: Any) -> Any:
    """The first message a consumer of `queue` gets."""
    async with queue.iterator() as messages:
        async for incoming in messages:
            return incoming
    raise AssertionError(f"{queue.name}: the consumer ended")


def test_kombu_fanout_and_topic(v4: AmqpCluster) -> None:
    """kombu over py-amqp: confirmed publishes declared through kombu's own Exchange objects."""
    fanout = kombu.Exchange(_name("fan"), type="fanout")
    topic = kombu.Exchange(_name("topic"), type="topic")
    queues = [kombu.Queue(_name("kombu"), fanout) for _ in range(3)]
    queues.append(kombu.Queue(_name("kombu"), topic, routing_key="*.created"))
    with kombu.Connection(v4.url(0), transport_options={"confirm_publish": True}) as connection:
        producer = connection.Producer()
        producer.publish({"n": 1}, exchange=fanout, declare=queues[:3], serializer="json")
        for key in ("user.created", "user.deleted", "created"):
            producer.publish({"key": key}, exchange=topic, routing_key=key, declare=queues[3:],
                             serializer="json")  # fmt: skip
        for queue in queues:
            bound = queue(connection.default_channel)
            got = bound.get(no_ack=True)
            assert got is not None
            want = {"n": 1} if queue.exchange is fanout else {"key": "user.created"}
            assert got.payload == want
            assert bound.get(no_ack=True) is None


def test_kombu_rejected_message_dead_letters_through_a_direct_exchange(v4: AmqpCluster) -> None:
    """kombu: message.reject() (requeue=False) routes through x-dead-letter-exchange."""
    dlx = kombu.Exchange(_name("dlx"), type="direct")
    dead = kombu.Queue(_name("dead"), dlx, routing_key="dead")
    work_name = _name("work")
    work = kombu.Queue(work_name, kombu.Exchange(""), routing_key=work_name, queue_arguments={
        "x-dead-letter-exchange": dlx.name, "x-dead-letter-routing-key": "dead"})  # fmt: skip
    with kombu.Connection(v4.url(1), transport_options={"confirm_publish": True}) as connection:
        producer = connection.Producer()
        producer.publish({"job": 1}, routing_key=work_name, declare=[dead, work],
                         serializer="json")  # fmt: skip
        got = work(connection.default_channel).get()
        assert got is not None and got.payload == {"job": 1}
        got.reject()
        bound = dead(connection.default_channel)
        moved = wait_until(lambda: bound.get(no_ack=True), 10, "the dead letter")
        assert moved.payload == {"job": 1}


# --- pika's SelectConnection (its callback adapter): the acceptance list of issue 27 --------


@pytest.fixture
def select(v4: AmqpCluster) -> Iterator[SelectSession]:
    """A SelectConnection with a confirming channel on node n3, closed after the test."""
    session = SelectSession(v4.params(2))
    try:
        yield session
    finally:
        session.close()


def _select_queues(session: SelectSession, count: int, **arguments: Any) -> list[str]:
    names = [_name("sel") for _ in range(count)]
    for name in names:
        session.call(session.channel.queue_declare, name, durable=True,
                     arguments={"x-queue-type": "quorum", **arguments})  # fmt: skip
    return names


def test_pika_select_confirms_prefetch_and_nack_requeue(select: SelectSession) -> None:
    """SelectConnection: 6 confirmed publishes (acked, properties kept); prefetch 2 holds the
    third back until an ack; a nack with requeue comes back redelivered, x-delivery-count 1."""
    [queue] = _select_queues(select, 1)
    properties = pika.BasicProperties(content_type="text/plain", headers={"n": 1})
    assert [select.publish("", queue, f"m{n}".encode(), properties) for n in range(6)] == (
        ["ack"] * 6
    )
    select.call(select.channel.basic_qos, prefetch_count=2)
    select.consume(queue)
    first, second = select.wait_for_deliveries(2)
    with pytest.raises(AssertionError, match="3 deliveries"):
        select.run_until(lambda: len(select.deliveries) >= 3, "3 deliveries", timeout_s=0.5)
    assert (first.body, first.properties.content_type, first.properties.headers) == (
        b"m0", "text/plain", {"n": 1},
    )  # fmt: skip
    select.channel.basic_ack(first.method.delivery_tag)
    select.channel.basic_nack(second.method.delivery_tag, requeue=True)
    wanted = {f"m{n}".encode() for n in range(6)}
    settled = 2

    def ack_new() -> bool:
        nonlocal settled
        for delivery in select.deliveries[settled:]:
            select.channel.basic_ack(delivery.method.delivery_tag)
        settled = len(select.deliveries)
        return {b"m0", *(d.body for d in select.deliveries[2:])} == wanted

    select.run_until(ack_new, "every message acked")
    again = [d for d in select.deliveries[2:] if d.body == b"m1"]
    assert len(again) == 1 and len(select.deliveries) == 7
    assert again[0].method.redelivered and again[0].properties.headers["x-delivery-count"] == 1


def test_pika_select_dead_letters_through_a_direct_exchange(select: SelectSession) -> None:
    """SelectConnection: a nack without requeue moves the message through the queue's
    x-dead-letter-exchange into the queue bound there."""
    dlx = _name("dlx")
    select.call(select.channel.exchange_declare, dlx, "direct")
    [dead] = _select_queues(select, 1)
    select.call(select.channel.queue_bind, dead, dlx, "dead")
    [work] = _select_queues(select, 1, **{"x-dead-letter-exchange": dlx,
                                          "x-dead-letter-routing-key": "dead"})  # fmt: skip
    assert select.publish("", work, b"job") == "ack"
    select.consume(work)
    [delivery] = select.wait_for_deliveries(1)
    select.channel.basic_nack(delivery.method.delivery_tag, requeue=False)
    moved = wait_until(lambda: select.get(dead), 10, "the dead letter")
    assert moved.body == b"job"


def test_pika_select_fanout_to_three_queues_and_topic_routing(select: SelectSession) -> None:
    """SelectConnection: a confirmed publish to a fanout lands in each of 3 queues; a topic
    exchange routes `*` and `#` as RabbitMQ."""
    fanout, topic = _name("fan"), _name("topic")
    select.call(select.channel.exchange_declare, fanout, "fanout")
    select.call(select.channel.exchange_declare, topic, "topic")
    fanned = _select_queues(select, 3)
    star, hashed = _select_queues(select, 2)
    for queue in fanned:
        select.call(select.channel.queue_bind, queue, fanout)
    select.call(select.channel.queue_bind, star, topic, "log.*")
    select.call(select.channel.queue_bind, hashed, topic, "log.#")
    assert select.publish(fanout, "any", b"all") == "ack"
    for key in ("log.a", "log.a.b", "other"):
        assert select.publish(topic, key, key.encode()) == "ack"
    for queue in fanned:
        got = select.get(queue)
        assert got is not None and (got.body, got.method.exchange) == (b"all", fanout)
        assert select.get(queue) is None
    assert [d.body for d in _select_drain(select, star)] == [b"log.a"]
    assert [d.body for d in _select_drain(select, hashed)] == [b"log.a", b"log.a.b"]


def _select_drain(session: SelectSession, queue: str) -> list[Delivery]:
    got: list[Delivery] = []
    while (delivery := session.get(queue)) is not None:
        got.append(delivery)
    return got
