"""On-disk formats with checksums: the journal, the `.meta` file and the snapshot dump.

Checksum: `zlib.crc32` (CRC-32, IEEE polynomial). It is in the standard library and runs in C; it
detects every error burst up to 32 bits and every 1-, 2- and 3-bit error at the record sizes we
write. CRC32C would detect the same error classes; its edge is a CPU instruction that Python
cannot reach without a C extension, which this project does not want to add for the journal.
Every checksum covers the record's bytes and its position (byte offset and raft index for a
journal record, last index for a dump), so a record copied to the wrong place is caught too.

Journal (format 2): a 16-byte header `b"QQJOURN2"`, `<I` format version, `<I` crc32 of the first
12 bytes; then records, back to back, each
    `<IQQI` payload length, raft index, raft term, crc32 of (offset, those 20 bytes)
    payload (pysyncobj's command bytes)
    `<I` crc32 of (offset, the 24 header bytes, payload).
The file is append-only: its end is the end of the last record (no end pointer to keep in sync),
a conflicting tail is cut with ftruncate, a compaction writes a new file and renames it in place.
Written with plain `pwrite` (no mmap: a full disk is an ENOSPC error, not a SIGBUS).

What a start makes of damage (as Ra and etcd do): a torn tail, the partial last record a crash
mid-write leaves (fewer bytes than a header, a record that runs past the end of the file, a last
record whose checksum fails, or zeroes to the end) is cut off and logged, and the node catches up
from the leader; any other damage (a bad checksum with records after it, a header that does not
check out, indexes out of order) raises `StorageError`, naming the file, the offset and the
recovery command, and the node refuses to start.

Format 1, pysyncobj's own (`b"PYSYNCOBJ"` header, records `<I len><QQ idx, term><cmd><I len>` up
to an end offset kept in the header, no checksums), is still read (its framing checked, a torn
tail cut), then rewritten as format 2 in one atomic rename: a rolling restart upgrades each node.

Meta (format 2): `b"QQMETA02"`, `<I` body length, `<I` crc32 of (magic, length, body), body = a
CBOR map `{"term", "voted_for", "commit"}`; written to a temporary file, fsynced, renamed over the
old one and the directory fsynced. A format-1 meta (pysyncobj's pickle) is read with the safe
unpickler. A meta that does not load is damage (before, it silently reset term and vote).

Dump (format 3): `b"QQDUMP03"`, `<Q` last index, `<Q` body length, `<I` crc32 of (the 24 bytes
before it, body), body = the CBOR snapshot map, whose `live` field (bytes, little-endian u64s)
names the entries whose bodies the state still refers to (issue 32). Format 2 (`b"QQDUMP02"`,
no `live`: none) is still read; code older than format 3 refuses a format-3 dump (it names
retained entries that code would drop). A format-1 dump is the bare CBOR map.

Retained-entries segment (format 1, `raft.retention`): a 16-byte header `b"QQRETN01"`, `<I`
format version, `<I` crc32 of the first 12 bytes; then journal records exactly as above (the
checksums cover each record's offset in its segment), in any index order.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2

from raft.errors import StorageError

FILE_MODE = 0o600
DIR_MODE = 0o700

JOURNAL_MAGIC = b"QQJOURN2"
JOURNAL_VERSION = 2
JOURNAL_HEADER = JOURNAL_MAGIC + struct.pack("<I", JOURNAL_VERSION)
JOURNAL_HEADER += struct.pack("<I", zlib.crc32(JOURNAL_HEADER))
JOURNAL_HEADER_BYTES = len(JOURNAL_HEADER)  # 16
_REC_HEAD = struct.Struct("<IQQ")  # payload length, index, term
_REC_HEAD_BYTES = _REC_HEAD.size + 4  # + header crc = 24
_REC_OVERHEAD = _REC_HEAD_BYTES + 4
RECORD_PAYLOAD_MAX = 256 * 1024 * 1024  # far above any entry (frames are at most 16 MiB)

V1_MAGIC = b"PYSYNCOBJ"
V1_HEADER_BYTES = 40
V1_LAST_OFFSET_AT = 36

META_MAGIC = b"QQMETA02"
DUMP_MAGIC = b"QQDUMP03"  # format 3: the body may name live entry indexes (issue 32)
DUMP_MAGIC_V2 = b"QQDUMP02"  # still read: names none
SEGMENT_MAGIC = b"QQRETN01"
SEGMENT_VERSION = 1
SEGMENT_HEADER = SEGMENT_MAGIC + struct.pack("<I", SEGMENT_VERSION)
SEGMENT_HEADER += struct.pack("<I", zlib.crc32(SEGMENT_HEADER))
SEGMENT_HEADER_BYTES = len(SEGMENT_HEADER)  # 16
# a snapshot sent to a follower: the dump, then this header and the live entries it names
TRANSFER_MAGIC = b"QQXFER01"
TRANSFER_HEADER = TRANSFER_MAGIC + struct.pack("<I", SEGMENT_VERSION)
TRANSFER_HEADER += struct.pack("<I", zlib.crc32(TRANSFER_HEADER))
_DUMP_HEAD = struct.Struct("<QQ")  # last index, body length
_DUMP_PREFIX = len(DUMP_MAGIC) + _DUMP_HEAD.size  # 24


def recovery_hint(node_id: str | None) -> str:
    """The command that rebuilds a node from its peers."""
    who = node_id or "<node-id>"
    return (
        f"recover with `quorumq node recover {who}` (moves the damaged files aside and "
        "rebuilds the node from its peers; needs a healthy majority)"
    )


def _crc(*parts: bytes | memoryview) -> int:
    value = 0
    for part in parts:
        value = zlib.crc32(part, value)
    return value


def _off(offset: int) -> bytes:
    return struct.pack("<Q", offset)


# --- files ---------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename or file creation in it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(path: Path) -> None:
    """Create `path` (and parents) and make it 0700: a node's data is for its owner only."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path, DIR_MODE)


def write_atomically(path: Path, data: bytes | Iterable[bytes], sync: bool) -> None:
    """Write `data` (bytes, or chunks of it) to `path` via a 0600 temporary file, fsync, rename,
    fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        for chunk in (data,) if isinstance(data, bytes) else data:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


# --- journal records -----------------------------------------------------------------------------


def encode_record(offset: int, command: bytes, index: int, term: int) -> bytes:
    """One format-2 journal record as it is written at `offset`."""
    head = _REC_HEAD.pack(len(command), index, term)
    head += struct.pack("<I", _crc(_off(offset), head))
    return head + command + struct.pack("<I", _crc(_off(offset), head, command))


def decode_record(
    path: Path, buf: bytes | memoryview, at: int, offset: int, node_id: str | None = None
) -> tuple[bytes, int, int, int]:
    """Verify the record a read-back found at `buf[at:]`, written at file offset `offset`:
    (command, index, term, record length); StorageError if it does not check out (the disk
    changed it after it was written: the node must not serve it)."""

    def damaged(what: str) -> StorageError:
        return StorageError(
            f"{path}: {what} at offset {offset} on read-back (the journal changed on disk "
            f"after it was written); {recovery_hint(node_id)}",
            str(path),
            offset,
        )

    if len(buf) - at < _REC_OVERHEAD:
        raise damaged("journal record cut short")
    head = bytes(buf[at : at + _REC_HEAD.size])
    (head_crc,) = struct.unpack_from("<I", buf, at + _REC_HEAD.size)
    if _crc(_off(offset), head) != head_crc:
        raise damaged("journal record header fails its checksum")
    length, index, term = _REC_HEAD.unpack(head)
    end = at + _REC_OVERHEAD + length
    if end > len(buf):
        raise damaged(f"journal record of {length} bytes runs past what was read")
    command = bytes(buf[at + _REC_HEAD_BYTES : end - 4])
    (crc,) = struct.unpack_from("<I", buf, end - 4)
    if _crc(_off(offset), head, struct.pack("<I", head_crc), command) != crc:
        raise damaged("journal record fails its checksum")
    return command, index, term, _REC_OVERHEAD + length


@dataclass(frozen=True, slots=True)
class JournalScan:
    """What reading a journal found: its entries, where each starts, and any torn tail."""

    entries: list[tuple[bytes, int, int]]  # (command, index, term)
    offsets: list[int]
    end: int  # where the next record goes (the end of the last good record)
    torn_at: int | None  # offset of a torn tail that must be cut off (None: clean)
    torn_reason: str
    version: int


def scan_journal(
    path: Path, data: bytes, node_id: str | None = None, keep_commands: bool = True
) -> JournalScan:
    """Parse and verify a whole journal file (either format); StorageError on damage. With
    `keep_commands=False` a format-2 scan leaves every entry's command empty (`b""`): the
    caller keeps only indexes, terms and offsets and reads the commands back when needed."""
    if data.startswith(JOURNAL_MAGIC):
        return _scan_v2(path, data, node_id, keep_commands)
    if data.startswith(V1_MAGIC):
        return _scan_v1(path, data, node_id)
    if len(data) < JOURNAL_HEADER_BYTES and JOURNAL_HEADER.startswith(data):
        # a header cut short by a crash right at creation: nothing was ever in it
        return JournalScan([], [], 0, 0 if data else None, "header cut short", JOURNAL_VERSION)
    raise StorageError(
        f"{path}: not a journal (unknown header {data[:12]!r}); {recovery_hint(node_id)}",
        str(path),
        0,
    )


def _scan_v2(path: Path, data: bytes, node_id: str | None, keep_commands: bool) -> JournalScan:
    if data[:JOURNAL_HEADER_BYTES] != JOURNAL_HEADER:
        raise StorageError(
            f"{path}: journal header at offset 0 fails its checksum or has an unknown version; "
            f"{recovery_hint(node_id)}",
            str(path),
            0,
        )
    return _scan_records(path, data, node_id, keep_commands, contiguous=True)


def scan_segment(
    path: Path, data: bytes, node_id: str | None = None, header: bytes = b""
) -> JournalScan:
    """Parse and verify a retained-entries segment (`raft.retention`; or, with `header` =
    TRANSFER_HEADER, a snapshot transfer's trailer, commands kept): its header, then journal
    records in any index order; commands left empty (read back when asked for). A torn tail is
    reported as for a journal; other damage, or another format, raises StorageError."""
    header = header or SEGMENT_HEADER
    if len(data) < len(header) and header.startswith(data):
        return JournalScan([], [], 0, 0 if data else None, "header cut short", SEGMENT_VERSION)
    if data[: len(header)] != header:
        what = "an unknown format" if not data.startswith(header[:8]) else "a damaged header"
        raise StorageError(
            f"{path}: retained-entries segment with {what} at offset 0 (this code reads "
            f"segment format {SEGMENT_VERSION}); {recovery_hint(node_id)}",
            str(path),
            0,
        )
    keep = header == TRANSFER_HEADER
    scan = _scan_records(path, data, node_id, keep_commands=keep, contiguous=False)
    return JournalScan(
        scan.entries, scan.offsets, scan.end, scan.torn_at, scan.torn_reason, SEGMENT_VERSION
    )


def _scan_records(
    path: Path, data: bytes, node_id: str | None, keep_commands: bool, contiguous: bool
) -> JournalScan:
    """The records after a 16-byte header (a journal's: `contiguous` indexes; a segment's)."""
    entries: list[tuple[bytes, int, int]] = []
    offsets: list[int] = []
    offset, size = JOURNAL_HEADER_BYTES, len(data)
    view = memoryview(data)

    def torn(reason: str) -> JournalScan:
        return JournalScan(entries, offsets, offset, offset, reason, JOURNAL_VERSION)

    def damaged(what: str) -> StorageError:
        after = f" after index {entries[-1][1]}" if entries else ""
        return StorageError(
            f"{path}: {what} at offset {offset}{after} ({size - offset} bytes follow); the node "
            f"refuses to start; {recovery_hint(node_id)}",
            str(path),
            offset,
        )

    while offset < size:
        left = size - offset
        if left < _REC_HEAD_BYTES:
            return torn(f"{left} bytes, less than a record header")
        head = data[offset : offset + _REC_HEAD.size]
        (head_crc,) = struct.unpack_from("<I", data, offset + _REC_HEAD.size)
        if _crc(_off(offset), head) != head_crc:
            if not any(data[offset:]):
                return torn(f"{left} zero bytes")
            raise damaged("journal record header fails its checksum")
        length, index, term = _REC_HEAD.unpack(head)
        if length > RECORD_PAYLOAD_MAX:
            raise damaged(f"journal record claims {length} bytes")
        end = offset + _REC_OVERHEAD + length
        if end > size:
            return torn(f"record of {length} bytes runs past the end of the file")
        command = view[offset + _REC_HEAD_BYTES : end - 4]
        (crc,) = struct.unpack_from("<I", data, end - 4)
        if _crc(_off(offset), view[offset : offset + _REC_HEAD_BYTES], command) != crc:
            if end == size or not any(data[end:]):
                return torn("last record fails its checksum")
            raise damaged("journal record fails its checksum")
        if contiguous and entries and index != entries[-1][1] + 1:
            raise damaged(f"journal record has index {index}, expected {entries[-1][1] + 1}")
        entries.append((bytes(command) if keep_commands else b"", index, term))
        offsets.append(offset)
        offset = end
    return JournalScan(entries, offsets, offset, None, "", JOURNAL_VERSION)


def _scan_v1(path: Path, data: bytes, node_id: str | None) -> JournalScan:
    """pysyncobj's format: no checksums; check the framing, cut a torn tail."""
    entries: list[tuple[bytes, int, int]] = []
    if len(data) < V1_HEADER_BYTES:
        return JournalScan(entries, [], 0, 0, "format-1 header cut short", 1)
    (last,) = struct.unpack_from("<I", data, V1_LAST_OFFSET_AT)
    offset, end_known = V1_HEADER_BYTES, min(last, len(data))
    while offset < end_known:
        if offset + 4 > end_known:
            return JournalScan(entries, [], offset, offset, "format-1 record cut short", 1)
        (size,) = struct.unpack_from("<I", data, offset)
        stop = offset + size + 8
        if size < 16 or stop > end_known or data[stop - 4 : stop] != data[offset : offset + 4]:
            if stop >= end_known or not any(data[stop:end_known]):
                return JournalScan(entries, [], offset, offset, "format-1 last record torn", 1)
            raise StorageError(
                f"{path}: format-1 journal record at offset {offset} is damaged (its length "
                f"fields disagree); the node refuses to start; {recovery_hint(node_id)}",
                str(path),
                offset,
            )
        index, term = struct.unpack_from("<QQ", data, offset + 4)
        entries.append((bytes(data[offset + 20 : stop - 4]), int(index), int(term)))
        offset = stop
    torn_at = offset if last > len(data) else None
    return JournalScan(entries, [], offset, torn_at, "format-1 end offset past the file", 1)


def iter_journal(path: Path, node_id: str | None = None) -> Iterator[tuple[bytes, int, int]]:
    """The (command, index, term) records of a journal file of either format, verified; a torn
    tail is skipped (the node cuts it at its next start)."""
    yield from scan_journal(path, path.read_bytes(), node_id).entries


# --- meta ----------------------------------------------------------------------------------------


def encode_meta(meta: dict[str, Any]) -> bytes:
    """The format-2 meta file of pysyncobj's meta map."""
    body = cbor2.dumps(
        {
            "term": int(meta.get("currentTerm", 0)),
            "voted_for": meta.get("votedForNodeId"),
            "commit": int(meta.get("raftCommitIndex", 1)),
        }
    )
    prefix = META_MAGIC + struct.pack("<I", len(body))
    return prefix + struct.pack("<I", _crc(prefix, body)) + body


def decode_meta(path: Path, data: bytes, node_id: str | None = None) -> dict[str, Any]:
    """pysyncobj's meta map from a meta file of either format; StorageError if damaged."""

    def damaged(what: str, offset: int) -> StorageError:
        return StorageError(
            f"{path}: {what} at offset {offset}; the term and vote it holds are lost, so the "
            f"node refuses to start (it could vote twice in a term); {recovery_hint(node_id)}",
            str(path),
            offset,
        )

    if data.startswith(META_MAGIC):
        if len(data) < 16:
            raise damaged("meta file cut short", len(data))
        (length,) = struct.unpack_from("<I", data, 8)
        (crc,) = struct.unpack_from("<I", data, 12)
        body = data[16:]
        if len(body) != length or _crc(data[:12], body) != crc:
            raise damaged("meta file fails its checksum", 0)
        try:
            plain = cbor2.loads(body)
            meta = {
                "currentTerm": int(plain["term"]),
                "votedForNodeId": plain["voted_for"],
                "raftCommitIndex": int(plain["commit"]),
            }
        except Exception as err:
            raise damaged(f"meta body does not decode ({err!r})", 16) from err
        return meta
    from raft import safe_pickle  # format 1: pysyncobj's pickle, through the allow-list

    try:
        meta = safe_pickle.loads(data)
    except Exception as err:
        raise damaged(f"format-1 meta does not load ({type(err).__name__})", 0) from err
    if not isinstance(meta, dict):
        raise damaged("format-1 meta is not a map", 0)
    return dict(meta)


def read_meta(path: Path, node_id: str | None = None) -> dict[str, Any] | None:
    """The meta map, or None if there is no meta file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_meta(path, data, node_id)


# --- dump ----------------------------------------------------------------------------------------


def encode_dump(body: bytes, index: int) -> bytes:
    """A format-2 dump file around the CBOR snapshot `body` covering entries up to `index`."""
    prefix = DUMP_MAGIC + _DUMP_HEAD.pack(index, len(body))
    return prefix + struct.pack("<I", _crc(prefix, body)) + body


def read_dump_body(path: Path, node_id: str | None = None) -> dict[str, Any]:
    """The snapshot map of a dump file of either format, verified; StorageError if damaged."""
    data = path.read_bytes()

    def damaged(what: str, offset: int) -> StorageError:
        return StorageError(
            f"{path}: {what} at offset {offset}; the node will not run from a state it could not "
            f"load; {recovery_hint(node_id)}",
            str(path),
            offset,
        )

    if data.startswith((DUMP_MAGIC, DUMP_MAGIC_V2)):
        if len(data) < _DUMP_PREFIX + 4:
            raise damaged("snapshot header cut short", len(data))
        index, length = _DUMP_HEAD.unpack_from(data, len(DUMP_MAGIC))
        (crc,) = struct.unpack_from("<I", data, _DUMP_PREFIX)
        body = data[_DUMP_PREFIX + 4 : _DUMP_PREFIX + 4 + length]
        if len(body) != length:
            raise damaged(f"snapshot cut short ({len(body)} of {length} body bytes)", len(data))
        trailer = data[_DUMP_PREFIX + 4 + length :]
        if trailer and not (data.startswith(DUMP_MAGIC) and trailer.startswith(TRANSFER_MAGIC)):
            raise damaged(f"{len(trailer)} bytes follow the snapshot", _DUMP_PREFIX + 4 + length)
        if _crc(data[:_DUMP_PREFIX], body) != crc:
            raise damaged("snapshot fails its checksum", _DUMP_PREFIX + 4)
    else:
        body, index = data, None
    try:
        plain = cbor2.loads(body)
        last = int(plain["raft"]["last"][1])
    except Exception as err:
        raise damaged(f"snapshot does not decode ({type(err).__name__}: {err})", 0) from err
    if index is not None and last != index:
        raise damaged(f"snapshot covers index {last}, its header says {index}", 0)
    return dict(plain)


def dump_length(path: Path, data: bytes) -> int:
    """Where a format-3 dump file's snapshot ends (a transfer's trailer may follow)."""
    if not data.startswith(DUMP_MAGIC) or len(data) < _DUMP_PREFIX + 4:
        return len(data)
    _index, length = _DUMP_HEAD.unpack_from(data, len(DUMP_MAGIC))
    return min(len(data), _DUMP_PREFIX + 4 + int(length))


def transfer_records(
    path: Path, data: bytes, node_id: str | None = None
) -> list[tuple[bytes, int, int]]:
    """The live entries a snapshot transfer carried after its dump (none if none), verified;
    StorageError if the trailer is damaged or cut (a transfer is only renamed when complete)."""
    trailer = data[dump_length(path, data) :]
    if not trailer:
        return []
    scan = scan_segment(path, trailer, node_id, header=TRANSFER_HEADER)
    if scan.torn_at is not None:
        raise StorageError(
            f"{path}: the live entries after the snapshot are cut short ({scan.torn_reason}); "
            f"{recovery_hint(node_id)}",
            str(path),
            scan.torn_at,
        )
    return scan.entries


def encode_indexes(indexes: Iterable[int]) -> bytes:
    """Sorted Raft indexes as the dump's `live` field: little-endian u64s, back to back."""
    packed = array("Q", indexes)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def decode_indexes(path: Path, raw: Any, node_id: str | None = None) -> array[int]:
    """The dump's `live` field back (absent in format 2: none); StorageError if malformed."""
    packed = array("Q")
    if raw is None:
        return packed
    if not isinstance(raw, bytes) or len(raw) % 8:
        raise StorageError(
            f"{path}: the snapshot's live entry list is malformed; {recovery_hint(node_id)}",
            str(path),
            0,
        )
    packed.frombytes(raw)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed


def power_loss(journal: Path, seed: int, keep_prefix: bool = True) -> dict[str, int]:
    """Test-only: what a power cut does to a stopped node's journal (as LazyFS does for Jepsen).

    The node ran with the power-loss layer on (`raft.durability.FAULT_POWER_LOSS_ENV`), so
    `<journal>.synced` holds how many bytes of the journal were on stable storage. Everything
    after that is dropped, except that a seeded random prefix of it survives (the page cache
    may have written some of it back; its last record is then usually torn; `keep_prefix`
    False: nothing unsynced survives, every time). The meta file and
    the dump are written atomically and fsynced before they are renamed: they lose nothing.
    Returns the byte counts.
    """
    import random

    marker = journal.with_name(journal.name + ".synced")
    try:
        synced = int(marker.read_text().strip())
    except (FileNotFoundError, ValueError):
        synced = 0
    size = journal.stat().st_size if journal.exists() else 0
    if size <= synced or not journal.exists():
        return {"synced": synced, "size": size, "kept": size}
    rng = random.Random(seed)
    unsynced = size - synced
    kept = synced + (rng.choice((0, 0, rng.randrange(unsynced + 1))) if keep_prefix else 0)
    with open(journal, "r+b") as f:
        f.truncate(kept)
        f.flush()
        os.fsync(f.fileno())
    return {"synced": synced, "size": size, "kept": kept}


def is_enospc(err: OSError) -> bool:
    """Whether an OSError means the disk (or quota) is full."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT)
