"""The exported log format: a CBOR sequence (RFC 8742) of records, read and written streaming.

A file is a concatenation of CBOR maps, each with a type `t`, in this order:
- `header`: `format` = "quorumq-log", `version` = 1, `node`, `source` (the journal path),
  `commit_index` (as the node last saved it), `exported_ms`.
- `snapshot` (at most one): `index`, `term` of the last entry it covers and `state`, the node's
  snapshot map (`format`, `fifo` = `fifo.snapshot` bytes, `meta` = cluster metadata).
- one record per log entry above the snapshot, in index order, each with `index`, `term`, `ts`
  (the submitter's clock), `origin` ([node, incarnation, batch] or null) and, when the entry lies
  above the saved commit index, `uncommitted` = true:
  - `cmds`: `commands`, a list of `[index, term, system_time_ms, machine_version, blob]`: the exact
    `fifo.Meta` the command was applied with and its `fifo.encode` blob;
  - `hello`: `node`, `version` (highest machine version its code supports), `incarnation`,
    `accepted` (false: refused, its code is older than the effective version) and `commands`
    (same form), the `ConnectionDown`s applied for the node's previous incarnations;
  - `upgrade`: `from`, `to`, `applied` (the switch happened here), `reason` (why not, or null);
  - `raft`: `kind` = no_op | membership | version | undecodable (pysyncobj's own entries).
- `end`: `entries`, `commands`, `last_index`, `effective_version`, `digest` (the replicated
  state's digest after the last entry, equal to the node's status digest at that index) and
  `fifo_digest` (`fifo.digest` of the queue state alone, which a replay must reproduce).
A file without its `end` record was cut short.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import cbor2

from fifo.meta import Meta

FORMAT = "quorumq-log"
FORMAT_VERSION = 1
RaftKind = Literal["no_op", "membership", "version", "undecodable"]


class LogFileError(Exception):
    """Raised when a log file is not in this format, is cut short or breaks its ordering."""


@dataclass(frozen=True, slots=True)
class Header:
    """First record: where the log comes from."""

    node: str
    source: str
    commit_index: int
    exported_ms: int
    version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """The node's snapshot: the state the entries that follow start from."""

    index: int
    term: int
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LoggedCommand:
    """One command with the meta it was applied with; `blob` is its `fifo.encode` form."""

    meta: Meta
    blob: bytes


@dataclass(frozen=True, slots=True)
class EntryRecord:
    """One log entry; the fields used depend on `kind` (see the module docstring)."""

    kind: Literal["cmds", "hello", "upgrade", "raft"]
    index: int
    term: int
    ts_ms: int = 0
    origin: tuple[str, int, int] | None = None
    uncommitted: bool = False
    commands: tuple[LoggedCommand, ...] = ()
    node: str = ""
    version: int = 0
    incarnation: int = 0
    accepted: bool = True
    from_version: int = 0
    applied: bool = False
    reason: str | None = None
    raft_kind: RaftKind = "no_op"


@dataclass(frozen=True, slots=True)
class EndRecord:
    """Last record: totals and the digest after the last entry."""

    entries: int
    commands: int
    last_index: int
    effective_version: int
    digest: str
    fifo_digest: str = ""


Record = Header | SnapshotRecord | EntryRecord | EndRecord


@dataclass
class _Order:
    """What a reader has seen so far, to check the record order."""

    header: bool = False
    entries: bool = False
    end: bool = False
    last_index: int = field(default=-1)


# --- encoding ------------------------------------------------------------------------------------


def to_plain(record: Record) -> dict[str, Any]:
    """The CBOR map of a record."""
    if isinstance(record, Header):
        return {
            "t": "header",
            "format": FORMAT,
            "version": record.version,
            "node": record.node,
            "source": record.source,
            "commit_index": record.commit_index,
            "exported_ms": record.exported_ms,
        }
    if isinstance(record, SnapshotRecord):
        return {"t": "snapshot", "index": record.index, "term": record.term, "state": record.state}
    if isinstance(record, EndRecord):
        return {
            "t": "end",
            "entries": record.entries,
            "commands": record.commands,
            "last_index": record.last_index,
            "effective_version": record.effective_version,
            "digest": record.digest,
            "fifo_digest": record.fifo_digest,
        }
    return _entry_to_plain(record)


def _entry_to_plain(record: EntryRecord) -> dict[str, Any]:
    body: dict[str, Any] = {
        "t": record.kind,
        "index": record.index,
        "term": record.term,
        "ts": record.ts_ms,
        "origin": list(record.origin) if record.origin else None,
    }
    if record.uncommitted:
        body["uncommitted"] = True
    if record.kind in ("cmds", "hello"):
        body["commands"] = [
            [c.meta.index, c.meta.term, c.meta.system_time_ms, c.meta.machine_version, c.blob]
            for c in record.commands
        ]
    if record.kind == "hello":
        body.update(
            node=record.node,
            version=record.version,
            incarnation=record.incarnation,
            accepted=record.accepted,
        )
    elif record.kind == "upgrade":
        body.update(
            {
                "from": record.from_version,
                "to": record.version,
                "applied": record.applied,
                "reason": record.reason,
            }
        )
    else:
        body["kind"] = record.raft_kind
    return body


def from_plain(body: Any) -> Record:
    """Inverse of `to_plain`; LogFileError for anything that is not a record."""
    if not isinstance(body, dict):
        raise LogFileError(f"a record must be a CBOR map, got {type(body).__name__}")
    try:
        return _from_plain(body)
    except LogFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise LogFileError(f"malformed {body.get('t')!r} record: {err!r}") from err


def _from_plain(body: dict[str, Any]) -> Record:
    kind = body["t"]
    if kind == "header":
        if body["format"] != FORMAT or body["version"] != FORMAT_VERSION:
            raise LogFileError(
                f"not a {FORMAT} v{FORMAT_VERSION} file: {body['format']!r} v{body['version']!r}"
            )
        return Header(
            str(body["node"]),
            str(body["source"]),
            int(body["commit_index"]),
            int(body["exported_ms"]),
        )
    if kind == "snapshot":
        return SnapshotRecord(int(body["index"]), int(body["term"]), dict(body["state"]))
    if kind == "end":
        return EndRecord(
            int(body["entries"]),
            int(body["commands"]),
            int(body["last_index"]),
            int(body["effective_version"]),
            str(body["digest"]),
            str(body.get("fifo_digest", "")),
        )
    if kind in ("cmds", "hello", "upgrade", "raft"):
        return _entry_from_plain(kind, body)
    raise LogFileError(f"unknown record type {kind!r}")


def _entry_from_plain(kind: Any, body: dict[str, Any]) -> EntryRecord:
    origin_raw = body.get("origin")
    origin = (str(origin_raw[0]), int(origin_raw[1]), int(origin_raw[2])) if origin_raw else None
    common: dict[str, Any] = {
        "index": int(body["index"]),
        "term": int(body["term"]),
        "ts_ms": int(body["ts"]),
        "origin": origin,
        "uncommitted": bool(body.get("uncommitted", False)),
    }
    if kind in ("cmds", "hello"):
        common["commands"] = tuple(
            LoggedCommand(Meta(int(i), int(t), int(ms), int(v)), bytes(blob))
            for i, t, ms, v, blob in body.get("commands", ())
        )
    if kind == "cmds":
        return EntryRecord("cmds", **common)
    if kind == "hello":
        return EntryRecord(
            "hello",
            node=str(body["node"]),
            version=int(body["version"]),
            incarnation=int(body["incarnation"]),
            accepted=bool(body["accepted"]),
            **common,
        )
    if kind == "upgrade":
        reason = body.get("reason")
        return EntryRecord(
            "upgrade",
            from_version=int(body["from"]),
            version=int(body["to"]),
            applied=bool(body["applied"]),
            reason=None if reason is None else str(reason),
            **common,
        )
    raft_kind = body["kind"]
    if raft_kind not in ("no_op", "membership", "version", "undecodable"):
        raise LogFileError(f"unknown raft entry kind {raft_kind!r}")
    return EntryRecord("raft", raft_kind=raft_kind, **common)


# --- writing -------------------------------------------------------------------------------------


class LogWriter:
    """Writes records to a binary stream, one CBOR item each, checking their order."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.bytes_written = 0
        self._order = _Order()

    @classmethod
    def open(cls, path: Path) -> LogWriter:
        """A writer to a new file at `path`, readable by its owner only (0600: it holds every
        message body), closed with the writer."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        return cls(os.fdopen(fd, "wb"))  # owned and closed by the writer

    def write(self, record: Record) -> None:
        """Append one record."""
        _check_order(self._order, record)
        data = cbor2.dumps(to_plain(record))
        self.stream.write(data)
        self.bytes_written += len(data)

    def close(self) -> None:
        """Flush and close the stream."""
        self.stream.flush()
        self.stream.close()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _check_order(order: _Order, record: Record) -> None:
    if order.end:
        raise LogFileError("a record after the end record")
    if isinstance(record, Header):
        if order.header:
            raise LogFileError("a second header record")
        order.header = True
        return
    if not order.header:
        raise LogFileError("the first record must be the header")
    if isinstance(record, SnapshotRecord):
        if order.entries or order.last_index >= 0:
            raise LogFileError("the snapshot record must come before every entry")
        order.last_index = record.index
    elif isinstance(record, EntryRecord):
        if order.last_index >= 0 and record.index != order.last_index + 1:
            raise LogFileError(f"entry {record.index} follows entry {order.last_index}")
        order.entries = True
        order.last_index = record.index
    else:
        order.end = True


# --- reading -------------------------------------------------------------------------------------


class _Raw(io.RawIOBase):
    """A raw adapter so any binary stream can sit under a BufferedReader."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def read_records(stream: IO[bytes], require_end: bool = True) -> Iterator[Record]:
    """Yield the records of a log stream one at a time; LogFileError if malformed or cut short."""
    # peek() tells a clean end of file from a record cut short
    buffered = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(_Raw(stream))
    decoder = cbor2.CBORDecoder(buffered)
    order = _Order()
    while buffered.peek(1):
        try:
            body = decoder.decode()
        except cbor2.CBORDecodeError as err:
            raise LogFileError(f"undecodable record after index {order.last_index}: {err}") from err
        record = from_plain(body)
        _check_order(order, record)
        yield record
    if not order.header:
        raise LogFileError("empty log file: no header record")
    if require_end and not order.end:
        raise LogFileError(f"log file cut short after index {order.last_index} (no end record)")


def read_log(path: Path, require_end: bool = True) -> Iterator[Record]:
    """Yield the records of the log file at `path` (streaming)."""
    with open(path, "rb") as stream:
        yield from read_records(stream, require_end)
