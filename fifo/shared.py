"""Version-neutral pure helpers that every machine version builds on (never asks for a version).

What lives here behaves the same for every version by construction: the per-apply context, the
standard replies, key rendering and annotation merging. A helper whose behaviour could differ
between versions belongs in the versions' own packages.
"""

from __future__ import annotations

from fifo import limits
from fifo.commands import ConsumerId
from fifo.effects import Effect
from fifo.replies import Error, Ok
from fifo.state import Queue, State

OK = Ok()
SERIAL = limits.serial_modulus
DEATH_KEYS = ("x-death-reason", "x-death-queue")
Annotations = tuple[tuple[str, str | int], ...]


class Ctx:
    """What one `apply` works with: the state, the entry's index and time, the effects."""

    __slots__ = ("depth", "dirty", "effects", "index", "now", "state")

    def __init__(self, state: State, index: int, now: int) -> None:
        self.state = state
        self.index = index
        self.now = now
        self.effects: list[Effect] = []
        self.depth = 0  # dead-letter hops within this apply
        # dead-letter targets that received messages: processed after the command's own queue,
        # never re-entrantly (a queue's delivery loop must not run inside another's)
        self.dirty: list[Queue] | None = None


def invalid(message: str) -> Error:
    """An invalid_argument error reply."""
    return Error("invalid_argument", message)


def key_text(key: object) -> str:
    """A consumer key for messages: `tag@node/incarnation/number` or the index."""
    if type(key) is ConsumerId:
        conn = key.connection
        return f"{key.tag}@{conn.node}/{conn.incarnation}/{conn.number}"
    return repr(key)


def unknown_consumer(key: object) -> Error:
    """An unknown_consumer error reply."""
    return Error("unknown_consumer", f"no consumer {key_text(key)}")


def merge_annotations(old: Annotations, new: Annotations) -> Annotations:
    """Later annotations replace earlier ones with the same key; order of first appearance."""
    merged = dict(old)
    merged.update(new)
    out = tuple(merged.items())
    return out[-limits.annotations_per_message_max :]
