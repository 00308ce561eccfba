"""Conversion into machine v2 from a v1 state (the state shape changes only in its rules)."""

from __future__ import annotations

from fifo.codec import restore, snapshot
from fifo.errors import UnsupportedVersionError
from fifo.meta import Meta
from fifo.shared import Ctx
from fifo.state import State
from fifo.v2.machine import QueueMachineV2, waiting_order

_V2 = QueueMachineV2()


def convert_v1_to_v2(state: State, meta: Meta) -> State:
    """A v2 copy of a v1 state: ids stay keys; every checked-out message gets a lock.

    Messages, enqueuers and consumers are kept; locks expire at meta time + consumer timeout;
    SAC waiting lists are put in v2 order and the v2 priority takeover is applied (an idle
    lower-priority active consumer steps down, a busy one quiesces). Conversion returns no
    effects, so that takeover is silent: the new active consumer learns it from its deliveries
    at the next command. The input state is not modified.
    """
    if state.version != 1:
        raise UnsupportedVersionError(f"convert_v1_to_v2 got a v{state.version} state")
    new = restore(snapshot(state))
    new.version = 2
    new.last_time = max(new.last_time, meta.system_time_ms)
    now = new.last_time
    for q in new.queues.values():
        for c in (*q.consumers.values(), *q.waiting):
            for m in c.checked_out.values():
                m.lock = now + c.timeout_ms
        q.waiting.sort(key=waiting_order)
        if q.config.single_active_consumer:
            _V2.activate_next(Ctx(new, meta.index, now), q)
    return new

