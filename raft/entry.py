"""Log entries: the one CBOR blob our single pysyncobj replicated method takes.

An entry is a CBOR map with a kind `k`, the submitter's wall clock `ts` (ms), its estimate of the
machine's time `m` (ms; absent in entries of older code: `raft.machine_clock`) and the
submitter's `origin` [node, incarnation, batch id] (or None for leader timers), plus:
- `k = "cmds"`: `cmds`, a list of `fifo.encode(Command)` blobs (a group-committed batch);
- `k = "hello"`: a node records `node`, `version` (highest machine version its code supports)
  and `incarnation` when it starts;
- `k = "upgrade"`: switch the effective machine version to `to` at this entry's index.

Command metas: the i-th command of the entry at log index I is applied with
`Meta(index = I * SUB_INDEX_SPAN + i, ...)`, so every command has a distinct, increasing index
(v2 consumer keys are checkout indexes and two checkouts can share an entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import cbor2

from raft.errors import EntryError

SUB_INDEX_SPAN = 1024  # also the maximum number of commands in one entry
EntryKind = Literal["cmds", "hello", "upgrade"]
Origin = tuple[str, int, int]  # node id, incarnation, batch id


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded log entry."""

    kind: EntryKind
    ts_ms: int
    origin: Origin | None
    cmds: tuple[bytes, ...] = ()
    node: str = ""
    version: int = 0
    incarnation: int = 0
    machine_ms: int | None = None  # the submitter's estimate of the machine's time (issue 31)


def command_index(entry_index: int, position: int) -> int:
    """The meta index of the command at `position` in the entry at `entry_index`."""
    return entry_index * SUB_INDEX_SPAN + position


def encode_entry(entry: Entry) -> bytes:
    """CBOR blob of an entry."""
    body: dict[str, Any] = {"k": entry.kind, "ts": entry.ts_ms, "o": list(entry.origin or [])}
    if entry.machine_ms is not None:
        body["m"] = entry.machine_ms
    if entry.kind == "cmds":
        if len(entry.cmds) > SUB_INDEX_SPAN:
            raise ValueError(f"at most {SUB_INDEX_SPAN} commands per entry")
        body["c"] = list(entry.cmds)
    elif entry.kind == "hello":
        body.update(n=entry.node, v=entry.version, i=entry.incarnation)
    else:
        body["v"] = entry.version
    return bytes(cbor2.dumps(body))


def decode_entry(blob: bytes) -> Entry:
    """Decode an entry blob; EntryError if it is not one."""
    try:
        body = cbor2.loads(blob)
        kind = body["k"]
        origin_raw = body.get("o") or None
        origin = None
        if origin_raw:
            origin = (str(origin_raw[0]), int(origin_raw[1]), int(origin_raw[2]))
        ts = int(body["ts"])
        machine = body.get("m")
        machine_ms = None if machine is None else int(machine)
        if kind == "cmds":
            cmds = tuple(bytes(c) for c in body["c"])
            return Entry("cmds", ts, origin, cmds=cmds, machine_ms=machine_ms)
        if kind == "hello":
            return Entry(
                "hello",
                ts,
                origin,
                node=str(body["n"]),
                version=int(body["v"]),
                incarnation=int(body["i"]),
                machine_ms=machine_ms,
            )
        if kind == "upgrade":
            return Entry("upgrade", ts, origin, version=int(body["v"]), machine_ms=machine_ms)
    except Exception as err:  # any malformed blob is an EntryError, never a crash in apply
        raise EntryError(f"malformed log entry: {err}") from err
    raise EntryError(f"unknown log entry kind {kind!r}")
