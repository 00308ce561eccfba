"""raft.fastcodec gives exactly fifo's results, fast path or not."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fifo
import fifo.codec
from fifo.commands import (
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Discard,
    Enqueue,
    Return,
    Settle,
)
from fifo.effects import Deliver, Delivery
from fifo.errors import CodecError
from raft import fastcodec

ENQUEUE_TAG = fifo.codec.CODEC.tag_by_class[Enqueue]
CONNECTION_TAG = fifo.codec.CODEC.tag_by_class[ConnectionId]


def test_the_encoders_are_fifos_schema_derived_ones() -> None:
    """raft encodes with fifo.wire's paths: one encoding, derived from the codec's schemas."""
    from fifo import wire

    assert fastcodec.encode_command is wire.encode_command
    assert fastcodec.encode_effect is wire.encode_effect


def test_an_enqueue_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A well-formed Enqueue never reaches fifo's generic decoder (the path this module adds)."""
    blob = fifo.encode(Enqueue("q", b"x", "p", 1, ConnectionId("n1", 2, 3)))

    def refuse(_blob: bytes) -> Any:
        raise AssertionError("the generic decoder ran")

    monkeypatch.setattr(fastcodec, "_fifo_decode", refuse)
    assert fastcodec.decode_command(blob) == Enqueue("q", b"x", "p", 1, ConnectionId("n1", 2, 3))
    with pytest.raises(AssertionError):
        fastcodec.decode_command(fifo.encode(DeclareQueue("q")))


def test_equal_but_mistyped_connection_fields_are_not_taken_from_the_cache() -> None:
    """3.0 == 3 and True == 1: a cached ConnectionId("n", 3, 1) must not answer for them."""
    good = fifo.encode(Enqueue("q", b"x", None, None, ConnectionId("n", 3, 1)))
    assert fastcodec.decode_command(good).connection == ConnectionId("n", 3, 1)
    for incarnation, number in ((3.0, 1), (3, True), (3, 1.0)):
        tag = cbor2.CBORTag(CONNECTION_TAG, ["n", incarnation, number])
        blob = cbor2.dumps(cbor2.CBORTag(ENQUEUE_TAG, ["q", b"x", None, None, tag, None]))
        with pytest.raises(CodecError):
            fifo.decode(blob)
        with pytest.raises(CodecError):
            fastcodec.decode_command(blob)


def test_the_connection_cache_is_bounded() -> None:
    """More distinct connections than the cache holds: it starts over, results stay right."""
    for number in range(fastcodec.CONNECTIONS_CACHED_MAX + 10):
        command = Enqueue("q", b"", None, None, ConnectionId("n", 1, number))
        assert fastcodec.decode_command(fifo.encode(command)) == command
        assert len(fastcodec._CONNECTIONS) <= fastcodec.CONNECTIONS_CACHED_MAX


connections = st.none() | st.builds(
    ConnectionId, st.text(max_size=5), st.integers(0, 2**63), st.integers(0, 2**31)
)
connections_required = st.builds(
    ConnectionId, st.text(max_size=5), st.integers(0, 2**63), st.integers(0, 2**31)
)
enqueues = st.builds(
    Enqueue,
    st.text(max_size=10),
    st.binary(max_size=50),
    st.none() | st.text(max_size=5),
    st.none() | st.integers(-(2**63), 2**63),
    connections,
    st.none() | st.integers(0, 2**40),
)


@given(enqueues)
def test_enqueue_round_trips_like_fifo(command: Enqueue) -> None:
    """encode_command == fifo.encode and decode_command == fifo.decode for any Enqueue."""
    blob = fastcodec.encode_command(command)
    assert blob == fifo.encode(command)
    assert fastcodec.decode_command(blob) == fifo.decode(blob) == command


@pytest.mark.parametrize(
    "blob",
    [
        fifo.encode(DeclareQueue("q")),
        fifo.encode(Settle("q", 5, (1, 2))),
        cbor2.dumps(cbor2.CBORTag(71011, [1, b"x", None, None, None, None])),  # queue not a str
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, None, [1, 2], None])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x"])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, None, None, None, None])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, None, cbor2.CBORTag(71001, ["n"]), 1])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, None, cbor2.CBORTag(71011, []), 1])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, None, {"a": 1}, None])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", cbor2.CBORTag(71011, []), None, None, None])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", "x", None, None, None, None])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, True, None, None])),
        cbor2.dumps(cbor2.CBORTag(71011, ["q", b"x", None, None, None, -1])),
        cbor2.dumps([fifo.encode(DeclareQueue("q"))]),
        b"",
        fifo.encode(Enqueue("q", b"x"))[:-1],
    ],
)
def test_other_shapes_decode_as_fifo_decodes_them(blob: bytes) -> None:
    """Anything that is not a well-formed Enqueue is fifo's business: same result."""
    expected: Any = fifo.decode(blob) if _decodes(blob) else CodecError
    if expected is CodecError:
        with pytest.raises(CodecError):
            fastcodec.decode_command(blob)
    else:
        assert fastcodec.decode_command(blob) == expected


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False)
    | st.text(max_size=3)
    | st.binary(max_size=3)
)
connection_tags = st.builds(
    lambda tag, fields: cbor2.CBORTag(tag, fields),
    st.sampled_from([CONNECTION_TAG, CONNECTION_TAG + 1, ENQUEUE_TAG]),
    st.lists(scalars, max_size=4),
)
enqueue_fields = st.lists(scalars | connection_tags | st.lists(scalars, max_size=2), max_size=8)


@given(enqueue_fields)
def test_any_enqueue_tagged_array_decodes_exactly_as_fifo_decodes_it(fields: list[Any]) -> None:
    """Whatever the Enqueue tag holds: the fast path gives fifo's object or fifo's CodecError."""
    blob = cbor2.dumps(cbor2.CBORTag(ENQUEUE_TAG, fields))
    if _decodes(blob):
        decoded = fastcodec.decode_command(blob)
        assert decoded == fifo.decode(blob)
        assert type(decoded) is type(fifo.decode(blob))
        if isinstance(decoded, Enqueue) and decoded.connection is not None:
            assert (type(decoded.connection.incarnation), type(decoded.connection.number)) == (
                int,
                int,
            )
    else:
        with pytest.raises(CodecError):
            fastcodec.decode_command(blob)


def test_garbage_raises_fifos_codec_error() -> None:
    """Bytes that are not CBOR raise fifo's CodecError."""
    with pytest.raises(CodecError):
        fastcodec.decode_command(b"\xff\xfe")


def _decodes(blob: bytes) -> bool:
    try:
        fifo.decode(blob)
    except CodecError:
        return False
    return True


deliveries = st.builds(
    Delivery,
    st.integers(0, 2**40),
    st.binary(max_size=30),
    st.booleans(),
    st.integers(0, 100),
    st.lists(
        st.tuples(st.text(max_size=3), st.text(max_size=3) | st.integers(-5, 5)), max_size=2
    ).map(tuple),
)
delivers = st.builds(
    Deliver,
    st.builds(ConnectionId, st.text(max_size=3), st.integers(0, 2**50), st.integers(0, 99)),
    st.text(max_size=5),
    st.text(max_size=5),
    st.integers(0, 2**50) | st.builds(ConsumerId, st.text(max_size=3), connections_required),
    st.lists(deliveries, max_size=4).map(tuple),
)


@given(delivers)
def test_deliver_encodes_like_fifo(effect: Deliver) -> None:
    """encode_effect gives fifo.encode's bytes for any Deliver (fast path or not)."""
    assert fastcodec.encode_effect(effect) == fifo.encode(effect)
    assert fifo.decode(fastcodec.encode_effect(effect)) == effect


@given(
    st.sampled_from([Settle, Return, Discard]),
    st.text(max_size=5),
    st.integers(-(2**63), 2**63) | st.builds(ConsumerId, st.text(max_size=3), connections_required),
    st.lists(st.integers(0, 2**63), max_size=5).map(tuple),
)
def test_settle_like_commands_decode_like_fifo(cls: Any, queue: str, key: Any, ids: Any) -> None:
    """Settle, Return and Discard decode exactly as fifo decodes them."""
    blob = fifo.encode(cls(queue, key, ids))
    assert fastcodec.decode_command(blob) == fifo.decode(blob) == cls(queue, key, ids)
