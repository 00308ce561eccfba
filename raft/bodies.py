"""Message bodies read back from the log for machine v4's references (issue 32).

A v4 message keeps the meta index of its enqueuing command instead of its body; the node reads
the body back from that journal entry where it sends it. `BodyCache` keeps the recent bodies
(bounded by count and bytes, least recently used out first) and is touched only on the loop
thread; `read_entry_bodies` runs on a worker thread (a cold read never blocks the loop) and
returns every body of one entry, so draining a backlog costs one read per entry (up to 1024
group-committed publishes), not one per message.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from fifo.bodies import BodyMissingError, body_of_command, entry_index
from raft.entry import command_index, decode_entry
from raft.errors import EntryError, RaftError
from raft.fastcodec import decode_command

# Bodies kept in memory after they were read back or delivered. The cache holds what a consumer
# that lags behind its publishers needs next (the entries just behind the tail) and what one
# entry read brings in (up to 1024 bodies); bounded so it costs at most this much per node
# whatever the backlog: 16,384 bodies and 32 MiB (1 KiB bodies: 16 MiB).
BODY_CACHE_BODIES_MAX = 16_384
BODY_CACHE_BYTES_MAX = 32 * 1024 * 1024

ReadEntry = Callable[[int], bytes]  # raft index -> entry blob (RaftNode.read_entry)


class BodyCache:
    """Recent bodies by meta index; loop thread only (a worker never writes it)."""

    def __init__(
        self, bodies_max: int = BODY_CACHE_BODIES_MAX, bytes_max: int = BODY_CACHE_BYTES_MAX
    ) -> None:
        self.bodies_max = bodies_max
        self.bytes_max = bytes_max
        self._bodies: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._bodies)

    @property
    def bytes_held(self) -> int:
        """Bytes of the bodies held."""
        return self._bytes

    def get(self, ref: int) -> bytes | None:
        """The body at meta index `ref` if held (it becomes the most recently used)."""
        body = self._bodies.get(ref)
        if body is None:
            self.misses += 1
            return None
        self.hits += 1
        self._bodies.move_to_end(ref)
        return body

    def has(self, ref: int) -> bool:
        """Whether the body at `ref` is held (no effect on the order or the counters)."""
        return ref in self._bodies

    def put_all(self, bodies: dict[int, bytes]) -> None:
        """Keep `bodies`, dropping the least recently used past the limits."""
        for ref, body in bodies.items():
            old = self._bodies.pop(ref, None)
            if old is not None:
                self._bytes -= len(old)
            self._bodies[ref] = body
            self._bytes += len(body)
        while self._bodies and (
            len(self._bodies) > self.bodies_max or self._bytes > self.bytes_max
        ):
            _, dropped = self._bodies.popitem(last=False)
            self._bytes -= len(dropped)

    def clear(self) -> None:
        """Drop every body (a drained node: nothing left to deliver needs one)."""
        self._bodies = OrderedDict()
        self._bytes = 0

    def missing_entries(self, refs: Iterable[int]) -> list[int]:
        """The distinct raft indexes (in first-seen order) of the refs not held."""
        out: dict[int, None] = {}
        for ref in refs:
            if ref not in self._bodies:
                out[entry_index(ref)] = None
        return list(out)


def read_entry_bodies(read_entry: ReadEntry, raft_index: int) -> dict[int, bytes]:
    """Every body the entry at `raft_index` carries, by meta index (worker thread: no shared
    state). A gone or damaged entry raises BodyMissingError naming its first meta index."""
    try:
        entry = decode_entry(read_entry(raft_index))
    except (RaftError, EntryError) as err:
        raise BodyMissingError(command_index(raft_index, 0), str(err)) from err
    out: dict[int, bytes] = {}
    for position, blob in enumerate(entry.cmds):
        try:
            body = body_of_command(decode_command(blob))
        except Exception:  # an undecodable command was refused when applied: it has no body
            continue
        if body is not None:
            out[command_index(raft_index, position)] = body
    return out


def read_entries_bodies(
    read_entry: ReadEntry, raft_indexes: list[int]
) -> tuple[dict[int, bytes], dict[int, str]]:
    """The bodies of several entries, and why an entry could not be read (raft index -> why)."""
    bodies: dict[int, bytes] = {}
    failed: dict[int, str] = {}
    for raft_index in raft_indexes:
        try:
            bodies.update(read_entry_bodies(read_entry, raft_index))
        except BodyMissingError as err:
            failed[raft_index] = str(err)
    return bodies, failed
