"""Replay v3's pinned corpus through machine v4 and compare with v3 at every checkpoint.

Each v3 log is applied twice from an empty v3 state: once by v3, once by v4 after
`convert_v3_to_v4` at the start. At every entry the replies and effects must be equal; at every
checkpoint of the corpus (every 50 entries and the end) the states must be equal and v4's due
timer commands and next deadline must be v3's.

How two states compare: v4 keeps v3's state shape and canonical encoding (the lock index is
derived and not encoded), except that a message published under v4 keeps a reference to its
body in the log (`RefMessage`, issue 32), not the body. A v4 state is compared by v3's digest of
it with every reference replaced by the body the log holds there and the version set back to 3
(`digest_as_v3`); v4's effects and replies are compared once their references are resolved from
the log being replayed (`LogBodies`, `fifo.bodies`). One reply differs by design: an unknown
command names the machine version it is not a command of ("... of machine version 4");
`normalised` maps that text back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fifo
import tests.fifo.replay_corpus as rc
from fifo.bodies import BodyMissingError, body_of_command, resolve_effects, resolve_reply
from fifo.codec import restore, snapshot
from fifo.replies import Error
from fifo.state import Message, RefMessage, State, inflate

UNKNOWN_COMMAND_V4 = "of machine version 4"


@dataclass(frozen=True, slots=True)
class V4Divergence:
    """The first entry where v4 differs from v3 on a v3 corpus log."""

    seed: int
    entry_index: int  # 1-based position in the log
    what: str  # replies, effects, state, timers
    v3: str
    v4: str

    def __str__(self) -> str:
        return (f"seed {self.seed}: entry {self.entry_index} differs in {self.what}: "
                f"v3 {self.v3[:300]} / v4 {self.v4[:300]}")  # fmt: skip


class LogBodies:
    """The bodies of a replayed log by the meta index of their command: what a node reads back
    from its journal for a v4 message reference."""

    def __init__(self) -> None:
        self.bodies: dict[int, bytes] = {}

    def record(self, meta: Any, command: Any) -> None:
        """Remember the body `command` carries, if any, under its meta index."""
        body = body_of_command(command)
        if body is not None and type(meta.index) is int:
            self.bodies[meta.index] = body

    def __call__(self, ref: int) -> bytes:
        body = self.bodies.get(ref)
        if body is None:
            raise BodyMissingError(ref, "no publish at that index in the log")
        return body


def _inline(message: Message, body_of: LogBodies) -> Message:
    """`message` with its body in place of a reference (every other field kept)."""
    if type(message) is not RefMessage:
        return message
    copy = Message(body_of(message.ref), message.expiry)
    for name in ("delivery_count", "acquired_count", "annotations", "lock", "pos", "group",
                 "enqueued_at"):  # fmt: skip
        setattr(copy, name, getattr(message, name))
    return copy


def inline_bodies(state: State, body_of: LogBodies) -> State:
    """A copy of `state` with every body reference replaced by the body the log holds."""
    copy = restore(snapshot(state))
    for queue in copy.queues.values():
        queue.ready = type(queue.ready)(_inline(inflate(m), body_of) for m in queue.ready)
        queue.returns = type(queue.returns)(_inline(inflate(m), body_of) for m in queue.returns)
        for group in queue.grouping.groups.values() if queue.grouping is not None else ():
            group.ready = type(group.ready)(_inline(m, body_of) for m in group.ready)
            group.returns = [_inline(m, body_of) for m in group.returns]
        for consumer in (*queue.consumers.values(), *queue.waiting):
            consumer.checked_out = {i: _inline(m, body_of) for i, m in consumer.checked_out.items()}
    return copy


def digest_as_v3(state: State, body_of: LogBodies | None = None) -> str:
    """v3's digest of a v4 state: the same encoding with the version field set back to 3 (and
    body references replaced by the bodies of the log, when `body_of` is given)."""
    copy = restore(snapshot(state)) if body_of is None else inline_bodies(state, body_of)
    copy.version = 3
    return fifo.digest(copy)


def normalised(reply: Any) -> Any:
    """A v4 reply in v3's words (the unknown-command text names the version)."""
    if type(reply) is Error and reply.message.endswith(UNKNOWN_COMMAND_V4):
        return Error(reply.code, reply.message[: -len(UNKNOWN_COMMAND_V4)] + "of machine version 3")
    return reply


def compare(entries: list[Any]) -> Iterator[tuple[int, str, str, str]]:
    """Apply a v3 log with v3 and with v4; yield (entry, what, v3, v4) where they differ."""
    first_meta = next((e[0] for e in entries if not (e and e[0] == "upgrade")), None)
    old = fifo.init_state(3)
    meta = first_meta if first_meta is not None else fifo.Meta(1, 1, 0, 3)
    new = fifo.convert(fifo.init_state(3), 3, 4, fifo.Meta(meta.index, meta.term, 0, 4))
    checkpoints = {*range(rc.CHECKPOINT_ENTRIES, len(entries) + 1, rc.CHECKPOINT_ENTRIES),
                   len(entries)}  # fmt: skip
    body_of = LogBodies()
    for number, entry in enumerate(entries, 1):
        body_of.record(entry[0], entry[1])
        reply3, effects3 = fifo.apply(entry[0], entry[1], old)
        reply4, effects4 = fifo.apply(entry[0], entry[1], new)
        reply4, effects4 = resolve_reply(reply4, body_of), resolve_effects(effects4, body_of)
        if rc._plain(reply3) != rc._plain(normalised(reply4)):
            yield number, "replies", repr(reply3), repr(reply4)
        if rc._plain(effects3) != rc._plain(effects4):
            yield number, "effects", repr(effects3), repr(effects4)
        if number in checkpoints:
            if fifo.digest(old) != digest_as_v3(new, body_of):
                yield number, "state", fifo.digest(old), digest_as_v3(new, body_of)
            now = entry[0].system_time_ms if type(entry[0].system_time_ms) is int else 0
            for later in (now, now + 60_000, now + 3_600_000):
                due3, due4 = fifo.due_commands(old, later), fifo.due_commands(new, later)
                if due3 != due4:
                    yield number, f"timers at {later}", repr(due3), repr(due4)
            if fifo.next_deadline_ms(old) != fifo.next_deadline_ms(new):
                yield number, "next deadline", repr(fifo.next_deadline_ms(old)), \
                    repr(fifo.next_deadline_ms(new))  # fmt: skip


def first_divergence(log: rc.CorpusLog) -> V4Divergence | None:
    """The first entry of a v3 corpus log where v4 differs from v3, or None."""
    for number, what, v3, v4 in compare(log.entries):
        return V4Divergence(log.seed, number, what, v3, v4)
    return None
