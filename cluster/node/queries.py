"""Read-only queries answered from this node's local state (possibly stale on a follower)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import fifo
from fifo.bodies import BodyMissingError
from fifo.queries import MessageInfo
from raft.replica import Replica, ReplicaView

# a query runs on the node's event loop: its size bounds how long it holds every client
MESSAGES_LIMIT_MAX = 10_000
GROUPS_LIMIT_MAX = 100_000  # `queue groups --limit` allows as many


class QueryError(Exception):
    """Raised for an unknown query or bad arguments; answered with a `bad_request` error."""


def plain(value: Any) -> Any:
    """Turn dataclasses, tuples and the like into CBOR-able maps, lists, str, int, bytes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"type": type(value).__name__}
        out.update({f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)})
        return out
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _queue_arg(args: dict[str, Any]) -> str:
    queue = args.get("queue")
    if not isinstance(queue, str):
        raise QueryError("argument 'queue' (a string) is required")
    return queue


def _limit_arg(args: dict[str, Any], default: int, maximum: int) -> int:
    limit = args.get("limit", default)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= maximum:
        raise QueryError(f"argument 'limit' must be an integer in 0..{maximum}")
    return limit


def run_query(
    replica: Replica,
    name: str,
    args: dict[str, Any],
    extra: dict[str, Any],
    member_endpoints: dict[str, str] | None = None,
) -> Any:
    """Answer query `name`; `extra` is merged into the status map (address, pid, ...);
    `member_endpoints` (node id -> client address, the replicated member set's) gives the
    status map's `leader_address` (None when there is no leader or its address is unknown)."""
    if name == "status":
        # `digest`: true computes the digest whatever the state's size (it stalls the node)
        bounded = args.get("digest") is not True
        status = {**extra, **replica.status(bounded=bounded), "pid": os.getpid()}
        leader = status.get("leader")
        addresses = member_endpoints or {}
        status["leader_address"] = addresses.get(leader) if isinstance(leader, str) else None
        return status
    supported = replica.settings.supported_version
    if name == "messages":  # bodies are read back after the read, outside the replica's lock
        limit = _limit_arg(args, 100, MESSAGES_LIMIT_MAX)
        queue = _queue_arg(args)
        found = replica.read(lambda view: fifo.messages(view.state, queue, limit))
        try:
            return plain(with_bodies(replica, found))
        except BodyMissingError as err:
            raise QueryError(str(err)) from err
    return replica.read(lambda view: _answer(view, name, args, supported))


def with_bodies(replica: Replica, found: list[MessageInfo]) -> list[MessageInfo]:
    """Peeked messages with the bodies machine v4 keeps in the log read back (cache, else the
    journal, on the loop: a peek is an admin read bounded by MESSAGES_LIMIT_MAX, never a
    delivery); BodyMissingError names a body the log no longer holds."""
    out: list[MessageInfo] = []
    for info in found:
        if info.body_ref is not None:
            info = dataclasses.replace(info, body=replica.read_body(info.body_ref))
        out.append(info)
    return out


def _answer(view: ReplicaView, name: str, args: dict[str, Any], supported: int) -> Any:
    state = view.state
    if name == "queues":
        return list(fifo.list_queues(state))
    if name == "overview":
        if "queue" not in args:
            return [plain(fifo.overview(state, queue)) for queue in fifo.list_queues(state)]
        return plain(fifo.overview(state, _queue_arg(args)))
    if name == "consumers":
        queues = [_queue_arg(args)] if "queue" in args else list(fifo.list_queues(state))
        return {queue: plain(fifo.consumers(state, queue)) for queue in queues}
    if name == "groups":  # machine v3 message groups
        limit = _limit_arg(args, 1000, GROUPS_LIMIT_MAX)
        return plain(fifo.groups(state, _queue_arg(args), limit))
    if name == "consumer_groups":  # machine v3 consumer groups
        return plain(fifo.consumer_groups(state))
    if name == "consumer_group":
        group = args.get("group")
        if not isinstance(group, str):
            raise QueryError("argument 'group' (a string) is required")
        return plain(fifo.consumer_group(state, group))
    if name == "partitions":
        return fifo.partition_count(state, _queue_arg(args))
    if name == "group_config":  # machine v3 message groups: policy and key (None: not grouped)
        return plain(fifo.group_config(state, _queue_arg(args)))
    if name == "machine":
        return machine_status(view, supported)
    raise QueryError(f"unknown query {name!r}")


def machine_status(view: ReplicaView, supported: int) -> dict[str, Any]:
    """Effective version, every member's supported version, and the index of every switch."""
    meta = view.meta
    return {
        "effective_version": meta.effective_version,
        "supported": dict(sorted(meta.supported.items())),
        "members": list(meta.members),
        "switches": [{"index": i, "version": v} for i, v in meta.switches],
        "refused": dict(sorted(meta.refused.items())),
        "upgrade_target": view.upgrade_target(),
        "this_node_supports": supported,
    }
