"""One real 3-node cluster for every AMQP test module, upgraded to the newest machine version
(what a cluster runs once `quorumq machine upgrade` was done), and pika's connection settings."""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fifo
from cluster.errors import ProtocolError
from cluster.launcher import LocalCluster, start_cluster, wait_until
from cluster.rawclient import RawClient

pika = pytest.importorskip("pika")
# pika's defaults (10 s socket, 15 s handshake) are short for a 2-core machine shared by many
SLOW_MACHINE = {"socket_timeout": 30, "stack_timeout": 60}


@dataclass
class AmqpCluster:
    """The running cluster and how a client reaches each node's AMQP port."""

    cluster: LocalCluster
    password: str

    def port(self, index: int = 0) -> int:
        """The AMQP port of node `index` (0-based)."""
        port = self.cluster.config.nodes[index].amqp_port
        assert port is not None
        return port

    def params(self, index: int = 0, **kwargs: Any) -> Any:
        """pika connection parameters for node `index` as the `quorumq` user."""
        credentials = pika.PlainCredentials("quorumq", self.password)
        return pika.ConnectionParameters(
            "127.0.0.1", self.port(index), credentials=credentials, **{**SLOW_MACHINE, **kwargs}
        )

    def url(self, index: int = 0) -> str:
        """An amqp:// URL for node `index`."""
        return f"amqp://quorumq:{self.password}@127.0.0.1:{self.port(index)}/"


def upgrade_to_latest(cluster: LocalCluster) -> None:
    """Switch the cluster to the newest machine version once every node said what it supports."""
    client = cluster.raw_client(cluster.config.nodes[0].id)
    latest = max(fifo.SUPPORTED_VERSIONS)
    wait_until(lambda: len(client.query("machine")["supported"]) == 3 or None, 15, "hellos")
    client.admin("machine_upgrade", to=latest)
    wait_until(lambda: client.query("machine")["effective_version"] == latest or None, 15, "v")


def start_at_v4(data_dir: Path) -> AmqpCluster:
    """3 nodes of today's code: the cluster switches to machine v4 once every node said it
    supports it (`wait_for_version`)."""
    cluster = start_cluster(data_dir, nodes=3)
    wait_for_version(cluster, 4)
    return AmqpCluster(cluster, cluster.key.decode("ascii"))


def restart_at_v4(cluster: LocalCluster) -> None:
    """Restart every node of a running cluster capped at v3 (emulating older code) with the
    cap at v4 (a rolling upgrade), then wait until the cluster switched to it."""
    for node in cluster.config.nodes:
        cluster.restart(node.id, max_machine_version=4)
    wait_for_version(cluster, 4)


def wait_for_version(cluster: LocalCluster, version: int) -> None:
    """Wait until every node applies entries with machine `version` and accepts AMQP
    connections (a client may reach any node next)."""
    for node in cluster.config.nodes:
        client = cluster.raw_client(node.id)
        try:
            def on_version(c: RawClient = client) -> bool | None:
                return _version_on(c) == version or None

            wait_until(on_version, 30, f"machine v{version} on {node.id}")
        finally:
            client.close()
        port = node.amqp_port
        assert port is not None
        wait_until(functools.partial(_accepts, port), 30, f"{node.id}'s AMQP port")


def _version_on(client: Any) -> int | None:
    """The effective machine version a node applies, None while it catches up."""
    try:
        return int(client.query("machine")["effective_version"])
    except ProtocolError:  # "no leader/quorum on nX: it is catching up"
        return None


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


@pytest.fixture(scope="package")
def amqp_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpCluster]:
    """3 nodes with an AMQP port each, on the newest machine version."""
    cluster = start_cluster(tmp_path_factory.mktemp("amqp") / "D", nodes=3)
    try:
        upgrade_to_latest(cluster)
        yield AmqpCluster(cluster, cluster.key.decode("ascii"))
    finally:
        cluster.stop()
