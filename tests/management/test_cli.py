"""`quorumq cluster start --http-base-port` prints each node's management URL and the node
serves the UI there; a taken http_port is a clear error (exit 69), not a node without its API."""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import config as cluster_config
from cluster.launcher import init_cluster
from tests.management.helpers import http

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def quorumq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_cluster_start_prints_the_management_urls_and_they_serve_the_ui(tmp_path: Path) -> None:
    """One node, free http port: the printed URL answers the UI page and, with the client key,
    the API; `cluster stop` stops it."""
    data_dir = str(tmp_path / "D")
    started = quorumq("cluster", "start", "--nodes", "1", "--data-dir", data_dir,
                      "--http-base-port", "0")  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        found = re.search(r"management: (http://127\.0\.0\.1:\d+/) \(user admin", started.stdout)
        assert found is not None, started.stdout
        status, page, _ = http(found.group(1))
        assert status == 200 and "/static/app.js" in page
        key = (tmp_path / "D" / "client.key").read_text().strip()
        status, overview, _ = http(found.group(1) + "api/overview", auth=("admin", key))
        assert (status, [n["id"] for n in overview["nodes"]]) == (200, ["n1"])
    finally:
        assert quorumq("cluster", "stop", "--data-dir", data_dir).returncode == 0


def test_a_taken_http_port_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    data_dir = tmp_path / "D"
    config = init_cluster(data_dir, 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = dataclasses.replace(config.nodes[0], http_port=port)
        cluster_config.write(data_dir, dataclasses.replace(config, nodes=(node,)))
        command = [sys.executable, "-m", "cluster.node", "--data-dir", str(data_dir),
                   "--node-id", node.id]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 69, done.stderr
    assert f"cannot serve the management API on 127.0.0.1:{port}" in done.stderr
