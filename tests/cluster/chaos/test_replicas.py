"""The replica check reads every node's own replica, not the leader's through a redirect."""

from __future__ import annotations

from cluster.chaos.replicas import check_replicas
from cluster.launcher import LocalCluster


class _Nodes:
    """The `Replicas` view of a LocalCluster."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.key = cluster.key
        self.tls = cluster.tls
        self._cluster = cluster

    def endpoints(self) -> dict[str, str]:
        return dict(self._cluster.config.endpoints())


def test_each_node_answers_for_itself(shared_cluster3: LocalCluster) -> None:
    with shared_cluster3.client() as client:
        client.declare_queue("replica-check")
    check = check_replicas(_Nodes(shared_cluster3), ("replica-check",))
    assert check.ok, check.to_dict()
    answered = {node: row["status"].get("id") for node, row in check.per_node.items()}
    assert answered == {node: node for node in shared_cluster3.config.endpoints()}
    roles = sorted(row["status"].get("role") for row in check.per_node.values())
    assert roles == ["follower", "follower", "leader"]
