"""The AMQP side of exchanges without a cluster: header tables as the pairs the machine stores
and matches (what it would refuse is never sent)."""

from __future__ import annotations

import pytest

import fifo
from cluster.amqp.errors import PRECONDITION_FAILED, ChannelRefusal
from cluster.amqp.exchanges import HEADERS_MATCHED, binding_arguments, header_pairs
from fifo import commands as c
from fifo.replies import Routed


def test_header_pairs_keep_what_a_binding_can_match_and_the_machine_accepts() -> None:
    """str and int values (bytes decoded) are kept in order; bools, floats, tables, lists and
    values or keys too long for the machine are left out; at most HEADERS_MATCHED pairs, so a
    publish with many headers is stored, not refused."""
    headers = {f"h{n}": n for n in range(HEADERS_MATCHED + 8)}
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
