"""LauncherCluster's status checks: a handshake refused while a node starts is not an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import launcher
from cluster.chaos.control import LauncherCluster
from cluster.client.errors import AuthError
from cluster.config import NodeConfig


def test_a_transient_auth_error_reads_as_a_node_that_does_not_answer_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's harness gap: an AuthError from a node that is (re)starting made the nemesis
    record a fault error; now that node just has not answered yet, and answers next time."""
    launcher.init_cluster(tmp_path / "D", 3)
    cluster = LauncherCluster(tmp_path / "D")
    refused: set[str] = set()

    def node_status(node: NodeConfig, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        if node.id not in refused:
            refused.add(node.id)
            raise AuthError("authentication failed")
        return {"id": node.id, "leader": "n2"}

    monkeypatch.setattr(launcher, "node_status", node_status)
    assert cluster.leader() is None
    assert cluster.leader() == "n2"
