"""A pytest plugin that points aio-pika's own test suite at a quorumq node instead of Docker.

aio-pika's `tests/conftest.py` (unchanged) checks for Docker in `pytest_configure` and starts a
RabbitMQ container in its `rabbitmq_container` fixture through `tests.docker_client`. This plugin
is loaded with `-p` before that conftest is imported and replaces the two names it imports from
`tests.docker_client`: Docker is reported available, and "running a container" answers the AMQP
port of a running quorumq node (`QUORUMQ_AMQP_PORT`; `QUORUMQ_AMQPS_PORT` for 5671, the same port
when unset). Their fixtures then connect as `guest`/`guest` to vhost `/`, which a cluster with
`amqp_guest = true` accepts from loopback. Used by `scripts/run_aiopika_suite.py`.
"""

from __future__ import annotations

import os
from typing import Any

import tests.docker_client as docker_client  # aio-pika's, from its sdist (PYTHONPATH)

HOST = "127.0.0.1"


def _amqp_port() -> int:
    """The quorumq node's AMQP port, from the environment."""
    try:
        return int(os.environ["QUORUMQ_AMQP_PORT"])
    except (KeyError, ValueError) as exc:
        raise RuntimeError("QUORUMQ_AMQP_PORT must name a quorumq node's AMQP port") from exc


class QuorumqNode:
    """Stands in for `DockerClient`: `run` answers the quorumq node's ports, kill/remove no-op."""

    def __init__(self, docker_host_info: Any = None) -> None:
        self.docker_host_info = docker_host_info

    def run(self, image: str, ports: list[str], environment: Any = None) -> Any:
        """A `ContainerInfo` naming the node's AMQP port for 5672 (and 5671)."""
        amqp = _amqp_port()
        amqps = int(os.environ.get("QUORUMQ_AMQPS_PORT", amqp))
        mapped = {"5672/tcp": amqp, "5671/tcp": amqps}
        return docker_client.ContainerInfo(
            id=f"quorumq:{image}", ports={port: mapped.get(port, amqp) for port in ports}, host=HOST
        )

    def kill(self, container_id: str) -> None:
        """Nothing to kill: the cluster belongs to the caller."""

    def remove(self, container_id: str) -> None:
        """Nothing to remove."""


def _docker_available() -> Any:
    """What `check_docker_available` returns when Docker is there."""
    _amqp_port()
    return docker_client.DockerHostInfo(is_tcp=True, host=HOST, port=_amqp_port())


docker_client.check_docker_available = _docker_available
docker_client.DockerClient = QuorumqNode  # type: ignore[misc,assignment]
