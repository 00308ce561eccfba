"""Acceptance 2 of issue 14 against real node processes: a stranger at a node's raft port (a
pickle that would create a file, garbage, an oversized length, a 2^31 prefix then endless zeros)
gets nothing unpickled, the cluster keeps its leader and term and serves, and node.log has one
line per connection.

The issue's attack at every node at once while the leader commits runs here, against node
processes, not in the test process: there three attacker threads and three nodes shared one GIL,
and the leader was lost to the interpreter, not to the transport (issue 34)."""

from __future__ import annotations

import contextlib
import json
import pickle
import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import LocalCluster, init_cluster, start_cluster, wait_until
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
        wait_until(lambda: len(_refusals(log_file)) >= len(attempts), 10, "the refusals logged")
        assert len(_refusals(log_file)) == len(attempts)
    assert not marker.exists()


def _attack(address: str, stop: threading.Event, sent: list[int]) -> None:
    """Dial `address` again and again: a 2^31 length prefix, then zeros until refused."""
    host, port = address.rsplit(":", 1)
    zeros = b"\0" * 65536
    while not stop.is_set():
        try:
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(struct.pack("<I", 2**31))
                while not stop.is_set():
                    sock.sendall(zeros)
                    sent[0] += len(zeros)
        except OSError:  # refused and closed: dial again, without spinning on a dead port
            stop.wait(0.01)


@pytest.mark.timeout(120)
def test_the_issue_attack_at_every_node_neither_stalls_the_leader_nor_changes_the_term(
    tmp_path: Path,
) -> None:
    """A 2^31 length prefix, then zeros without end, at every node's raft port at once while
    the leader commits 60 batches: every commit is confirmed, the leader and every node's term
    stay as they were, and each refused connection is one log line."""
    with start_cluster(tmp_path / "D", nodes=3) as cluster:
        leader = cluster.leader()
        client = cluster.raw_client(leader)
        client.command(DeclareQueue("q"))
        terms = {n: s["term"] for n, s in cluster.statuses().items() if s is not None}
        assert len(terms) == 3
        stop, sent = threading.Event(), [0]
        attackers = [
            threading.Thread(
                target=_attack, args=(node.raft_address, stop, sent), name=f"attack-{node.id}"
            )
            for node in cluster.config.nodes
        ]
        for thread in attackers:
            thread.start()
        try:
            for i in range(60):  # ~3 s of commits under attack
                assert client.command(Enqueue("q", b"under-attack-%d" % i)) == Ok()
                time.sleep(0.05)  # pacing, not waiting for anything
        finally:
            stop.set()
            for thread in attackers:
                thread.join()
        client.close()
        assert cluster.leader() == leader
        assert {n: s["term"] for n, s in cluster.statuses().items() if s is not None} == terms
        refused = [r for n in cluster.config.nodes for r in _refusals(n.data_dir / "node.log")]
        assert refused and all(r["reason"] == "not the quorumq raft protocol" for r in refused)
        assert len(refused) < max(2, sent[0] // 1000)  # once per connection, not per chunk
