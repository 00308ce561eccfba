"""Conversion into machine v3 from a v2 state: nothing is grouped, every v2 behaviour stays."""

from __future__ import annotations

from fifo.codec import restore, snapshot
from fifo.errors import UnsupportedVersionError
from fifo.meta import Meta
from fifo.state import State


def convert_v2_to_v3(state: State, meta: Meta) -> State:
    """A v3 copy of a v2 state: existing queues get no message groups (only a declare makes a
    grouped queue), so they behave exactly as under v2. The input state is not modified."""
    if state.version != 2:
        raise UnsupportedVersionError(f"convert_v2_to_v3 got a v{state.version} state")
    new = restore(snapshot(state))
    new.version = 3
    new.last_time = max(new.last_time, meta.system_time_ms)
    return new
