"""The replicated state: the fifo state plus cluster metadata, and how an entry is applied.

Pure and single-threaded (the pysyncobj node calls it inside its tick, under a lock), so it
is tested without any process. The metadata (members, versions, connections by node, down
nodes) changes only through `raft.metadata.apply_metadata`; the machine's time at each entry
(`meta.last_time_ms`) only through `raft.machine_clock.machine_time` (whose clock it follows).

An exception raised while applying a command is a bug, and nothing here catches it: it leaves
`apply_entry` and `raft.node.RaftNode._apply_locked`, the one place a bug in apply is contained,
stops applying on this node at that entry (every replica raises the same way on the same entry,
so none applies past it and the state never forks). A command blob that does not decode is bad
input, not a bug: it is refused alone with an Error reply.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

import fifo
from fifo.codec import constructor
from fifo.commands import ConnectionDown, ConnectionId
from fifo.effects import Effect
from fifo.meta import Meta
from fifo.replies import Error, Ok, Reply
from fifo.state import State
from raft import metadata
from raft.entry import Entry, Origin, command_index
from raft.errors import VersionTooOldError
from raft.fastcodec import decode_command
from raft.machine_clock import machine_time
from raft.membership import MemberChange
from raft.metadata import INITIAL_MACHINE_VERSION, Hello, Metadata, Switch, apply_metadata

__all__ = [
    "INITIAL_MACHINE_VERSION",
    "InternalFailure",
    "LiveIndexes",
    "Metadata",
    "Outcome",
    "ReplicatedState",
    "default_live_indexes",
]

SNAPSHOT_FORMAT = 1
# the sorted Raft indexes of the entries whose bodies the state still refers to (issue 32)
LiveIndexes = Callable[[State], list[int]]


def _fifo_live_indexes() -> LiveIndexes | None:
    """fifo's `live_entry_indexes` (exported by `fifo`, or in `fifo.bodies`), if it has one."""
    provider: LiveIndexes | None = getattr(fifo, "live_entry_indexes", None)
    if provider is None:
        try:
            bodies = importlib.import_module("fifo.bodies")
        except ImportError:
            return None
        provider = getattr(bodies, "live_entry_indexes", None)
    return provider


def _none(_state: State) -> list[int]:
    return []


def default_live_indexes(state: State) -> list[int]:
    """`fifo.live_entry_indexes(state)` once fifo has it (machine v4 keeps bodies in the log),
    else none: every body is inline in the state."""
    provider = _fifo_live_indexes()
    return [] if provider is None else list(provider(state))


_make_meta = constructor(Meta)  # == Meta(...), without the frozen dataclass's __setattr__ calls


@dataclass(frozen=True, slots=True)
class InternalFailure:
    """A reply slot for an internal error (the client protocol maps it). Since issue 25 an
    apply that raises stops the node instead (`raft.node`), so nothing here produces one."""

    message: str


@dataclass
class Outcome:
    """What applying one entry produced: a reply per command and the effects, in order; the
    machine's time at it, and its submitter's wall-clock skew from that time (None: not judged,
    `raft.machine_clock`)."""

    index: int
    origin: Origin | None
    replies: list[Reply | InternalFailure]
    effects: list[Effect]
    time_ms: int = 0
    clock_skew_ms: int | None = None


class ReplicatedState:
    """fifo state + metadata; `apply_entry` is deterministic given the same entries."""

    def __init__(self, members: list[str], live_indexes: LiveIndexes | None = None) -> None:
        self.meta = Metadata(members=sorted(members))
        self.state: State = fifo.init_state(INITIAL_MACHINE_VERSION)
        # resolved here, not in the snapshot child (no import after a fork)
        self.live_indexes_provider: LiveIndexes = live_indexes or _fifo_live_indexes() or _none

    def live_indexes(self) -> list[int]:
        """The sorted Raft indexes of the entries whose bodies the state still refers to."""
        return self.live_indexes_provider(self.state)

    def messages_held(self) -> int:
        """Messages in every queue (ready, returned, checked out); O(queues)."""
        return sum(queue.messages_total for queue in self.state.queues.values())

    # --- apply -------------------------------------------------------------------------------

    def apply_entry(
        self,
        index: int,
        term: int,
        entry: Entry,
        supported: int,
        decoded: tuple[Any, ...] | None = None,
    ) -> Outcome:
        """Apply one decoded entry at log `index`; VersionTooOldError before any change if this
        node's code (`supported`) cannot apply it. `decoded`: the entry's commands already
        decoded by the submitter (must equal `fifo.decode` of each blob)."""
        self._check_version(entry, index, supported)
        now, skew = machine_time(self.meta.last_time_ms, self.meta.effective_version, entry)
        self.meta.last_time_ms = now
        self.meta.last_index = index
        outcome = Outcome(index, entry.origin, [], [], now, skew)
        if entry.kind == "cmds" and decoded is not None and len(decoded) == len(entry.cmds):
            self._apply_commands(index, term, now, list(decoded), outcome)
        elif entry.kind == "cmds":
            commands: list[Any] = []
            for blob in entry.cmds:
                try:
                    commands.append(decode_command(blob))
                except Exception as err:  # a bad blob is refused, the rest of the batch goes on
                    commands.append(Error("invalid_argument", f"undecodable command: {err}"))
            self._apply_commands(index, term, now, commands, outcome)
        elif entry.kind == "hello":
            self._apply_hello(index, term, now, entry, outcome)
        else:
            self._apply_upgrade(index, term, now, entry, outcome)
        return outcome

    def _check_version(self, entry: Entry, index: int, supported: int) -> None:
        if self.meta.effective_version > supported:
            raise VersionTooOldError(self.meta.effective_version, supported, index)
        valid_upgrade = entry.kind == "upgrade" and self.upgrade_refusal(entry.version) is None
        if valid_upgrade and entry.version > supported:
            raise VersionTooOldError(entry.version, supported, index)

    def _apply_commands(
        self, index: int, term: int, now: int, commands: list[Any], outcome: Outcome
    ) -> None:
        version = self.meta.effective_version
        first = command_index(index, 0)
        state, replicated_meta = self.state, self.meta  # not replaced while commands apply
        replies, effects_out = outcome.replies, outcome.effects
        apply, make_meta = fifo.apply, _make_meta  # locals: this loop runs once per command
        for position, command in enumerate(commands):
            if type(command) is Error:
                replies.append(command)
                continue
            meta = make_meta(first + position, term, now, version)
            reply, effects = apply(meta, command, state)  # raises only on a bug (module doc)
            apply_metadata(replicated_meta, command, reply)
            replies.append(reply)
            if effects:
                effects_out.extend(effects)

    def _apply_hello(self, index: int, term: int, now: int, entry: Entry, outcome: Outcome) -> None:
        hello = Hello(entry.node, entry.version, entry.incarnation)
        reply = apply_metadata(self.meta, hello)
        if isinstance(reply, Error):
            outcome.replies.append(reply)
            return
        stale = self.stale_connection_downs(entry.node, entry.incarnation)
        self._apply_commands(index, term, now, list(stale), outcome)
        outcome.replies = [Ok()]

    def apply_member_change(self, index: int, term: int, change: MemberChange) -> Outcome:
        """Apply a committed membership entry at log `index`: a removed member's client
        connections are closed first (ConnectionDown normal, in sorted order: its consumers'
        messages come back, as when a node restarts), then the member set switches."""
        self.meta.last_index = index
        now = self.meta.last_time_ms
        outcome = Outcome(index, None, [], [], now)
        refusal = metadata.member_change_refusal(self.meta, change)
        if refusal is None and change.op == "remove":
            downs = [
                ConnectionDown(ConnectionId(change.node, inc, num), "normal")
                for inc, num in sorted(self.meta.connections.get(change.node, {}))
            ]
            self._apply_commands(index, term, now, list(downs), outcome)
        outcome.replies = [metadata.apply_member_change(self.meta, change)]
        return outcome

    def stale_connection_downs(self, node: str, incarnation: int) -> list[ConnectionDown]:
        """The ConnectionDowns a hello of `node` at `incarnation` applies (sorted; see
        `raft.metadata.stale_connection_downs`)."""
        return metadata.stale_connection_downs(self.meta, node, incarnation)

    def upgrade_target(self) -> int | None:
        """The version every member supports, if it is above the effective one."""
        return metadata.upgrade_target(self.meta)

    def upgrade_refusal(self, version: int) -> str | None:
        """Why an upgrade to `version` must be refused now, or None if every member supports it."""
        return metadata.upgrade_refusal(self.meta, version)

    def _apply_upgrade(
        self, index: int, term: int, now: int, entry: Entry, outcome: Outcome
    ) -> None:
        refusal = self.upgrade_refusal(entry.version)
        if refusal is not None:
            outcome.replies.append(Error("unsupported", refusal))
            return
        if entry.version > self.meta.effective_version:
            meta = Meta(command_index(index, 0), term, now, entry.version)
            self.state = fifo.convert(self.state, self.meta.effective_version, entry.version, meta)
        outcome.replies.append(apply_metadata(self.meta, Switch(index, entry.version)))

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """CBOR-able snapshot: our format version, the fifo snapshot and the metadata."""
        return {
            "format": SNAPSHOT_FORMAT,
            "fifo": fifo.snapshot(self.state),
            "meta": self.meta.to_plain(),
        }

    def restore(self, raw: dict[str, Any]) -> None:
        """Replace the state with a snapshot taken by `snapshot`."""
        if raw.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown snapshot format {raw.get('format')!r}")
        self.state = fifo.restore(raw["fifo"])
        self.meta = Metadata.from_plain(raw["meta"])

    def digest(self) -> str:
        """SHA-256 hex of the fifo state and the metadata (equal logs give equal digests)."""
        meta = cbor2.dumps(self.meta.to_plain(), canonical=True)
        return hashlib.sha256(fifo.digest(self.state).encode() + meta).hexdigest()
