"""`reused_cluster3` hands no test a cluster that an earlier test broke: a killed node makes
`is_healthy` false, and the next test of the module gets a fresh, healthy cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.launcher import LocalCluster
from tests.cluster.client_cluster import is_healthy

pytestmark = pytest.mark.cluster

BROKEN: list[Path] = []  # the data dir of the cluster the first test broke (tests run in order)


def test_a_killed_node_makes_the_reused_cluster_unhealthy(reused_cluster3: LocalCluster) -> None:
    """Healthy as handed out; not once a follower is killed (and left dead)."""
    assert is_healthy(reused_cluster3)
    reused_cluster3.kill(reused_cluster3.followers()[0])
    assert not is_healthy(reused_cluster3)
    BROKEN.append(reused_cluster3.data_dir)


def test_the_next_test_gets_a_fresh_healthy_cluster(reused_cluster3: LocalCluster) -> None:
    """The broken cluster was replaced: another data dir, every node up and converged."""
    assert BROKEN, "run the whole module: the test above breaks the cluster this one checks"
    assert reused_cluster3.data_dir != BROKEN[0]
    assert is_healthy(reused_cluster3)
