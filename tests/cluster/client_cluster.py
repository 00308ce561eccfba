"""Helpers for the client tests that share a cluster (imported by the test modules)."""

from __future__ import annotations

import fifo
from cluster.launcher import LocalCluster, running_nodes, wait_until

HEALTHY_WITHIN_S = 10.0  # a cluster a test left sound converges within this; else it is replaced


def on_latest_machine(cluster: LocalCluster) -> LocalCluster:
    """Wait until the cluster runs the newest machine version, then return it.

    A new cluster starts on machine v1 and its leader upgrades it once every node said what it
    supports; v1 refuses RenewLocks and Modify ("not a command of machine version 1") and takes
    a NodeDown's messages back at once, so a test that ran before the upgrade (the first one of
    a worker, on a loaded machine) failed."""
    with cluster.client() as client:
        wait_until(
            lambda: client.machine()["effective_version"] == fifo.LATEST_VERSION,
            30.0,
            f"machine version {fifo.LATEST_VERSION}",
        )
    return cluster


def is_healthy(cluster: LocalCluster) -> bool:
    """Every configured node runs and, within HEALTHY_WITHIN_S, all answer with one leader,
    serve reads and have equal applied indexes and digests."""
    if len(running_nodes(cluster.config)) != len(cluster.config.nodes):
        return False
    try:
        cluster.converged(HEALTHY_WITHIN_S)
    except AssertionError:
        return False
    return True
