"""Fixtures starting real node processes (helpers live in `cluster.launcher`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster, start_cluster
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
