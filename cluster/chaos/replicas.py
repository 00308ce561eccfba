"""After the drain: every replica's digest equal at the same applied index, every queue empty.

Each node answers queries from its own replica, so one client per node (no reconnect, no move
to the leader, stale reads allowed) sees that replica; a node that answers with another node's
id is an error, not a replica. Applied indexes move while the leader commits housekeeping
entries, so the check polls until every node reports the same applied index and compares the
digests of that moment.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from cluster import protocol
from cluster.client import Client
from cluster.client.errors import ClusterError

CONVERGE_TIMEOUT_S = 30.0
POLL_S = 0.3
# Status keys that may hold the applied index, in order of preference (node status map).
APPLIED_KEYS = ("applied_index", "last_applied", "applied", "raft_last_applied")


class Replicas(Protocol):
    """What the check needs: node ids, their client endpoints, the client key and the client
    TLS context (None: plaintext)."""

    key: bytes
    tls: ssl.SSLContext | None

    def endpoints(self) -> dict[str, str]:
        """Client endpoints by node id."""
        ...


@dataclass(slots=True)
class ReplicaCheck:
    """The outcome of the replica checks."""

    digests_equal: bool = False
    applied_index: int | None = None
    queues_empty: bool = False
    per_node: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Both checks passed."""
        return self.digests_equal and self.queues_empty

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "digests_equal": self.digests_equal,
            "applied_index": self.applied_index,
            "queues_empty_on_every_replica": self.queues_empty,
            "per_node": self.per_node,
            "errors": self.errors,
        }


def applied_index(status: dict[str, Any]) -> int | None:
    """The applied index of a node status map (None when it has none)."""
    for key in APPLIED_KEYS:
        value = status.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def queue_total(overview: Any) -> int | None:
    """Messages still in a queue (ready + returned + checked out) from its overview."""
    if not isinstance(overview, dict):
        return None
    if isinstance(overview.get("total"), int):
        return int(overview["total"])
    parts = [overview.get(k) for k in ("ready", "returned", "checked_out")]
    if all(isinstance(p, int) for p in parts):
        return sum(int(p) for p in parts if isinstance(p, int))
    return None


def check_replicas(
    cluster: Replicas, queues: tuple[str, ...], timeout_s: float = CONVERGE_TIMEOUT_S
) -> ReplicaCheck:
    """Poll every node until the applied indexes agree, then compare digests and queues."""
    result = ReplicaCheck()
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = _snapshot(cluster, queues, result)
        indexes = {applied_index(s["status"]) for s in snapshot.values()}
        converged = len(snapshot) == len(cluster.endpoints()) and len(indexes) == 1
        if converged or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    result.per_node = snapshot
    digests = {s["status"].get("digest") for s in snapshot.values()}
    result.applied_index = indexes.pop() if converged else None
    result.digests_equal = converged and len(digests) == 1 and None not in digests
    result.queues_empty = len(snapshot) == len(cluster.endpoints()) and all(
        total == 0 for s in snapshot.values() for total in s["queue_totals"].values()
    )
    return result


def _snapshot(
    cluster: Replicas, queues: tuple[str, ...], result: ReplicaCheck
) -> dict[str, dict[str, Any]]:
    """Status and queue totals of every reachable node, each from its own replica."""
    snapshot: dict[str, dict[str, Any]] = {}
    for node_id, endpoint in cluster.endpoints().items():
        try:
            with Client(
                [endpoint],
                cluster.key,
                name=f"chaos-check-{node_id}",
                tls=cluster.tls,
                reconnect=False,
                prefer_leader=False,
                request_timeout_s=5.0,
            ) as client:
                status = dict(client.status())
                totals = {
                    queue: queue_total(
                        client.query("overview", {"queue": queue, protocol.STALE_OK: True})
                    )
                    for queue in queues
                }
        except (ClusterError, OSError) as err:
            if len(result.errors) < 20:
                result.errors.append(f"{node_id}: {type(err).__name__}: {err}")
            continue
        if status.get("id") != node_id:
            if len(result.errors) < 20:
                result.errors.append(f"{node_id}: answered as {status.get('id')!r}")
            continue
        snapshot[node_id] = {
            "status": status,
            "applied_index": applied_index(status),
            "digest": status.get("digest"),
            "queue_totals": totals,
        }
    return snapshot
