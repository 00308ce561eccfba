"""Conversion into machine v4 from a v3 state: the state's shape is the same, only its rules
move to `fifo/v4` (no message, consumer or group changes); each queue's ready and returns become
WaitingLines, holding the same items."""

from __future__ import annotations

from fifo.codec import restore, snapshot
from fifo.errors import UnsupportedVersionError
from fifo.meta import Meta
from fifo.state import State, WaitingLine


def convert_v3_to_v4(state: State, meta: Meta) -> State:
    """A v4 copy of a v3 state: equal to it in every replicated field but the version, so the
    conversion is a bijection (`tests/fifo/test_v4_equivalence.py` compares v3's digest of the
    copy with the version set back). The lock index is built on first use. The input state is
    not modified."""
    if state.version != 3:
        raise UnsupportedVersionError(f"convert_v3_to_v4 got a v{state.version} state")
    new = restore(snapshot(state))
    new.version = 4
    for queue in new.queues.values():
        queue.ready, queue.returns = WaitingLine(queue.ready), WaitingLine(queue.returns)
    new.last_time = max(new.last_time, meta.system_time_ms)
    return new
