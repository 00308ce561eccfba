"""Fixtures starting real node processes (helpers live in `cluster.launcher`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster, start_cluster
from tests.cluster.client_cluster import is_healthy
from tests.cluster.shells import Shells


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    """A fresh 3-node cluster with a leader, stopped after the test."""
    cluster = start_cluster(tmp_path / "D", nodes=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def shared_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 3-node cluster shared by the tests of one module (tests must not kill its nodes)."""
    cluster = start_cluster(tmp_path_factory.mktemp("shared") / "D", nodes=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def _reused_cluster_slot() -> Iterator[list[LocalCluster]]:
    """The cluster `reused_cluster3` hands out in one module (none yet, or one), stopped at the
    end of the module."""
    slot: list[LocalCluster] = []
    try:
        yield slot
    finally:
        for cluster in slot:
            cluster.stop()


@pytest.fixture
def reused_cluster3(
    _reused_cluster_slot: list[LocalCluster], tmp_path_factory: pytest.TempPathFactory
) -> LocalCluster:
    """A 3-node cluster reused by the tests of one module, checked before each test: every node
    runs, answers, follows one leader, serves reads and has the same digest (`is_healthy`). One
    that a test left broken (a node killed and not restarted, no leader) is stopped and a fresh
    one started, so a broken cluster never fails the next test. For tests that use their own
    queue names and need no fresh node state (node.log, connection numbers, machine version)."""
    slot = _reused_cluster_slot
    if slot and not is_healthy(slot[0]):
        slot.pop().stop()
    if not slot:
        slot.append(start_cluster(tmp_path_factory.mktemp("reused") / "D", nodes=3))
    return slot[0]


@pytest.fixture(params=["threaded", "asyncio"])
def shells(request: pytest.FixtureRequest) -> Iterator[Shells]:
    """Client factories of one shell kind: each client test runs against both shells."""
    opened = Shells(request.param)
    try:
        yield opened
    finally:
        opened.close()


def quorumq_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the `quorumq` CLI in a subprocess (text output captured, 120 s at most)."""
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """3 nodes started by `quorumq cluster start --tls`, stopped by `cluster stop` (one per
    test module)."""
    data_dir = tmp_path_factory.mktemp("tls") / "D"
    started = quorumq_cli("cluster", "start", "--nodes", "3", "--data-dir", str(data_dir), "--tls")
    assert started.returncode == 0, started.stderr
    assert "TLS: on for peer and client traffic" in started.stdout
    try:
        yield LocalCluster(data_dir)
    finally:
        stopped = quorumq_cli("cluster", "stop", "--data-dir", str(data_dir))
        assert stopped.returncode == 0, stopped.stderr
