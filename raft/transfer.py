"""A snapshot sent to a lagging follower carries the live entries it names (issue 32).

pysyncobj streams the dump file to a follower in chunks (`logCompactionBatchSize` each, one per
AppendEntries). When the dump names live entries below its first log entry, the stream goes on
after the dump's last byte with `storage.TRANSFER_HEADER` and one checksummed journal record per
live entry, read from the retained store or the journal chunk by chunk as it is sent (never
gathered in memory). A dump naming none is sent byte for byte as before.

The follower's pysyncobj writes the stream to its dump file and renames it into place when the
last chunk arrived; its deserializer (`raft.node`) verifies the trailer's records, adds them to
its retained store (synced), then cuts the trailer off the dump file. A crash in between leaves
a dump with its trailer, which the next start installs the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from raft import storage
from raft.durability import DurableFileJournal
from raft.errors import EntryGoneError

__all__ = [
    "TRANSFER_BUFFERED_MAX",
    "TRANSFER_RETRY_S",
    "TransferFailed",
    "TransferStream",
    "send_buffered",
]

# a follower in a snapshot transfer is sent nothing (no chunk, no heartbeat: the chunks are its
# heartbeats) while its connection holds more bytes than this not yet taken by its socket:
# pysyncobj sends chunks for a whole heartbeat period per send round whatever the socket takes,
# and a write buffer of tens of MiB stalled the loop (raft.appends._flush_sends)
TRANSFER_BUFFERED_MAX = 4 * 1024 * 1024


# after a chunk could not be read (the dump or a live entry), the follower's transfer starts
# again this much later: not in the same send round, where it would fail the same way
TRANSFER_RETRY_S = 1.0


class TransferFailed(Exception):
    """A snapshot chunk for `node` could not be read (logged): the send round goes on without
    that follower (raft.appends), which gets a new transfer after TRANSFER_RETRY_S."""

    def __init__(self, node: Any) -> None:
        super().__init__(f"snapshot transfer to {node} failed")
        self.node = node


def send_buffered(transport: Any, node: Any) -> int:
    """Bytes queued on `transport`'s connection to `node` and not yet taken by the socket (0
    for a transport without such connections: the simulator's network)."""
    connection = getattr(transport, "_connections", {}).get(node)
    return int(connection.getSendBufferSize()) if connection is not None else 0


class TransferStream:
    """File-like (`read(size)`): the dump, then the live entries it names below its log."""

    def __init__(self, dump_path: Path, journal: DurableFileJournal | None) -> None:
        self._file: IO[bytes] = open(dump_path, "rb")  # noqa: SIM115 (closed by read at the end)
        live, below = journal.snapshot_live if journal is not None else ((), 0)
        self._chunks = self._trailer(journal, [i for i in live if i < below])
        self._pending = b""

    def _trailer(self, journal: DurableFileJournal | None, indexes: list[int]) -> Iterator[bytes]:
        if journal is None or not indexes:
            return
        yield storage.TRANSFER_HEADER
        offset = len(storage.TRANSFER_HEADER)
        for index in indexes:
            record = journal.read_record(index)
            if record is None:  # dropped by a newer snapshot: this transfer is abandoned
                raise EntryGoneError(index, "a newer snapshot dropped it while it was sent")
            data = storage.encode_record(offset, *record)
            offset += len(data)
            yield data

    def read(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at the end (the file is then closed)."""
        if not self._file.closed:
            data = self._file.read(size)
            if data:
                return data
            self._file.close()
        parts, got = [self._pending], len(self._pending)
        for chunk in self._chunks:
            parts.append(chunk)
            got += len(chunk)
            if got >= size:
                break
        joined = b"".join(parts)
        self._pending = joined[size:]
        return joined[:size]

    def close(self) -> None:
        """Close the dump file (an abandoned transfer)."""
        self._file.close()
