"""fifo.wire: the hot paths derived from the schemas give exactly the generic encoder's bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2
import pytest

import fifo
from fifo import codec, wire
from fifo.commands import ConnectionId, Enqueue
from fifo.effects import Deliver, Delivery
from fifo.fuzz.runner import generate_log
from fifo.replies import Error
from tests.fifo.codec_samples import SAMPLES


def reference_encode(obj: object) -> bytes:
    """The generic encoding, written independently: every dataclass is its tagged field array."""

    def tree(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            tag = codec.CODEC.tag_by_class[type(value)]
            return cbor2.CBORTag(tag, [tree(getattr(value, f.name))
                                       for f in dataclasses.fields(value)])  # fmt: skip
        if isinstance(value, list | tuple):
            return [tree(item) for item in value]
        return value

    return bytes(cbor2.dumps(tree(obj), canonical=True))


def fuzz_objects(version: int) -> list[object]:
    """Commands, replies and effects of a real fuzz log (every hot shape, v1 and v2 keys)."""
    state = fifo.init_state(version)
    out: list[object] = []
    for meta, command in generate_log(11, 400, version):
        reply, effects = fifo.apply(meta, command, state)
        if dataclasses.is_dataclass(command) and not isinstance(reply, Error):
            out.append(command)
        out += [reply, *effects]
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_codec_encodes_like_the_reference(version: int) -> None:
    """encode_command / encode_effect give the reference bytes and decode back equal."""
    objects = [*SAMPLES, *fuzz_objects(version)]
    assert any(type(o) is Deliver for o in objects) and any(type(o) is Enqueue for o in objects)
    for obj in objects:
        blob = wire.encode_command(obj)
        assert blob == reference_encode(obj) == wire.encode_effect(obj), obj
        assert wire.decode_command(blob) == obj


ENQUEUES = [
    ("q", b"x" * 300, "e", 7, None, 5),
    ("queue", b"", "p" * 40, 2**40, None, None),
    ("q", b"b", "e", 1, ConnectionId("n1", 2**41, 3), 2**33),
]


@pytest.mark.parametrize("fields", ENQUEUES)
def test_fields_encoder_matches_the_generic_encoder(fields: tuple[Any, ...]) -> None:
    """The publisher's Enqueue bytes, built from fields, equal `encode(Enqueue(...))`."""
    assert wire.fields_encoder(Enqueue)(*fields) == fifo.encode(Enqueue(*fields))


def test_fields_encoder_refuses_a_wrong_field_count() -> None:
    """A caller passing too few fields gets a TypeError, never shorter bytes."""
    with pytest.raises(TypeError, match="6 fields"):
        wire.fields_encoder(Enqueue)("q", b"x")


@pytest.mark.parametrize("ttl", [None, 0, 5, 2**33, -1])
def test_splicing_the_connection_equals_encoding_the_bound_command(ttl: int | None) -> None:
    """The node's splice gives exactly the bytes of the Enqueue bound to its connection."""
    conn = ConnectionId("n1", 2**41, 7)
    command = Enqueue("q", b"body", "e", 3, None, ttl)
    splice = wire.field_splicer(Enqueue, "connection")
    spliced = splice(fifo.encode(command), command, fifo.encode(conn))
    assert spliced == fifo.encode(dataclasses.replace(command, connection=conn))


def test_splicing_refuses_what_it_cannot_do() -> None:
    """A bound command, another class, or a blob of another value: None (re-encode instead)."""
    splice = wire.field_splicer(Enqueue, "connection")
    conn_blob = fifo.encode(ConnectionId("n", 1, 1))
    bound = Enqueue("q", b"b", connection=ConnectionId("n", 1, 1))
    assert splice(fifo.encode(bound), bound, conn_blob) is None
    assert splice(b"", Enqueue("q", b"b", ttl_ms=5), conn_blob) is None
    assert splice(fifo.encode(fifo.Meta(1, 1, 1, 1)), fifo.Meta(1, 1, 1, 1), conn_blob) is None
    with pytest.raises(ValueError, match="tagged fields follow"):
        wire.field_splicer(Deliver, "connection")


@pytest.mark.parametrize("sample", SAMPLES, ids=[type(s).__name__ for s in SAMPLES])
def test_constructor_builds_equal_frozen_objects(sample: object) -> None:
    """`constructor(cls)(*fields)` equals the sample, and stays frozen."""
    cls = type(sample)
    values = [getattr(sample, f.name) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    built = wire.constructor(cls)(*values)
    assert built == sample and type(built) is cls
    if values:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(built, dataclasses.fields(cls)[0].name, values[0])


def test_fastbuild_is_the_derived_constructor() -> None:
    """The machine's effect constructors give equal objects to the dataclass constructors."""
    from fifo import fastbuild

    assert fastbuild.fresh_delivery(3, b"m") == Delivery(3, b"m", False, 0)
    conn = ConnectionId("n", 1, 1)
    made = fastbuild.deliver(conn, "q", "t", 5, (Delivery(0, b"", True, 1, (("k", 1),)),))
    assert made == Deliver(conn, "q", "t", 5, (Delivery(0, b"", True, 1, (("k", 1),)),))
