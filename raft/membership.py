"""Membership changes through the log: the change entry and the persisted member set.

A change is one pysyncobj MEMBERSHIP entry (its dynamic membership: the leader appends it, every
node switches its peer set when the entry reaches its log, and rolls it back if the entry is cut)
whose payload is ours, not a pickle: a CBOR map

    {"op": "add" | "remove", "node": id, "raft": its raft address,
     "members": [[id, raft address, client address], ...]}

where `members` is the whole member set after the change, so that the set with its addresses
follows from the log alone (the first change records the founders' addresses too). One change
at a time: the leader refuses a change while another is in the log and not yet applied, and
until its election no-op is applied (then every earlier change is applied too).

Each node keeps the member set it last applied in `<data dir>/members` (format 1):
`b"QQMEMB01"`, `<Q` index of the change, `<I` body length, `<I` crc32 of (the 20 bytes before
it, body), body = CBOR `{"index", "members"}`; written atomically (temporary file, fsync,
rename, fsync of the directory). A node starts with that set as its peers (cluster.toml may
lag); a file that fails its checksum refuses the start, naming the file (`node recover` rebuilds
the node, its member set included, from its peers).
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2

from raft import storage
from raft.errors import StorageError

MEMBERS_FILE = "members"
MEMBERS_MAGIC = b"QQMEMB01"
_HEAD = struct.Struct("<QI")  # index, body length
_PREFIX = len(MEMBERS_MAGIC) + _HEAD.size  # 20
OPS = ("add", "remove")
MEMBERS_MAX = 64  # far above any sensible Raft group; bounds the entry and the checks
NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ADDRESS_BYTES_MAX = 255  # what the peer handshake can carry


@dataclass(frozen=True, slots=True, order=True)
class Member:
    """A voting member: its id, its peer (raft) address and its client address."""

    id: str
    raft: str
    client: str

    def to_plain(self) -> list[str]:
        """CBOR-able form."""
        return [self.id, self.raft, self.client]


@dataclass(frozen=True, slots=True)
class MemberChange:
    """One change: `op` on `node` (whose raft address is `raft`), and the whole member set once
    it is applied."""

    op: str
    node: str
    raft: str
    members: tuple[Member, ...]

    @property
    def member(self) -> Member | None:
        """The added member (None for a removal)."""
        return next((m for m in self.members if m.id == self.node), None)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a change was not made: `unavailable` when it may succeed later unchanged (no
    quorum, no leader, another change in flight), else the request itself is refused."""

    message: str
    unavailable: bool = False


class MembershipError(ValueError):
    """Raised when a change payload or a member set is malformed (the change is refused)."""


def check_address(address: str, what: str) -> None:
    """MembershipError unless `address` is `host:port` with a port in 1..65535."""
    host, sep, port = address.rpartition(":")
    if (
        not sep
        or not host
        or not port.isdigit()
        or not 0 < int(port) < 65536
        or len(address.encode("utf-8")) > ADDRESS_BYTES_MAX
    ):
        raise MembershipError(f"bad {what} {address!r}: expected host:port")


def check_members(members: tuple[Member, ...]) -> None:
    """MembershipError unless ids and both addresses are valid and all distinct."""
    if not members:
        raise MembershipError("a cluster needs at least one member")
    if len(members) > MEMBERS_MAX:
        raise MembershipError(f"at most {MEMBERS_MAX} members")
    for member in members:
        if not NODE_ID.match(member.id):
            raise MembershipError(f"bad node id {member.id!r}: letters, digits, '-' and '_' only")
        check_address(member.raft, "raft address")
        check_address(member.client, "client address")
    for what, values in (
        ("node id", [m.id for m in members]),
        ("raft address", [m.raft for m in members]),
        ("client address", [m.client for m in members]),
    ):
        seen: set[str] = set()
        for value in values:
            if value in seen:
                raise MembershipError(f"{what} {value} is used by two members")
            seen.add(value)


def encode_change(change: MemberChange) -> bytes:
    """The payload of the MEMBERSHIP entry (pysyncobj prefixes its command type byte)."""
    if change.op not in OPS:
        raise MembershipError(f"op must be one of {OPS}")
    members = sorted(change.members)
    return bytes(
        cbor2.dumps(
            {
                "op": change.op,
                "node": change.node,
                "raft": change.raft,
                "members": [m.to_plain() for m in members],
            }
        )
    )


def decode_change(payload: bytes) -> MemberChange:
    """Inverse of `encode_change`; MembershipError if the payload is not a valid change."""
    try:
        body = cbor2.loads(payload)
        op, node, raft = str(body["op"]), str(body["node"]), str(body["raft"])
        members = tuple(sorted(Member(str(m[0]), str(m[1]), str(m[2])) for m in body["members"]))
    except Exception as err:  # anything malformed is a refused change, never a crash
        raise MembershipError(f"malformed membership change: {err!r}") from err
    if op not in OPS:
        raise MembershipError(f"unknown membership op {op!r}")
    check_members(members)
    check_address(raft, "raft address")
    present = any(m.id == node for m in members)
    if present != (op == "add"):
        raise MembershipError(f"{op} {node}: the member set after it disagrees")
    if op == "add" and any(m.id == node and m.raft != raft for m in members):
        raise MembershipError(f"add {node}: its raft address disagrees with the member set")
    if op == "remove" and any(m.raft == raft for m in members):
        raise MembershipError(f"remove {node}: {raft} is still a member's raft address")
    return MemberChange(op, node, raft, members)


# --- the persisted member set ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberSet:
    """The member set a node last applied, at the index of the change that made it."""

    index: int
    members: tuple[Member, ...]

    def ids(self) -> list[str]:
        """Member ids, sorted."""
        return sorted(m.id for m in self.members)

    def by_id(self) -> dict[str, Member]:
        """Members by id."""
        return {m.id: m for m in self.members}


def encode_member_set(member_set: MemberSet) -> bytes:
    """The members file's bytes."""
    body = cbor2.dumps(
        {"index": member_set.index, "members": [m.to_plain() for m in sorted(member_set.members)]}
    )
    prefix = MEMBERS_MAGIC + _HEAD.pack(member_set.index, len(body))
    return prefix + struct.pack("<I", zlib.crc32(body, zlib.crc32(prefix))) + body


def decode_member_set(path: Path, data: bytes, node_id: str | None = None) -> MemberSet:
    """The member set of a members file; StorageError (naming the file) if it is damaged."""

    def damaged(what: str, offset: int) -> StorageError:
        return StorageError(
            f"{path}: {what} at offset {offset}; the node does not know its peers, so it "
            f"refuses to start; {storage.recovery_hint(node_id)}",
            str(path),
            offset,
        )

    if not data.startswith(MEMBERS_MAGIC) or len(data) < _PREFIX + 4:
        raise damaged("not a members file (bad magic or cut short)", 0)
    index, length = _HEAD.unpack_from(data, len(MEMBERS_MAGIC))
    (crc,) = struct.unpack_from("<I", data, _PREFIX)
    body = data[_PREFIX + 4 :]
    if len(body) != length or zlib.crc32(body, zlib.crc32(data[:_PREFIX])) != crc:
        raise damaged("members file fails its checksum", 0)
    try:
        plain = cbor2.loads(body)
        members = tuple(sorted(Member(str(m[0]), str(m[1]), str(m[2])) for m in plain["members"]))
        if int(plain["index"]) != index:
            raise ValueError("index differs from the header's")
        check_members(members)
    except Exception as err:
        raise damaged(f"members body does not decode ({err!r})", _PREFIX + 4) from err
    return MemberSet(index, members)


def read_member_set(data_dir: Path, node_id: str | None = None) -> MemberSet | None:
    """The node's persisted member set, or None if it never applied a change."""
    path = Path(data_dir) / MEMBERS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_member_set(path, data, node_id)


def write_member_set(data_dir: Path, member_set: MemberSet) -> None:
    """Persist the member set atomically (always fsynced: changes are rare)."""
    storage.write_atomically(Path(data_dir) / MEMBERS_FILE, encode_member_set(member_set), True)


def plain_members(members: tuple[Member, ...]) -> list[dict[str, Any]]:
    """Members as JSON-ready maps (status, CLI)."""
    return [{"id": m.id, "raft": m.raft, "client": m.client} for m in sorted(members)]
