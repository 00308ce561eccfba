"""amqps: a `cluster start --tls` cluster serves AMQP over TLS (its node certificates), prints
the amqps ports, and a plaintext AMQP client gets nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher import LocalCluster
from tests.amqp.conftest import SLOW_MACHINE

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True, timeout=100
    )


def test_a_tls_cluster_speaks_amqps(tmp_path: Path) -> None:
    """pika with the cluster CA declares a queue over amqps; plaintext AMQP is not answered."""
    data_dir = tmp_path / "D"
    started = _cli("cluster", "start", "--nodes", "3", "--data-dir", str(data_dir), "--tls")
    assert started.returncode == 0, started.stderr
    try:
        cluster = LocalCluster(data_dir)
        ports = [node.amqp_port for node in cluster.config.nodes]
        assert f"amqps: 127.0.0.1:{ports[0]}" in started.stdout
        assert cluster.tls is not None
        params = pika.ConnectionParameters(
            "127.0.0.1", ports[0], ssl_options=pika.SSLOptions(cluster.tls, "127.0.0.1"),
            credentials=pika.PlainCredentials("quorumq", cluster.key.decode()), **SLOW_MACHINE,
        )  # fmt: skip
        connection = pika.BlockingConnection(params)
        declared = connection.channel().queue_declare("over-tls", durable=True)
        assert declared.method.queue == "over-tls"
        connection.close()
        with socket.create_connection(("127.0.0.1", ports[1]), timeout=5) as plain:
            plain.sendall(b"AMQP\x00\x00\x09\x01")
            plain.settimeout(5)
            try:
                answer = plain.recv(64)
            except (ConnectionError, TimeoutError):
                answer = b""
            assert not answer.startswith(b"\x01\x00\x00")  # no connection.start in the clear
    finally:
        stopped = _cli("cluster", "stop", "--data-dir", str(data_dir))
        assert stopped.returncode == 0, stopped.stderr
