"""The pure parts of cluster/amqp: declare arguments, the properties envelope, SASL, frames."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands, encode

from cluster.amqp import arguments, auth, envelope, frames
from cluster.amqp.errors import (
    ACCESS_REFUSED,
    FRAME_ERROR,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    AmqpError,
    ChannelRefusal,
    ConnectionRefusal,
)
from fifo.commands import QueueConfig


def test_quorum_arguments_map_to_the_queue_config() -> None:
    """Every supported argument lands in its QueueConfig field (docs/amqp.md's table)."""
    config = arguments.queue_config("q", {
        "x-queue-type": "quorum", "x-single-active-consumer": True, "x-delivery-limit": 3,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq", "x-max-length": 10,
        "x-max-length-bytes": 1000, "x-overflow": "reject-publish", "x-message-ttl": 500,
        "x-consumer-timeout": 60_000, "x-quorumq-disconnected-timeout": 5_000,
    })  # fmt: skip
    assert config == QueueConfig(
        single_active_consumer=True, delivery_limit=3, max_length=10, max_bytes=1000,
        overflow="reject_publish", message_ttl_ms=500, dead_letter_queue="dlq",
        consumer_timeout_ms=60_000, disconnected_timeout_ms=5_000,
    )  # fmt: skip
    assert arguments.queue_config("q", None) == QueueConfig()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ({"x-max-priority": 10}, "x-max-priority"),
        ({"x-queue-type": "stream"}, "x-queue-type 'stream'"),
        ({"x-queue-type": "classic"}, "x-queue-type 'classic'"),
        ({"x-dead-letter-exchange": "dlx"}, "x-dead-letter-exchange 'dlx'"),
        ({"x-overflow": "reject-publish-dlx"}, "reject-publish-dlx"),
        ({"x-made-up": 1}, "x-made-up"),
    ],
)
def test_what_quorumq_lacks_is_refused_with_540(args: dict[str, object], names: str) -> None:
    """Refused, never accepted and ignored."""
    with pytest.raises(ConnectionRefusal) as info:
        arguments.queue_config("q", args)
    assert info.value.code == NOT_IMPLEMENTED and names in info.value.text


@pytest.mark.parametrize(
    "args",
    [{"x-max-length": -1}, {"x-max-length": "10"}, {"x-single-active-consumer": 1},
     {"x-overflow": "nope"}, {"x-dead-letter-routing-key": "k"}],
)  # fmt: skip
def test_bad_argument_values_are_406(args: dict[str, object]) -> None:
    """Wrong type or range: PRECONDITION_FAILED closing the channel, as RabbitMQ."""
    with pytest.raises(ChannelRefusal) as info:
        arguments.queue_config("q", args)
    assert info.value.code == PRECONDITION_FAILED


def test_inequivalence_names_the_first_differing_argument() -> None:
    """RabbitMQ's text: the argument, what was asked, what the queue has."""
    refusal = arguments.inequivalence("q", QueueConfig(max_length=5), QueueConfig())
    assert refusal is not None and refusal.code == PRECONDITION_FAILED
    assert refusal.text.startswith("inequivalent arg 'x-max-length' for queue 'q'")
    assert arguments.inequivalence("q", QueueConfig(), QueueConfig()) is None


def test_flags_a_quorum_queue_cannot_have() -> None:
    """Exclusive / auto-delete: 406 for a typed quorum declare, 540 untyped; non-durable is
    kept durable only when untyped; amq.* names are 403."""
    with pytest.raises(ChannelRefusal) as typed:
        arguments.check_flags("q", True, True, False, typed=True)
    assert typed.value.code == PRECONDITION_FAILED and "'exclusive'" in typed.value.text
    with pytest.raises(ConnectionRefusal):
        arguments.check_flags("q", True, False, True, typed=False)
    arguments.check_flags("q", False, False, False, typed=False)
    with pytest.raises(ChannelRefusal):
        arguments.check_flags("q", False, False, False, typed=True)
    with pytest.raises(ChannelRefusal) as reserved:
        arguments.check_flags("amq.x", True, False, False, typed=False)
    assert reserved.value.code == ACCESS_REFUSED


def test_envelope_keeps_properties_and_leaves_plain_bodies_bare() -> None:
    """No property (or delivery_mode 2 alone): the bare body; else properties round-trip."""
    persistent = commands.Basic.Properties(delivery_mode=2).marshal()
    assert envelope.wrap(persistent, b"body") == b"body"
    assert envelope.wrap(b"\x00\x00", b"body") == b"body"
    rich = commands.Basic.Properties(content_type="t/x", headers={"a": [1, "b"]}).marshal()
    stored = envelope.wrap(rich, b"body")
    assert envelope.split(stored) == (rich, b"body")
    decoded = envelope.properties_of(envelope.split(stored)[0])
    assert decoded.content_type == "t/x" and decoded.headers == {"a": [1, "b"]}
    tricky = envelope.MAGIC + b"looks like an envelope"
    assert envelope.split(envelope.wrap(persistent, tricky)) == (persistent, tricky)
    assert envelope.split(b"native body") == (None, b"native body")


def test_sasl_plain_and_amqplain() -> None:
    """PLAIN and AMQPLAIN give the same credentials; wrong ones are RabbitMQ's 403."""
    key = b"ab" * 32
    plain = b"\x00quorumq\x00" + key
    assert auth.check("PLAIN", plain, key, False, "127.0.0.1") == "quorumq"
    table = encode.field_table({"LOGIN": "quorumq", "PASSWORD": key.decode()})[4:]
    assert auth.check("AMQPLAIN", table, key, False, "10.0.0.1") == "quorumq"
    for mechanism, response in (("PLAIN", b"\x00quorumq\x00bad"), ("PLAIN", b"junk"),
                                ("EXTERNAL", b"")):  # fmt: skip
        with pytest.raises(AmqpError) as info:
            auth.check(mechanism, response, key, False, "127.0.0.1")
        assert info.value.code == ACCESS_REFUSED
    guest = b"\x00guest\x00guest"
    assert auth.check("PLAIN", guest, key, True, "127.0.0.1") == "guest"
    for allowed, peer in ((False, "127.0.0.1"), (True, "10.0.0.1")):
        with pytest.raises(ConnectionRefusal):
            auth.check("PLAIN", guest, key, allowed, peer)


def test_frame_splitter_waits_for_whole_frames_and_bounds_them() -> None:
    """Frames split across reads come out whole, in order; an oversized one is 501."""
    data = frames.encode_method(1, commands.Basic.Ack(delivery_tag=7)) + frames.HEARTBEAT_FRAME
    splitter = frames.FrameSplitter(4096)
    assert list(splitter.feed(data[:5])) == []
    got = list(splitter.feed(data[5:]))
    assert [(kind, channel) for kind, channel, _payload in got] == [(1, 1), (8, 0)]
    method = frames.decode_method(got[0][2])
    assert isinstance(method, commands.Basic.Ack) and method.delivery_tag == 7
    with pytest.raises(ConnectionRefusal) as info:
        list(frames.FrameSplitter(4096).feed(struct.pack(">BHI", 3, 1, 5000)))
    assert info.value.code == FRAME_ERROR


def test_content_is_split_into_body_frames_of_the_negotiated_size() -> None:
    """A delivery's body over the frame size goes out in several body frames."""
    deliver = commands.Basic.Deliver("t", 1, False, "", "q")
    data = frames.encode_content(1, deliver, b"\x00\x00", b"x" * 10_000, 4096)
    kinds = [kind for kind, _ch, _p in frames.FrameSplitter(4096).feed(data)]
    assert kinds == [frames.METHOD, frames.HEADER, frames.BODY, frames.BODY, frames.BODY]


@pytest.mark.parametrize("tag", [1, 255, 2**40 + 5, 2**63 - 1])
def test_the_fast_paths_write_and_read_what_pamqp_does(tag: int) -> None:
    """Confirms, deliveries, publishes and acks (one per message) skip pamqp's generic codec:
    the bytes and objects must be pamqp's own."""
    from pamqp import frame

    assert frames.encode_confirm(3, tag, True) == frame.marshal(
        commands.Basic.Ack(delivery_tag=tag), 3
    )
    assert frames.encode_confirm(3, tag, False) == frame.marshal(
        commands.Basic.Nack(delivery_tag=tag, requeue=False), 3
    )
    for redelivered in (False, True):
        deliver = commands.Basic.Deliver("ctäg-1", tag, redelivered, "", "queue.é")
        assert frames.encode_deliver(2, "ctäg-1", tag, redelivered, "queue.é") == frame.marshal(
            deliver, 2
        )
    for mandatory, immediate in ((False, False), (True, False), (False, True)):
        publish = commands.Basic.Publish(
            exchange="ex", routing_key="rk.ü", mandatory=mandatory, immediate=immediate
        )
        decoded = frames.decode_method(frame.marshal(publish, 1)[7:-1])
        assert isinstance(decoded, commands.Basic.Publish)
        assert dict(decoded) == dict(publish)
    for multiple in (False, True):
        ack = commands.Basic.Ack(delivery_tag=tag, multiple=multiple)
        decoded_ack = frames.decode_method(frame.marshal(ack, 1)[7:-1])
        assert isinstance(decoded_ack, commands.Basic.Ack) and dict(decoded_ack) == dict(ack)
    with pytest.raises(ConnectionRefusal):
        frames.decode_method(frame.marshal(commands.Basic.Publish(routing_key="q"), 1)[7:-2])


def test_group_arguments_make_a_group_config() -> None:
    """x-quorumq-group-*: popped from the arguments into a GroupConfig; bad values are 406."""
    given: dict[str, object] = {"x-quorumq-group-policy": "exclusive", "x-max-length": 3}
    groups = arguments.group_config("q", given)
    assert groups is not None and (groups.group_key, groups.policy) == ("x-group-id", "exclusive")
    assert given == {"x-max-length": 3}
    assert arguments.group_config("q", {"x-max-length": 3}) is None
    with pytest.raises(ChannelRefusal):
        arguments.group_config("q", {"x-quorumq-group-policy": "round-robin"})
    with pytest.raises(ChannelRefusal):
        arguments.group_config("q", {"x-quorumq-group-key": ""})
