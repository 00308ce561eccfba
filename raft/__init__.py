"""Replication over pysyncobj: log entries, the apply loop, snapshots, durability, versions.

Public surface: `RaftNode` / `RaftSettings` (the node), `Entry` and its codec, `ReplicatedState`
(fifo state + metadata, pure), `GroupCommitter` (batching client commands into entries).
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
