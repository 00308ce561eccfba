"""raft.fastcodec gives exactly fifo's results, fast path or not."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fifo
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


def test_the_fast_paths_are_fifos_schema_derived_ones() -> None:
    """raft uses fifo.wire's paths: one encoding, derived from the codec's schemas."""
    from fifo import wire

    assert fastcodec.decode_command is wire.decode_command
    assert fastcodec.encode_command is wire.encode_command
    assert fastcodec.encode_effect is wire.encode_effect


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
