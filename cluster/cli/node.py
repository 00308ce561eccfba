"""`quorumq node start|stop|restart`: one node of a local cluster."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from cluster.cli.common import (
    data_dir_option,
    emit,
    grace_option,
    load_config,
    max_machine_version_option,
    output_format,
    output_option,
    resolve_data_dir,
    translate_errors,
    wait_timeout_option,
)
from cluster.cli.exits import UNAVAILABLE, USAGE, CliError
from cluster.launcher import (
    client_key,
    node_pid,
    node_status,
    set_node_cap,
    spawn_node,
    stop_node,
)


@click.group("node")
def node_group() -> None:
    """Start, stop or restart one node.

    \b
    Example:
      quorumq node restart n2 --data-dir /tmp/qq
    """


@node_group.command("start")
@data_dir_option
@click.option("--node-id", required=True, help="The node to run, as named in cluster.toml.")
@max_machine_version_option("Cap the machine version this node supports (emulates older code).")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics at http://BIND:PORT/metrics (default: the node's "
    "metrics_port in cluster.toml; off when neither is set).",
)
@click.option(
    "--metrics-bind",
    default=None,
    help="Address the metrics endpoint listens on (default: [cluster] metrics_bind, 127.0.0.1).",
)
@output_option
@click.pass_context
@translate_errors
def start(
    ctx: click.Context,
    local_data_dir: Path | None,
    node_id: str,
    max_machine_version: int | None,
    metrics_port: int | None,
    metrics_bind: str | None,
) -> None:
    """Run one node in the foreground (what `cluster start` runs for each node).

    \b
    Example:
      quorumq node start --data-dir /tmp/qq --node-id n1
      quorumq node start --data-dir /tmp/qq --node-id n1 --metrics-port 9419
      curl -s 127.0.0.1:9419/metrics | grep quorumq_queue_messages_ready
    """
    data_dir = resolve_data_dir(ctx, local_data_dir)
    config = load_config(data_dir)
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} in {data_dir} (have {config.node_ids()})", USAGE)
    from cluster.node.server import run_node  # the node server is heavy; import it only here

    sys.exit(run_node(data_dir.resolve(), node_id, max_machine_version, metrics_port, metrics_bind))


@node_group.command("stop")
@click.argument("node_id")
@data_dir_option
@grace_option
@output_option
@click.pass_context
@translate_errors
def stop(ctx: click.Context, node_id: str, local_data_dir: Path | None, grace_s: float) -> None:
    """Stop one node (SIGTERM, then SIGKILL after the grace period).

    \b
    Example:
      quorumq --data-dir /tmp/qq node stop n2
    """
    config = load_config(resolve_data_dir(ctx, local_data_dir))
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} (have {config.node_ids()})", USAGE)
    stopped = stop_node(config.node(node_id), grace_s)
    if output_format(ctx) == "table":
        click.echo(f"stopped {node_id}" if stopped else f"{node_id} was not running")
    else:
        emit(ctx, {"node": node_id, "stopped": stopped})


@node_group.command("restart")
@click.argument("node_id")
@data_dir_option
@max_machine_version_option("Restart with this machine-version cap (recorded in cluster.toml).")
@grace_option
@wait_timeout_option("Seconds to wait for the node to answer again.")
@output_option
@click.pass_context
@translate_errors
def restart(
    ctx: click.Context,
    node_id: str,
    local_data_dir: Path | None,
    max_machine_version: int | None,
    grace_s: float,
    timeout_s: float,
) -> None:
    """Stop the node if it runs, start it again from its journal and wait until it answers.

    \b
    Example:
      quorumq --data-dir /tmp/qq node restart n2
      quorumq --data-dir /tmp/qq node restart n2 --max-machine-version 2
    """
    data_dir = resolve_data_dir(ctx, local_data_dir)
    config = load_config(data_dir)
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} (have {config.node_ids()})", USAGE)
    node = config.node(node_id)
    was_running = stop_node(node, grace_s)
    if max_machine_version is not None:
        set_node_cap(data_dir, node_id, max_machine_version)
    spawn_node(data_dir, node_id, max_machine_version)
    status = _wait_answering(data_dir, node_id, timeout_s)
    row = {
        "node": node_id,
        "was_running": was_running,
        "pid": node_pid(node),
        "role": status.get("role"),
        "last_applied": status.get("last_applied"),
    }
    if output_format(ctx) == "table":
        click.echo(
            f"{node_id} {'restarted' if was_running else 'started'} "
            f"(pid {row['pid']}, role {row['role']})"
        )
    else:
        emit(ctx, row)


def _wait_answering(data_dir: Path, node_id: str, timeout_s: float) -> dict[str, object]:
    config = load_config(data_dir)
    node, key = config.node(node_id), client_key(data_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = node_status(node, key, timeout_s=1.0)
        if status is not None:
            return status
        if node_pid(node) is None:
            raise CliError(
                f"{node_id} exited at start; see {node.data_dir}/stderr.log", UNAVAILABLE
            )
        time.sleep(0.1)
    raise CliError(f"{node_id} did not answer within {timeout_s:.0f}s", UNAVAILABLE)
