"""Acceptance 2 of issue 14 against real node processes: a stranger at a node's raft port (a
pickle that would create a file, garbage, an oversized length, a 2^31 prefix then endless zeros)
gets nothing unpickled, the cluster keeps its leader and term and serves, and node.log has one
line per connection."""

from __future__ import annotations

import contextlib
import json
import pickle
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import LocalCluster, init_cluster
from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import Ok

pytestmark = pytest.mark.cluster


def _refusals(log_file: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == "peer_refused"]


def test_strangers_at_the_raft_port_change_nothing_and_are_logged_once_each(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    payload = pickle.dumps(Exploit(), protocol=2)
    cfg = init_cluster(tmp_path / "D", nodes=3)
    with LocalCluster(tmp_path / "D", cfg) as cluster:
        for node in cfg.nodes:
            cluster.start_node(node.id)
        leader = cluster.leader()
        client = cluster.raw_client(leader)
        client.command(DeclareQueue("q"))
        term = client.query("status")["term"]
        host, port = cfg.node(leader).raft_address.rsplit(":", 1)
        attempts = [
            struct.pack("<i", len(payload)) + zlib.compress(payload),
            payload,
            b"\xff" * 4096,
            struct.pack(">I", 2**31 - 1) + b"\0" * 1000,
            None,  # a 2^31 length prefix, then zeros for 3 s
        ]
        for data in attempts:
            sock = socket.create_connection((host, int(port)), timeout=5)
            with contextlib.suppress(OSError):
                if data is not None:
                    sock.sendall(data)
                else:
                    sock.sendall(struct.pack("<I", 2**31))
                    ends = time.monotonic() + 3.0
                    while time.monotonic() < ends:
                        sock.sendall(b"\0" * 65536)
            sock.close()
        for i in range(20):
            assert client.command(Enqueue("q", b"after-%d" % i)) == Ok()
        status = client.query("status")
        assert status["role"] == "leader" and status["term"] == term
        client.close()
        log_file = tmp_path / "D" / leader / "node.log"
        time.sleep(0.5)
        assert len(_refusals(log_file)) == len(attempts)
    assert not marker.exists()
