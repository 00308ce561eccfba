"""`fifo.state.WaitingLine`, machine v4's ready and returns line: the deque operations the machine
uses, against a deque, across chunk boundaries; and no small object per plain message."""

from __future__ import annotations

import sys
from collections import deque
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fifo
import fifo.state
from fifo.commands import DeclarePartitionedQueue, DeclareQueue, Enqueue, QueueConfig
from fifo.meta import Meta
from fifo.state import Message, RefMessage, Waiting, WaitingLine
from fifo.versions import convert

WORD_MAX = (1 << 64) - 1

items = st.one_of(
    st.integers(min_value=0, max_value=WORD_MAX - 1),
    st.sampled_from([WORD_MAX, WORD_MAX + 1, -1]),  # ints no word holds: kept as objects
    st.builds(Message, st.binary(max_size=4), st.none() | st.integers(0, 10)),
    st.builds(RefMessage, st.integers(1, 1000), st.integers(0, 100), st.none()),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), items),
        st.tuples(st.just("popleft"), st.none()),
        st.tuples(st.just("index"), st.integers(-12, 12)),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_a_waiting_line_does_what_a_deque_does(ops: list[tuple[str, object]]) -> None:
    """Chunks of 4 words (production's 4,096 hide the boundaries from a short sequence)."""
    with mock.patch.object(fifo.state, "LINE_CHUNK_ITEMS", 4):
        line, model = WaitingLine(), deque[Waiting]()
        for name, argument in ops:
            if name == "append":
                assert isinstance(argument, int | Message | RefMessage)
                line.append(argument)
                model.append(argument)
            elif name == "popleft":
                if model:
                    got, want = line.popleft(), model.popleft()
                    assert got == want and (got is want or isinstance(want, int))
                else:
                    with pytest.raises(IndexError):
                        line.popleft()
            elif name == "index":
                assert isinstance(argument, int)
                if -len(model) <= argument < len(model):
                    assert line[argument] == model[argument]
                else:
                    with pytest.raises(IndexError):
                        line[argument]
            else:
                line.clear()
                model.clear()
            assert len(line) == len(model) and bool(line) == bool(model)
            assert list(line) == list(model)
        assert list(WaitingLine(model)) == list(model)


def test_objects_come_back_as_the_same_objects_in_order() -> None:
    """A message with fields is kept as itself, between plain packed ints, across chunks."""
    with mock.patch.object(fifo.state, "LINE_CHUNK_ITEMS", 3):
        messages = [Message(b"m", None) for _ in range(4)]
        line = WaitingLine([1, messages[0], 2, 3, messages[1], messages[2], 4, messages[3]])
        assert line[1] is messages[0] and line[-1] is messages[3]
        taken = [line.popleft() for _ in range(len(line))]
        assert taken == [1, messages[0], 2, 3, messages[1], messages[2], 4, messages[3]]
        assert taken[1] is messages[0] and not line


def test_plain_packed_messages_cost_no_small_object_each() -> None:
    """A deque of packed ints held one int object per message on the small-object heap, whose
    arenas a drained backlog's survivors kept (issue 32's resident set after a drain); a line
    holds 64-bit words in arrays."""
    count, base = 100_000, 1 << 40  # packed ints of real references are this big

    def blocks_for(make: type[deque[Waiting]] | type[WaitingLine]) -> int:
        before = sys.getallocatedblocks()
        line = make(base + n for n in range(count))
        held = sys.getallocatedblocks() - before
        assert len(line) == count
        return held

    assert blocks_for(deque) > count  # the test sees the int objects
    assert blocks_for(WaitingLine) < count // 100


def test_every_v4_queue_has_lines_and_v3_queues_keep_deques() -> None:
    """Declared, declared partitioned, restored from a snapshot or converted from v3: a v4
    queue's ready and returns are WaitingLines (a deque would hold an int object per message
    again, silently); v3's stay deques."""

    def lines(state: fifo.State) -> set[type]:
        return {type(q.ready) for q in state.queues.values()} | {
            type(q.returns) for q in state.queues.values()
        }

    def declared(version: int) -> fifo.State:
        state = fifo.init_state(version)
        fifo.apply(Meta(1, 1, 1, version), DeclareQueue("q", QueueConfig()), state)
        fifo.apply(
            Meta(2, 1, 1, version),
            DeclarePartitionedQueue("p", QueueConfig(single_active_consumer=True), partitions=2),
            state,
        )
        assert {"q", "p.0", "p.1"} <= set(state.queues)
        fifo.apply(Meta(3, 1, 1, version), Enqueue("q", b"body"), state)
        return state

    v3, v4 = declared(3), declared(4)
    assert lines(v3) == {deque} and lines(fifo.restore(fifo.snapshot(v3))) == {deque}
    assert lines(v4) == {WaitingLine} and lines(fifo.restore(fifo.snapshot(v4))) == {WaitingLine}
    converted = convert(v3, 3, 4, Meta(4, 1, 1, 4))
    assert lines(converted) == {WaitingLine} and len(converted.queues["q"].ready) == 1
