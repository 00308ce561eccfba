"""Known, fixed replication bugs planted back (test-only): each a context manager that undoes
one fix while it is active, so a campaign can be shown to find it (issue 26, acceptance 1)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import cluster.node.server
import cluster.node.timers
import raft.batcher
import raft.metadata
import raft.safe_pickle
from fifo.commands import ConnectionDown, ConnectionId, NodeUp
from raft.node import RaftNode
from raft.syncobj_adapter import SyncObjAdapter


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def late_append_truncation() -> contextlib.AbstractContextManager[None]:
    """fd18293 undone: a follower cuts its log after prevLogIdx on every AppendEntries
    (pysyncobj's own behaviour), so a late or repeated one removes acknowledged entries."""

    def keep_message(_self: RaftNode, _node: Any, message: dict[str, Any]) -> dict[str, Any]:
        return message

    return _replaced(RaftNode, "_trim_present_entries", keep_message)


def snapshot_chunk_commit() -> contextlib.AbstractContextManager[None]:
    """e935894 undone: a snapshot chunk advances the follower's commit index over its own
    unverified entries (pysyncobj's min(leader commit, own last index))."""

    def keep_message(_self: RaftNode, message: dict[str, Any]) -> dict[str, Any]:
        return message

    return _replaced(RaftNode, "_without_commit_advance", keep_message)


def hello_order() -> contextlib.AbstractContextManager[None]:
    """10fd374 undone: a hello closes the node's stale connections in the dict's order (the
    order a replica first saw them; a replica restored from a snapshot has them sorted)."""

    def in_dict_order(meta: Any, node: str, incarnation: int) -> list[ConnectionDown]:
        return [
            ConnectionDown(ConnectionId(node, inc, num), "normal")
            for inc, num in meta.connections.get(node, {})
            if inc != incarnation
        ]

    return _replaced(raft.metadata, "stale_connection_downs", in_dict_order)


def empty_snapshot_chunk() -> contextlib.AbstractContextManager[None]:
    """The allow-list without `bytes` (the state before issue 17's fix): the empty last chunk of
    every snapshot pysyncobj sends, pickled as `bytes()`, is refused and its connection
    dropped, so a follower behind the leader's compaction never catches up (pysyncobj wire)."""
    without_bytes = frozenset(
        name for name in raft.safe_pickle.ALLOWED_GLOBALS if name[1] != "bytes"
    )
    return _replaced(raft.safe_pickle, "ALLOWED_GLOBALS", without_bytes)


def dropped_connection_down() -> contextlib.AbstractContextManager[None]:
    """e05d856 undone: a closed session's ConnectionDown is submitted once and never again,
    so one that failed (no quorum) or was never sent (the connection not listed yet) leaves
    its consumer's checked-out messages stuck until the node restarts."""

    def never(_server: Any) -> None:
        return None

    return _replaced(cluster.node.server.NodeServer, "_reconcile_connections", never)


def leader_own_node_up() -> contextlib.AbstractContextManager[None]:
    """a75f9c3 undone: a leader listed down (an earlier leader committed NodeDown for it) never
    commits NodeUp for itself; no peer would, so its consumers stay suspected."""
    original = cluster.node.timers.TimerPlan._node_changes

    def without_own(plan: Any, now_s: float, view: Any) -> list[Any]:
        changes = original(plan, now_s, view)
        return [c for c in changes if not (isinstance(c, NodeUp) and c.node == view.me)]

    return _replaced(cluster.node.timers.TimerPlan, "_node_changes", without_own)


def snapshot_orphans_proposals() -> contextlib.AbstractContextManager[None]:
    """The snapshot-load fix undone: commands waiting for the commit of indexes a loaded
    snapshot covers stay waiting (pysyncobj answers only as it applies an index), until the
    committer's 10 s sweep (seed 367 of the 10,000-seed campaign)."""

    def fail_none(_self: SyncObjAdapter, _index: int) -> int:
        return 0

    return _replaced(SyncObjAdapter, "fail_commits_covered", fail_none)


def stuck_entries_hold_commands() -> contextlib.AbstractContextManager[None]:
    """The committer's stuck_s undone: entries in flight that will never be answered (a lost
    forward reply, an orphaned proposal) hold every new command of the node until the sweep."""
    return _replaced(raft.batcher, "STUCK_S_DEFAULT", 1e9)


PLANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "late_append_truncation": late_append_truncation,
    "snapshot_chunk_commit": snapshot_chunk_commit,
    "hello_order": hello_order,
    "empty_snapshot_chunk": empty_snapshot_chunk,
    "dropped_connection_down": dropped_connection_down,
    "leader_own_node_up": leader_own_node_up,
    "snapshot_orphans_proposals": snapshot_orphans_proposals,
    "stuck_entries_hold_commands": stuck_entries_hold_commands,
}
