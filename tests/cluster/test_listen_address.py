"""A node binds the address its config names (not 127.0.0.1) and logs every listener it opens."""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import pytest

from cluster import config as cluster_config
from cluster.launcher import free_port_run, init_cluster, local_cluster, wait_until
from cluster.node.listening import listening_on

HOST = "127.0.0.2"  # a loopback address that is not 127.0.0.1 (Linux routes all of 127/8)


def _listening(node_log: Path) -> dict[str, str]:
    """listener -> address of the node's `listening` lines."""
    lines = [json.loads(line) for line in node_log.read_text().splitlines() if line.strip()]
    return {line["listener"]: line["address"] for line in lines if line["event"] == "listening"}


def _refused(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) != 0


def test_listening_on_reads_the_kernel_table_for_the_address_asked() -> None:
    """A socket listening on 127.0.0.2:P is found for 127.0.0.2, not for 127.0.0.1; a closed
    one is not found (how the peer port's line is checked, raft owning that socket); also
    once pysyncobj is imported (it replaces socket.inet_ntop by a Windows-only one)."""
    import pysyncobj.win_inet_pton  # noqa: F401  (what every node process imports)

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
        assert listening_on(port, HOST) == []  # bound, not listening
        sock.listen()
        assert listening_on(port, HOST) == [f"{HOST}:{port}"]
        assert listening_on(port, "127.0.0.1") == []
    assert listening_on(port, HOST) == []


@pytest.mark.cluster
def test_every_listener_binds_the_configured_address_and_says_so(tmp_path: Path) -> None:
    """A one-node TLS cluster on 127.0.0.2 with metrics and the HTTP API on: node.log has one
    `listening` line each for client, peer, AMQP, metrics and HTTP, all at 127.0.0.2, and the
    client port is not reachable at 127.0.0.1 (it is not bound to every interface)."""
    data_dir = tmp_path / "D"
    config = init_cluster(
        data_dir,
        1,
        host=HOST,
        tls=True,
        metrics_base_port=free_port_run(3, HOST),
        http_base_port=0,
    )
    config = dataclasses.replace(config, metrics_bind=HOST, http_bind=HOST)
    cluster_config.write(data_dir, config)
    node = config.nodes[0]
    with local_cluster(data_dir, 1):
        node_log = node.data_dir / "node.log"
        listeners = wait_until(
            lambda: found if len(found := _listening(node_log)) == 5 else None,
            30.0,
            "five listening lines",
        )
        assert listeners == {
            "client": f"{HOST}:{node.client_port}",
            "peer": f"{HOST}:{node.raft_port}",
            "amqp": f"{HOST}:{node.amqp_port}",
            "metrics": f"{HOST}:{node.metrics_port}",
            "http": f"{HOST}:{node.http_port}",
        }
        assert not _refused(HOST, node.client_port)
        assert _refused("127.0.0.1", node.client_port)
        assert not _refused(HOST, node.raft_port)
        assert _refused("127.0.0.1", node.raft_port)
