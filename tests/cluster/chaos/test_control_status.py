"""Harness gaps of issue 24: status checks of a starting node, power loss, clients after a
replacement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import launcher
from cluster.chaos import run as run_module
from cluster.chaos.control import LauncherCluster
from cluster.chaos.workload import WorkloadParams
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


def test_power_loss_drops_everything_written_since_the_last_fsync_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's harness gap: whatever the seed, the journal is cut back to its synced length
    (before, a seeded prefix of the unsynced bytes survived one time in three)."""
    launcher.init_cluster(tmp_path / "D", 3)
    cluster = LauncherCluster(tmp_path / "D")
    monkeypatch.setattr(cluster, "kill", lambda node: None)
    journal = cluster.node("n1").data_dir / "raft.journal"
    journal.parent.mkdir(parents=True, exist_ok=True)
    for seed in range(12):
        journal.write_bytes(b"x" * 1000)
        journal.with_name("raft.journal.synced").write_text("600\n")
        assert cluster.lose_power("n1", seed) == "n1: kept 600 of 1000 journal bytes (600 synced)"
        assert journal.stat().st_size == 600


def test_workload_clients_made_after_a_replacement_know_the_new_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's harness gap: the client factory read the endpoints once, so once every
    original node was replaced no new client could reach the cluster."""
    launcher.init_cluster(tmp_path / "D", 3)
    cluster = LauncherCluster(tmp_path / "D")
    made: list[list[str]] = []
    monkeypatch.setattr(run_module, "Client", lambda endpoints, *_a, **_k: made.append(endpoints))
    make = run_module._client_factory(cluster, WorkloadParams())
    make("before")
    replaced = {**cluster.endpoints(), "n4": "127.0.0.1:1"}
    del replaced["n1"]
    monkeypatch.setattr(cluster, "endpoints", lambda: replaced)
    make("after")
    assert "127.0.0.1:1" not in made[0]
    assert sorted(made[1]) == sorted(replaced.values())
