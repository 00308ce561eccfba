"""The AMQP side of exchanges without a cluster: header tables as the pairs the machine stores
and matches (what it would refuse is never sent)."""

from __future__ import annotations

import pytest

import fifo
from cluster.amqp import envelope, frames
from cluster.amqp.errors import PRECONDITION_FAILED, ChannelRefusal
from cluster.amqp.exchanges import HEADERS_MATCHED, binding_arguments, header_pairs
from fifo import commands as c
from fifo.replies import Routed


def test_header_pairs_keep_what_a_binding_can_match_and_the_machine_accepts() -> None:
    """str and int values (bytes decoded) are kept in order; bools, floats, tables, lists and
    values or keys too long for the machine are left out; at most HEADERS_MATCHED pairs, so a
    publish with many headers is stored, not refused."""
    headers: dict[str, object] = {f"h{n}": n for n in range(HEADERS_MATCHED + 8)}
    headers.update({"b": b"bytes", "t": True, "f": 1.5, "d": {"a": 1}, "long": "x" * 256,
                    "k" * 256: "v"})  # fmt: skip
    pairs = header_pairs(headers)
    assert len(pairs) == HEADERS_MATCHED and pairs[0] == ("h0", 0)
    assert header_pairs({"b": b"bytes", "t": True, "f": 1.5}) == (("b", "bytes"),)
    state = fifo.init_state(4)
    meta = fifo.Meta(1024, 1, 1, 4)
    for command in (c.DeclareQueue("q"), c.DeclareExchange("h", "headers"),
                    c.BindQueue("q", "h", "", (("h0", 0),)),
                    c.PublishToExchange("h", "", b"m", pairs)):  # fmt: skip
        reply, _ = fifo.apply(meta, command, state)
    assert reply == Routed(("q",))


def test_binding_arguments_refuse_values_that_cannot_match() -> None:
    """A binding on a value quorumq cannot store is refused (406), never silently dropped."""
    assert binding_arguments({"x-match": "any", "n": 1, "s": b"v"}) == (
        ("x-match", "any"), ("n", 1), ("s", "v")
    )  # fmt: skip
    for value in (True, 1.5, {"a": 1}, "x" * 256):
        with pytest.raises(ChannelRefusal) as info:
            binding_arguments({"k": value})
        assert info.value.code == PRECONDITION_FAILED and "'k'" in info.value.text


def test_the_routed_envelope_keeps_exchange_and_key_and_split_still_reads_it() -> None:
    """Published through an exchange: always wrapped, with the exchange and routing key (UTF-8,
    up to 255 bytes each); `split` (what the native client calls) gives properties and body."""
    for properties in (b"\x00\x00", b"\x10\x00\x02"):
        for route in (("ex", "rk"), ("é" * 127, "k" * 255), ("x", "")):
            stored = envelope.wrap(properties, b"body", route)
            assert stored.startswith(envelope.ROUTED_MAGIC)
            assert envelope.unwrap(stored) == (properties, b"body", route)
            assert envelope.split(stored) == (properties, b"body")
    bare = envelope.ROUTED_MAGIC + b"\x00"  # a bare body that looks like one: wrapped
    assert envelope.unwrap(envelope.wrap(b"\x00\x00", bare)) == (b"\x00\x00", bare, None)
    broken = envelope.ROUTED_MAGIC + b"\x00\x00\x09ex"  # exchange longer than what follows
    assert envelope.unwrap(broken) == (None, broken, None)


def test_deliver_names_the_exchange_as_pamqp_writes_it() -> None:
    """The hand-encoded basic.deliver with an exchange is pamqp's bytes."""
    from pamqp import commands, frame

    deliver = commands.Basic.Deliver("ctag", 7, True, "amq.topic", "rk")
    assert frames.encode_deliver(3, "ctag", 7, True, "rk", "amq.topic") == frame.marshal(deliver, 3)
