"""The replicated state: the fifo state plus cluster metadata, and how an entry is applied.

Pure and single-threaded (the pysyncobj node calls it from its tick thread under a lock), so it
is tested without any process. Metadata: members, each node's supported machine version and
incarnation, the effective version and the index of every switch, client connections by node
(so a restarted node's old connections are closed), nodes marked down, the monotonic clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import cbor2

import fifo
from fifo.commands import (
    Checkout,
    Command,
    ConnectionDown,
    ConnectionId,
    Enqueue,
    NodeDown,
    NodeUp,
    RegisterEnqueuer,
)
from fifo.meta import Meta
from fifo.replies import Error, Ok
from fifo.state import State
from raft.entry import Entry, Origin, command_index
from raft.errors import VersionTooOldError
from raft.fastcodec import decode_command

SNAPSHOT_FORMAT = 1
INITIAL_MACHINE_VERSION = 1


@dataclass
class Metadata:
    """Cluster metadata kept in the log next to the fifo state."""

    members: list[str]
    supported: dict[str, int] = field(default_factory=dict)
    incarnations: dict[str, int] = field(default_factory=dict)
    effective_version: int = INITIAL_MACHINE_VERSION
    switches: list[tuple[int, int]] = field(default_factory=list)  # (entry index, version)
    refused: dict[str, int] = field(default_factory=dict)  # node -> version it was refused with
    down_nodes: list[str] = field(default_factory=list)
    last_time_ms: int = 0
    last_index: int = 0
    connections: dict[str, dict[tuple[int, int], None]] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """CBOR-able form (connections sorted, so the encoding is canonical)."""
        return {
            "members": list(self.members),
            "supported": dict(sorted(self.supported.items())),
            "incarnations": dict(sorted(self.incarnations.items())),
            "effective_version": self.effective_version,
            "switches": [list(s) for s in self.switches],
            "refused": dict(sorted(self.refused.items())),
            "down_nodes": sorted(self.down_nodes),
            "last_time_ms": self.last_time_ms,
            "last_index": self.last_index,
            "connections": {
                node: sorted([inc, num] for inc, num in conns)
                for node, conns in sorted(self.connections.items())
            },
        }

    @classmethod
    def from_plain(cls, raw: dict[str, Any]) -> Metadata:
        """Inverse of `to_plain`."""
        return cls(
            members=list(raw["members"]),
            supported=dict(raw["supported"]),
            incarnations=dict(raw["incarnations"]),
            effective_version=int(raw["effective_version"]),
            switches=[(int(i), int(v)) for i, v in raw["switches"]],
            refused=dict(raw["refused"]),
            down_nodes=list(raw["down_nodes"]),
            last_time_ms=int(raw["last_time_ms"]),
            last_index=int(raw["last_index"]),
            connections={
                node: {(int(inc), int(num)): None for inc, num in conns}
                for node, conns in raw["connections"].items()
            },
        )


@dataclass(frozen=True, slots=True)
class InternalFailure:
    """The reply slot of a command whose apply raised: a bug, logged with the entry index."""

    message: str


@dataclass
class Outcome:
    """What applying one entry produced: a reply per command and the effects, in order."""

    index: int
    origin: Origin | None
    replies: list[Any]
    effects: list[Any]
    failures: list[str] = field(default_factory=list)


class ReplicatedState:
    """fifo state + metadata; `apply_entry` is deterministic given the same entries."""

    def __init__(self, members: list[str]) -> None:
        self.meta = Metadata(members=sorted(members))
        self.state: State = fifo.init_state(INITIAL_MACHINE_VERSION)

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
        now = max(self.meta.last_time_ms, entry.ts_ms)
        self.meta.last_time_ms = now
        self.meta.last_index = index
        outcome = Outcome(index, entry.origin, [], [])
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
        for position, command in enumerate(commands):
            if isinstance(command, Error):
                outcome.replies.append(command)
                continue
            meta = Meta(command_index(index, position), term, now, version)
            try:
                reply, effects = fifo.apply(meta, command, self.state)
            except Exception as err:  # fifo.apply must not raise; if it does, keep going
                message = f"{type(command).__name__} at index {meta.index} raised {err!r}"
                outcome.failures.append(message)
                outcome.replies.append(InternalFailure(message))
                continue
            self._track(command, reply)
            outcome.replies.append(reply)
            outcome.effects.extend(effects)

    def _track(self, command: Command, reply: Any) -> None:
        """Keep connections by node and down nodes in step with the commands applied."""
        connection: ConnectionId | None = None
        if isinstance(command, (Enqueue, RegisterEnqueuer)):
            connection = command.connection
        elif isinstance(command, Checkout):
            connection = command.consumer.connection
        elif isinstance(command, ConnectionDown):
            conns = self.meta.connections.get(command.connection.node)
            if conns is not None:
                conns.pop((command.connection.incarnation, command.connection.number), None)
        elif isinstance(command, NodeDown) and command.node not in self.meta.down_nodes:
            self.meta.down_nodes.append(command.node)
        elif isinstance(command, NodeUp) and command.node in self.meta.down_nodes:
            self.meta.down_nodes.remove(command.node)
        if connection is not None and not isinstance(reply, Error):
            key = (connection.incarnation, connection.number)
            self.meta.connections.setdefault(connection.node, {})[key] = None

    def _apply_hello(self, index: int, term: int, now: int, entry: Entry, outcome: Outcome) -> None:
        if entry.version < self.meta.effective_version:
            self.meta.refused[entry.node] = entry.version
            outcome.replies.append(
                Error(
                    "unsupported",
                    f"refused: the cluster runs machine version {self.meta.effective_version}, "
                    f"node {entry.node} supports only up to {entry.version}",
                )
            )
            return
        self.meta.refused.pop(entry.node, None)
        self.meta.supported[entry.node] = entry.version
        self.meta.incarnations[entry.node] = entry.incarnation
        stale = self.stale_connection_downs(entry.node, entry.incarnation)
        self._apply_commands(index, term, now, list(stale), outcome)
        outcome.replies = [Ok()]

    def stale_connection_downs(self, node: str, incarnation: int) -> list[ConnectionDown]:
        """The ConnectionDowns a hello of `node` at `incarnation` applies: its connections of
        earlier incarnations died with that process.

        In sorted order, never the dict's: a replica that applied the log has the connections in
        the order it first saw them, one restored from a snapshot has them sorted, and the order
        decides the order their messages come back in (so which message gets which id)."""
        return [
            ConnectionDown(ConnectionId(node, inc, num), "normal")
            for inc, num in sorted(self.meta.connections.get(node, {}))
            if inc != incarnation
        ]

    def upgrade_target(self) -> int | None:
        """The version every member supports, if it is above the effective one."""
        if any(m not in self.meta.supported for m in self.meta.members):
            return None
        target = min(self.meta.supported[m] for m in self.meta.members)
        return target if target > self.meta.effective_version else None

    def upgrade_refusal(self, version: int) -> str | None:
        """Why an upgrade to `version` must be refused now, or None if every member supports it."""
        if version <= self.meta.effective_version:
            return None
        lagging = [
            f"{m} supports {self.meta.supported.get(m, 'unknown')}"
            for m in self.meta.members
            if self.meta.supported.get(m, 0) < version
        ]
        if lagging:
            return f"cannot upgrade to machine version {version}: " + ", ".join(lagging)
        return None

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
            self.meta.effective_version = entry.version
            self.meta.switches.append((index, entry.version))
        outcome.replies.append(Ok())

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
