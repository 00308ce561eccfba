"""Cluster metadata kept in the log next to the fifo state, and the one function that applies it.

`apply_metadata(meta, change, reply)` is pure (no I/O, no clock, deterministic; it changes
`meta` in place as `fifo.apply` changes its state) and is the only code that changes the
metadata after an entry: members' supported versions and incarnations (`Hello`), the effective
machine version and its switches (`Switch`), client connections by node and the nodes marked
down (a fifo command that was just applied, with its `reply`: called once per command, so it
allocates nothing on that path); `apply_member_change` switches the member set (a membership
entry, `raft.membership`). Golden files: tests/raft/golden/metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
from fifo.replies import Error, Ok, Reply
from raft.membership import MemberChange

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
    # member id -> (raft address, client address): empty until the first membership change
    # (the founders' addresses are in cluster.toml), then the whole member set's
    addresses: dict[str, tuple[str, str]] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """CBOR-able form (connections sorted, so the encoding is canonical; `addresses` only
        once a membership change recorded them, so older digests stay as they were)."""
        plain: dict[str, Any] = {
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
        if self.addresses:
            plain["addresses"] = {
                node: [raft, client] for node, (raft, client) in sorted(self.addresses.items())
            }
        return plain

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
            addresses={
                str(node): (str(pair[0]), str(pair[1]))
                for node, pair in raw.get("addresses", {}).items()
            },
        )


# --- the changes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Node `node` (incarnation `incarnation`) says its code supports up to `version`."""

    node: str
    version: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Switch:
    """The entry at `index` switches the effective machine version to `version` (already
    checked with `upgrade_refusal`; the fifo state is converted by the caller)."""

    index: int
    version: int


OK = Ok()


def apply_metadata(meta: Metadata, change: Command | Hello | Switch, reply: Reply = OK) -> Reply:
    """Apply one change to `meta`: a fifo command just applied (with its `reply`), a Hello or a
    Switch. Returns the hello's reply (refused: an Error), else Ok."""
    connection: ConnectionId | None = None
    if isinstance(change, Enqueue):  # the hot path first
        connection = change.connection
    elif isinstance(change, Checkout):
        connection = change.consumer.connection
    elif isinstance(change, RegisterEnqueuer):
        connection = change.connection
    elif isinstance(change, ConnectionDown):
        conns = meta.connections.get(change.connection.node)
        if conns is not None:
            conns.pop((change.connection.incarnation, change.connection.number), None)
    elif isinstance(change, NodeDown):
        if change.node not in meta.down_nodes:
            meta.down_nodes.append(change.node)
    elif isinstance(change, NodeUp):
        if change.node in meta.down_nodes:
            meta.down_nodes.remove(change.node)
    elif isinstance(change, Hello):
        return _hello(meta, change)
    elif isinstance(change, Switch) and change.version > meta.effective_version:
        meta.effective_version = change.version
        meta.switches.append((change.index, change.version))
    if connection is not None and not isinstance(reply, Error):
        # once per command: no new dict for setdefault's default on every call
        conns = meta.connections.get(connection.node)
        if conns is None:
            conns = meta.connections[connection.node] = {}
        conns[(connection.incarnation, connection.number)] = None
    return OK


def _hello(meta: Metadata, hello: Hello) -> Reply:
    if hello.version < meta.effective_version:
        meta.refused[hello.node] = hello.version
        return Error(
            "unsupported",
            f"refused: the cluster runs machine version {meta.effective_version}, "
            f"node {hello.node} supports only up to {hello.version}",
        )
    meta.refused.pop(hello.node, None)
    meta.supported[hello.node] = hello.version
    meta.incarnations[hello.node] = hello.incarnation
    return OK


def member_change_refusal(meta: Metadata, change: MemberChange) -> str | None:
    """Why `change` does not fit the current member set, or None."""
    present = change.node in meta.members
    if change.op == "add" and present:
        return f"{change.node} is already a member"
    if change.op == "remove" and not present:
        return f"{change.node} is not a member"
    expected = set(meta.members) | {change.node}
    if change.op == "remove":
        expected.discard(change.node)
    if {m.id for m in change.members} != expected:
        after = sorted(m.id for m in change.members)
        return f"{change.op} {change.node}: {after} does not follow from {meta.members}"
    return None


def apply_member_change(meta: Metadata, change: MemberChange) -> Reply:
    """Switch the member set (a committed membership entry); an Error, changing nothing, if the
    change does not fit the current set (the leader checked it before appending it)."""
    refusal = member_change_refusal(meta, change)
    if refusal is not None:
        return Error("invalid_argument", refusal)
    meta.members = sorted(m.id for m in change.members)
    meta.addresses = {m.id: (m.raft, m.client) for m in change.members}
    if change.op == "remove":
        for per_node in (meta.supported, meta.incarnations, meta.refused):
            per_node.pop(change.node, None)
        if change.node in meta.down_nodes:
            meta.down_nodes.remove(change.node)
    return OK


# --- reading ----------------------------------------------------------------------------------


def stale_connection_downs(meta: Metadata, node: str, incarnation: int) -> list[ConnectionDown]:
    """The ConnectionDowns a hello of `node` at `incarnation` applies: its connections of
    earlier incarnations died with that process.

    In sorted order, never the dict's: a replica that applied the log has the connections in
    the order it first saw them, one restored from a snapshot has them sorted, and the order
    decides the order their messages come back in (so which message gets which id)."""
    return [
        ConnectionDown(ConnectionId(node, inc, num), "normal")
        for inc, num in sorted(meta.connections.get(node, {}))
        if inc != incarnation
    ]


def upgrade_target(meta: Metadata) -> int | None:
    """The version every member supports, if it is above the effective one."""
    if any(member not in meta.supported for member in meta.members):
        return None
    target = min(meta.supported[member] for member in meta.members)
    return target if target > meta.effective_version else None


def upgrade_refusal(meta: Metadata, version: int) -> str | None:
    """Why an upgrade to `version` must be refused now, or None if every member supports it."""
    if version <= meta.effective_version:
        return None
    lagging = [
        f"{member} supports {meta.supported.get(member, 'unknown')}"
        for member in meta.members
        if meta.supported.get(member, 0) < version
    ]
    if lagging:
        return f"cannot upgrade to machine version {version}: " + ", ".join(lagging)
    return None
