"""What the management server needs from the node it runs in (implemented by NodeServer)."""

from __future__ import annotations

from typing import Any, Protocol

from cluster.config import ClusterConfig, NodeConfig
from cluster.node.effects import EffectRouter
from cluster.node.metrics import NoMetrics
from fifo.commands import ConnectionId
from raft.replica import Replica


class ManagedNode(Protocol):
    """The node's parts the API reads (replica, metrics, config) and acts through."""

    cluster: ClusterConfig
    node: NodeConfig
    node_id: str
    client_key: bytes
    metrics: NoMetrics
    router: EffectRouter
    replica: Replica

    def status_extra(self) -> dict[str, Any]:
        """Fields of the status map that the raft node does not know."""

    def unavailable_reason(self, for_read: bool) -> str | None:
        """Why this node refuses a command or a data query now, or None."""

    def new_connection(self) -> ConnectionId:
        """A fresh connection id owned by this node incarnation."""

    def client_connections(self) -> list[dict[str, Any]]:
        """The client connections this node serves now (id, peer address)."""
