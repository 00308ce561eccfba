"""Streaming reads of exported logs (`quorumq log export`) for the analyze job.

The driver walks the file once (`scan_log`): it keeps only the header, the snapshot record, the
upgrade points (with the exact time the cluster applied them) and byte offsets that cut the file
into chunks at record boundaries. Executors then count the chunks in parallel (`chunk_shape`)
and stream them again to replay (`chunk_records`, `fast_route`), never holding more than one
record; the driver never holds the commands.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2

import fifo
from fifo.commands import (
    ConnectionDown,
    ConnectionId,
    DeclareGroupedQueue,
    DeclarePartitionedQueue,
    DeclareQueue,
    NodeDown,
    NodeUp,
    QueueConfig,
    UpdateConfig,
)
from pipeline.replay import Upgrade
from raft import command_index
from raft.logfile import FORMAT, FORMAT_VERSION
from raft.replicated import INITIAL_MACHINE_VERSION

CHUNK_BYTES_DEFAULT = 16 * 1024 * 1024
ScanProgress = Callable[[int, int], None]  # (bytes done, bytes total)


class LogScanError(Exception):
    """The file is not a complete quorumq log export."""


class EmptyLog(LogScanError):
    """Every export given holds 0 commands (its traffic was compacted into the snapshot):
    there is nothing to analyse."""


def _tag_of(command: object) -> int:
    tag = cbor2.loads(fifo.encode(command))
    assert isinstance(tag, cbor2.CBORTag)
    return int(tag.tag)


# Tag numbers read through the public codec (never renumbered, see fifo.codec).
_CONN = ConnectionId("n", 1, 1)
GLOBAL_TAGS = frozenset(
    _tag_of(c) for c in (ConnectionDown(_CONN, "normal"), NodeDown("n"), NodeUp("n"))
)
CONFIG_TAGS = frozenset(
    _tag_of(c)
    for c in (
        DeclareQueue("q"),
        UpdateConfig("q", QueueConfig()),
        DeclareGroupedQueue("q"),
        DeclarePartitionedQueue("q"),
    )
)
PARTITIONED_TAG = _tag_of(DeclarePartitionedQueue("q"))
# Machine v3 keeps partitioned queues and their consumer groups in the state, not in a queue: every
# partitioned queue, its partitions and (through JoinGroup / LeaveGroup naming the base) its groups
# replay in one group, linked through this name (never a queue name: queue names are printable).
PARTITIONED_ANCHOR = "\x00partitioned"
DLQ_FIELD = [f.name for f in dataclasses.fields(QueueConfig)].index("dead_letter_queue")


@dataclass
class LogPlan:
    """What the driver learnt from one pass over a log file."""

    path: str
    size: int
    node: str
    commit_index: int
    chunks: list[tuple[int, int]] = field(default_factory=list)
    snapshot_fifo: bytes | None = None
    snapshot_index: int | None = None
    initial_version: int = INITIAL_MACHINE_VERSION
    upgrades: list[Upgrade] = field(default_factory=list)
    entries: int = 0
    commands: int = 0
    uncommitted: int = 0
    first_ms: int | None = None
    last_ms: int = 0
    end: dict[str, Any] | None = None


def read_header(path: Path) -> dict[str, Any]:
    """The first record of an export; LogScanError if it is not one."""
    try:
        with open(path, "rb") as stream:
            header = cbor2.CBORDecoder(stream).decode()
    except Exception as err:  # cbor2 raises several types on garbage
        raise LogScanError(f"{path}: not a quorumq log export ({err})") from err
    if (
        not isinstance(header, dict)
        or header.get("t") != "header"
        or header.get("format") != FORMAT
        or header.get("version") != FORMAT_VERSION
    ):
        raise LogScanError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} export")
    return header


def pick_log(paths: list[Path]) -> tuple[Path, str]:
    """From exports of the same cluster's nodes, the one with the most commands (then the
    highest commit index) and why it was chosen; EmptyLog when none holds a command (a node's
    export starts at its last snapshot, so a higher commit index may mean fewer commands)."""
    if not paths:
        raise LogScanError("no log file given")
    ranked = []
    for path in paths:
        header = read_header(path)
        commands = scan_log(path).commands
        commit, node = int(header["commit_index"]), str(header["node"])
        ranked.append((commands, commit, path.stat().st_size, node, path))
    ranked.sort(key=lambda r: (-r[0], -r[1], -r[2], r[3]))
    commands, commit, size, node, path = ranked[0]
    if commands == 0:
        names = ", ".join(str(r[4]) for r in ranked)
        raise EmptyLog(names)
    if len(ranked) == 1:
        return path, f"{path} (node {node}, {commands} commands)"
    others = ", ".join(f"{r[3]} ({r[0]} commands, commit {r[1]})" for r in ranked[1:])
    return path, (
        f"{path} (node {node}, {commands} commands, commit index {commit}, {size} bytes): the "
        f"most commands of {len(ranked)} exports; not used: {others}"
    )


def log_files(target: Path) -> list[Path]:
    """A file, or every regular file of a directory (exports of several nodes)."""
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise LogScanError(f"{target} holds no files")
        return files
    if not target.exists():
        raise LogScanError(f"{target} does not exist")
    return [target]


def scan_log(
    path: Path, chunk_bytes: int = CHUNK_BYTES_DEFAULT, progress: ScanProgress | None = None
) -> LogPlan:
    """One streaming pass: header, snapshot, upgrades (exact times), chunk offsets, end record."""
    header = read_header(path)
    size = path.stat().st_size
    plan = LogPlan(str(path), size, str(header["node"]), int(header["commit_index"]))
    last_ms = 0
    chunk_start: int | None = None
    reported = 0
    with open(path, "rb") as stream:
        decoder = cbor2.CBORDecoder(stream)
        decoder.decode()  # the header
        while True:
            offset = stream.tell()
            if offset >= size:
                break
            try:
                record = decoder.decode()
            except Exception as err:  # a torn or corrupt record
                raise LogScanError(f"{path}: unreadable record at byte {offset}: {err}") from err
            kind = record.get("t") if isinstance(record, dict) else None
            if kind == "snapshot":
                state = record["state"]
                plan.snapshot_fifo = bytes(state["fifo"])
                plan.snapshot_index = int(record["index"])
                meta = state.get("meta", {})
                plan.initial_version = int(meta.get("effective_version", INITIAL_MACHINE_VERSION))
                last_ms = int(meta.get("last_time_ms", 0))
                continue
            if kind == "end":
                plan.end = dict(record)
                break
            if kind not in ("cmds", "hello", "upgrade", "raft"):
                raise LogScanError(f"{path}: unexpected record {kind!r} at byte {offset}")
            if chunk_start is None:
                chunk_start = offset
            elif offset - chunk_start >= chunk_bytes:
                plan.chunks.append((chunk_start, offset))
                chunk_start = offset
            plan.entries += 1
            if record.get("uncommitted"):  # above the commit index the node last saved (it
                plan.uncommitted += 1  # saves it lazily): applied, as the export's own replay
            if kind == "raft":
                continue
            ts = int(record["ts"])
            now = max(last_ms, ts)
            last_ms = now
            if plan.first_ms is None:
                plan.first_ms = now
            plan.commands += len(record.get("commands", ()))
            if kind == "upgrade" and record.get("applied"):
                index = int(record["index"])
                plan.upgrades.append(
                    Upgrade(command_index(index, 0), int(record["term"]), now, int(record["to"]))
                )
            if progress is not None and offset - reported >= chunk_bytes:
                progress(offset, size)
                reported = offset
        end_offset = stream.tell()
    if plan.end is None:
        raise LogScanError(f"{path}: no end record, the export was cut short")
    if chunk_start is not None:
        plan.chunks.append((chunk_start, end_offset))
    plan.last_ms = last_ms
    if progress is not None:
        progress(size, size)
    return plan


# --- executors -----------------------------------------------------------------------------------

ParsedRow = tuple[str, str | None, str | None, int, int, int, int, bytes | None]


def route(blob: bytes) -> tuple[str | None, str | None, bool]:
    """(queue, dead-letter target, is a config command) of an encoded command, without building
    it; queue None for the cluster-wide commands (and undecodable blobs, which every replay
    refuses alike)."""
    try:
        raw = cbor2.loads(blob)
    except Exception:  # an undecodable command: the machine refuses it in every group
        return None, None, False
    if not isinstance(raw, cbor2.CBORTag) or raw.tag in GLOBAL_TAGS:
        return None, None, False
    fields = raw.value
    queue = fields[0] if isinstance(fields, (list, tuple)) and fields else None
    if not isinstance(queue, str):
        return None, None, False
    if raw.tag in CONFIG_TAGS and len(fields) > 1 and isinstance(fields[1], cbor2.CBORTag):
        config = fields[1].value
        ok = isinstance(config, (list, tuple)) and len(config) > DLQ_FIELD
        target = config[DLQ_FIELD] if ok else None
        return queue, target if isinstance(target, str) else None, True
    return queue, None, False


_HEAD_BYTES = {24: 1, 25: 2, 26: 4, 27: 8}


def links_of(blob: bytes) -> list[tuple[str, str]]:
    """The (queue, queue) links a config command sets: its dead-letter target, and for a
    partitioned declare (v3) each partition and the anchor that keeps every partitioned queue in
    one replay group."""
    queue, target, config = route(blob)
    if not config or queue is None:
        return []
    links = [(queue, target)] if target is not None else []
    if cbor2.loads(blob).tag == PARTITIONED_TAG:
        try:
            command = fifo.decode(blob)
        except Exception:  # malformed: the machine refuses it in every group, it creates nothing
            return links
        if isinstance(command, DeclarePartitionedQueue) and isinstance(command.partitions, int):
            links.append((queue, PARTITIONED_ANCHOR))
            links += [(queue, f"{queue}.{i}") for i in range(max(0, min(command.partitions, 4096)))]
    return links


def _head(blob: bytes, pos: int) -> tuple[int, int, int]:
    """(major type, argument, next position) of the CBOR item head at `pos`; argument -1 for
    an indefinite length (or a reserved value)."""
    first = blob[pos]
    info = first & 31
    if info < 24:
        return first >> 5, info, pos + 1
    size = _HEAD_BYTES.get(info)
    if size is None or pos + 1 + size > len(blob):
        return first >> 5, -1, pos + 1
    return first >> 5, int.from_bytes(blob[pos + 1 : pos + 1 + size], "big"), pos + 1 + size


def fast_route(blob: bytes) -> tuple[str | None, int | None]:
    """(queue, tag) of an encoded command from its first bytes only: a command is a tag whose
    first field is its queue's name, so the heads of the tag, the array and the text are enough.
    Anything else (a cluster-wide command, another shape) goes through `route`, so the queue is
    `route`'s for every blob `fifo.decode` accepts (a blob that is valid only up to the queue name
    is routed to that queue's group, whose replay refuses it as every group's would)."""
    try:
        major, tag, pos = _head(blob, 0)
        if major == 6 and tag >= 0 and tag not in GLOBAL_TAGS:
            major, length, pos = _head(blob, pos)
            if major == 4 and length > 0:
                major, size, pos = _head(blob, pos)
                if major == 3 and size >= 0 and pos + size <= len(blob):
                    return blob[pos : pos + size].decode("utf-8"), tag
    except (IndexError, UnicodeDecodeError):
        pass
    return route(blob)[0], None


def chunk_records(path: str, start: int, end: int) -> Iterator[dict[str, Any]]:
    """The command-carrying records ("cmds", "hello") of one chunk, one at a time."""
    with open(path, "rb") as stream:
        stream.seek(start)
        decoder = cbor2.CBORDecoder(stream)
        while stream.tell() < end:
            record = decoder.decode()
            if record.get("t") in ("cmds", "hello"):
                yield record


def chunk_shape(path: str, start: int, end: int) -> dict[tuple[str, str | None, str | None], int]:
    """Counts of one chunk, without keeping any command: ("cmd", queue|None, None) per routed
    command and ("link", queue, target) per dead-letter link a config command sets."""
    counts: dict[tuple[str, str | None, str | None], int] = {}
    for record in chunk_records(path, start, end):
        for command in record.get("commands", ()):
            queue, tag = fast_route(command[4])
            key: tuple[str, str | None, str | None] = ("cmd", queue, None)
            counts[key] = counts.get(key, 0) + 1
            if tag is None or tag in CONFIG_TAGS:
                for queue, target in links_of(command[4]):
                    key = ("link", queue, target)
                    counts[key] = counts.get(key, 0) + 1
    return counts


def parse_chunk(path: str, start: int, end: int) -> Iterator[ParsedRow]:
    """Rows of one chunk, routed as the replay tasks route them: ("cmd", queue|None, None,
    index, term, ms, version, blob) per command, and ("link", queue, target, ...) per
    dead-letter link a config command sets."""
    for record in chunk_records(path, start, end):
        for index, term, ms, version, blob in record.get("commands", ()):
            queue, tag = fast_route(blob)
            yield ("cmd", queue, None, int(index), int(term), int(ms), int(version), blob)
            if tag is None or tag in CONFIG_TAGS:
                for queue, target in links_of(blob):
                    yield ("link", queue, target, int(index), 0, 0, 0, None)


def file_size(path: str) -> int:
    """Size of a file (for messages)."""
    return os.stat(path).st_size


class Groups:
    """Queues linked by dead-lettering, transitively (union-find), and a balanced placement."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        """The representative of `name`'s group."""
        self.parent.setdefault(name, name)
        root = name
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[name] != root:
            self.parent[name], name = root, self.parent[name]
        return root

    def link(self, a: str, b: str) -> None:
        """`a` dead-letters into `b`: they replay together."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def members(self) -> dict[str, list[str]]:
        """Representative -> sorted queue names."""
        out: dict[str, list[str]] = {}
        for name in sorted(self.parent):
            out.setdefault(self.find(name), []).append(name)
        return out


def place(sizes: dict[str, int], slots: int) -> dict[str, int]:
    """Largest group first onto the least loaded of `slots` partitions (LPT)."""
    loads = [0] * max(1, slots)
    out: dict[str, int] = {}
    for group, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        slot = min(range(len(loads)), key=lambda i: (loads[i], i))
        out[group] = slot
        loads[slot] += size
    return out
