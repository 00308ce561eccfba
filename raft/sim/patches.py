"""Every injection point of the simulator, applied only inside `simulated()` and undone after.

The real node code reads time and randomness through module globals; inside a simulation they
answer from the virtual clock and the seeded generator instead:
- `pysyncobj.syncobj.monotonicTime`, `monotonic_time` in `raft.node`, `raft.appends`,
  `raft.elections`, `raft.node_status` and `raft.transport` (Raft's timers) and the `time` module
  as `raft.node`, its parts `raft.node_base` and `raft.node_status`, `raft.batcher` and
  `raft.durability`, `raft.retention`, `raft.replica` and `raft.machine_clock` see it
  (submitter clocks, proposal timeouts, disk probes, the pace of segment rewrites, the drained
  body cache's check), and as
  `cluster.node.timers` and `cluster.node.server` see it (the leader timers and the connection
  reconciliation that `raft.sim.session` runs);
- `raft.batcher._Batch` (its `submitted_s` default was bound to `time.monotonic` at import);
- `pysyncobj.syncobj.random` (election timeouts);
- `raft.durability.DurableFileJournal.deleteEntriesFrom` is wrapped: a cut of the log at or
  below its node's commit index is recorded in `CUTS_BELOW_COMMIT` (Raft never removes a
  committed entry; pysyncobj's cut after every AppendEntries did, for a moment, before its fix);
- `pysyncobj.node.Node.__hash__` and `raft.settings.DialedTCPNode.__hash__` (a peer's, cached):
  pysyncobj iterates sets of nodes (sending, counting votes); with str hashing their order
  changed with PYTHONHASHSEED, so a seed replayed only in the same process; a CRC of the id
  makes the order the same in every process;
- `raft.node._LoopQuorumTransport` and `raft.node.transport_name`: the node builds a
  `raft.sim.network.SimTransport` instead of its TCP transport;
- `raft.durability.DurableFileJournal._note_synced` (the power-loss layer) records the synced
  length in `SYNCED` instead of a marker file per fsync; a crash writes the marker from it and
  `raft.storage.power_loss` drops what was not fsynced;
- `raft.snapshot_hooks.SNAPSHOT_IN_CHILD` is False: a snapshot is encoded, retained and renamed
  inside the tick (a forked child and a thread would make a run depend on real time);
- structlog and the logging module (pysyncobj's warnings) are quiet (the nodes log every
  election; a campaign would print millions of lines).
No file of `raft/` or `cluster/` is edited: this module is the whole seam.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import types
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pysyncobj.node as pysyncobj_node
import pysyncobj.syncobj as pysyncobj_syncobj
import structlog

import cluster.node.server
import cluster.node.timers
import raft.appends
import raft.batcher
import raft.durability
import raft.elections
import raft.machine_clock
import raft.node
import raft.node_base
import raft.node_status
import raft.replica
import raft.retention
import raft.settings
import raft.snapshot_hooks
import raft.transport
from raft.sim.network import SimTransport

# the virtual clock's wall-clock epoch (what `time.time()` answers at virtual time 0)
EPOCH_S = 1_790_000_000.0


def _time_module(clock: Callable[[], float]) -> types.SimpleNamespace:
    """A stand-in for the `time` module whose clocks are virtual."""
    return types.SimpleNamespace(
        time=lambda: EPOCH_S + clock(),
        monotonic=clock,
        perf_counter=time.perf_counter,  # only for the node's own metrics, never decisions
        sleep=_no_sleep,
    )


_NODE_HASHES: dict[str, int] = {}  # a node id's CRC (pysyncobj hashes nodes ~700 times a sim s)
_NODE_HASHES_MAX = 10_000


def _stable_node_hash(node: Any) -> int:
    node_id = str(node.id)
    value = _NODE_HASHES.get(node_id)
    if value is None:
        if len(_NODE_HASHES) >= _NODE_HASHES_MAX:
            _NODE_HASHES.clear()
        value = _NODE_HASHES[node_id] = zlib.crc32(node_id.encode())
    return value


def _no_sleep(_seconds: float) -> None:
    raise RuntimeError("a simulated node must never sleep")


# journal path -> bytes of it on stable storage (the simulated disk's fsync record)
SYNCED: dict[str, int] = {}


# journal path -> what the fsync before the last one had made stable (a lying last fsync)
SYNCED_BEFORE: dict[str, int] = {}


def _note_synced(journal: Any) -> None:
    path = str(journal.path)
    SYNCED_BEFORE[path] = SYNCED.get(path, 0)
    SYNCED[path] = int(journal._end)


# journal path -> the RaftNode writing it (set by raft.sim.cluster when it starts a node)
JOURNAL_OWNERS: dict[str, Any] = {}
# what the wrapped deleteEntriesFrom saw: a cut of committed entries (a checker failure)
CUTS_BELOW_COMMIT: list[str] = []
_delete_entries_from = raft.durability.DurableFileJournal.deleteEntriesFrom


def _checked_delete_entries_from(journal: Any, entry_from: int) -> None:
    owner = JOURNAL_OWNERS.get(str(journal.path))
    if owner is not None and 0 <= entry_from < len(journal._indexes):
        first_cut, commit = int(journal._indexes[entry_from]), int(owner.raftCommitIndex)
        if first_cut <= commit:
            CUTS_BELOW_COMMIT.append(
                f"{owner.settings.node_id} cut its log from index {first_cut}, at or below "
                f"its commit index {commit}"
            )
    _delete_entries_from(journal, entry_from)


def _virtual_batch(clock: Callable[[], float]) -> type:
    base: Any = raft.batcher._Batch

    @dataclass
    class VirtualBatch(base):  # type: ignore[misc]
        submitted_s: float = field(default_factory=clock)

    return VirtualBatch


@contextlib.contextmanager
def simulated(clock: Callable[[], float], rng: random.Random) -> Iterator[None]:
    """Inside: the node code runs on `clock` and `rng`, over the simulated transport."""
    clock_time = _time_module(clock)
    replacements: list[tuple[Any, str, Any]] = [
        (pysyncobj_syncobj, "monotonicTime", clock),
        (pysyncobj_syncobj, "random", rng),
        (raft.node, "monotonic_time", clock),
        (raft.node, "time", clock_time),
        (raft.node, "_LoopQuorumTransport", SimTransport),
        (raft.node, "transport_name", lambda: "quorumq"),
        (raft.snapshot_hooks, "SNAPSHOT_IN_CHILD", False),
        (raft.appends, "monotonic_time", clock),
        (raft.snapshot_hooks, "monotonic_time", clock),
        (raft.elections, "monotonic_time", clock),
        (raft.node_status, "monotonic_time", clock),
        (raft.node_status, "time", clock_time),
        (raft.node_base, "time", clock_time),
        (raft.transport, "monotonic_time", clock),
        (raft.batcher, "time", clock_time),
        (raft.batcher, "_Batch", _virtual_batch(clock)),
        (raft.durability, "time", clock_time),
        (raft.retention, "time", clock_time),
        (raft.replica, "time", clock_time),
        (raft.machine_clock, "time", clock_time),
        (cluster.node.timers, "time", clock_time),
        (cluster.node.server, "time", clock_time),
        (raft.durability.DurableFileJournal, "_note_synced", _note_synced),
        (pysyncobj_node.Node, "__hash__", _stable_node_hash),
        (raft.settings.DialedTCPNode, "__hash__", _stable_node_hash),
        (raft.durability.DurableFileJournal, "deleteEntriesFrom", _checked_delete_entries_from),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in replacements]
    structlog_before = structlog.get_config()
    logging_before = logging.root.manager.disable
    try:
        for module, name, value in replacements:
            setattr(module, name, value)
        SYNCED.clear()
        SYNCED_BEFORE.clear()
        JOURNAL_OWNERS.clear()
        CUTS_BELOW_COMMIT.clear()
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
        logging.disable(logging.CRITICAL)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        SYNCED.clear()
        SYNCED_BEFORE.clear()
        JOURNAL_OWNERS.clear()
        CUTS_BELOW_COMMIT.clear()
        structlog.configure(**structlog_before)
        logging.disable(logging_before)
