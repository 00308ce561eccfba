"""Replication over pysyncobj: log entries, the apply loop, snapshots, durability, versions.

The node uses `raft.replica.Replica` (propose, applied effects, read-only views) and nothing
else; `Entry` and its codec are exported for tools that read or write logs (pipeline, export),
`ReplicatedState` (fifo state + metadata, pure) for replays.
"""

from raft.entry import SUB_INDEX_SPAN, Entry, command_index, decode_entry, encode_entry
from raft.replicated import InternalFailure, Metadata, Outcome, ReplicatedState

__all__ = [
    "SUB_INDEX_SPAN",
    "Entry",
    "InternalFailure",
    "Metadata",
    "Outcome",
    "ReplicatedState",
    "command_index",
    "decode_entry",
    "encode_entry",
]
