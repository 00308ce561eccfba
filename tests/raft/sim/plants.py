"""Known, fixed replication bugs planted back (test-only): each a context manager that undoes
one fix while it is active, so a campaign can be shown to find it (issue 26, acceptance 1)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import raft.metadata
from fifo.commands import ConnectionDown, ConnectionId
from raft.node import RaftNode


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


PLANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "late_append_truncation": late_append_truncation,
    "snapshot_chunk_commit": snapshot_chunk_commit,
    "hello_order": hello_order,
}
