"""Fixtures starting real node processes (helpers live in `cluster.launcher`)."""

from __future__ import annotations

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
