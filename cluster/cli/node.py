"""`quorumq node start|stop|restart|recover`: one node of a local cluster."""

from __future__ import annotations

import os
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cluster.bundles import bundle_node_id
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
from cluster.cli.exits import CONFIG, TEMPORARY, UNAVAILABLE, USAGE, CliError
from cluster.client.tls import client_context, data_dir_ca
from cluster.config import ClusterConfig, read_secret
from cluster.errors import ConfigError
from cluster.launcher import (
    client_key,
    file_size,
    node_pid,
    node_status,
    set_node_cap,
    spawn_node,
    stderr_tail,
    stop_node,
)
from raft.storage import fsync_dir


def node_id_arguments(func: Callable[..., Any]) -> Callable[..., Any]:
    """The node a command acts on: `NODE_ID` or `--node-id NODE_ID` (either form, every command)."""
    func = click.option(
        "--node-id",
        "node_id_option",
        default=None,
        metavar="NODE_ID",
        help="The node, as named in cluster.toml (the same as the NODE_ID argument).",
    )(func)
    return click.argument("node_id_arg", metavar="NODE_ID", required=False)(func)


def chosen_node_id(argument: str | None, option: str | None) -> str:
    """The node id given as the argument or with --node-id; a usage error for none or two."""
    if argument is not None and option is not None and argument != option:
        raise CliError(f"two node ids given ({argument} and --node-id {option}): name one", USAGE)
    node_id = argument or option
    if not node_id:
        raise CliError("name the node: NODE_ID (or --node-id NODE_ID)", USAGE)
    return node_id


@click.group("node")
def node_group() -> None:
    """Start, stop or restart one node.

    \b
    Example:
      quorumq node restart n2 --data-dir /tmp/qq
    """


@node_group.command("start")
@node_id_arguments
@data_dir_option
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
@click.option(
    "--bundle",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="A node bundle of `quorumq cluster init --hosts` (its data dir; names the node).",
)
@output_option
@click.pass_context
@translate_errors
def start(
    ctx: click.Context,
    node_id_arg: str | None,
    node_id_option: str | None,
    local_data_dir: Path | None,
    max_machine_version: int | None,
    metrics_port: int | None,
    metrics_bind: str | None,
    bundle: Path | None,
) -> None:
    """Run one node in the foreground (what `cluster start` runs for each node).

    \b
    Example:
      quorumq node start n1 --data-dir /tmp/qq
      quorumq node start n1 --data-dir /tmp/qq --metrics-port 9419
      curl -s 127.0.0.1:9419/metrics | grep quorumq_queue_messages_ready
      quorumq node start --bundle /var/lib/quorumq     # a host of its own (docs/deploy.md)
    """
    if bundle is not None:
        node_id, data_dir = _bundle_node(bundle, node_id_arg, node_id_option, local_data_dir)
    else:
        node_id = chosen_node_id(node_id_arg, node_id_option)
        data_dir = resolve_data_dir(ctx, local_data_dir)
    config = load_config(data_dir)
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} in {data_dir} (have {config.node_ids()})", USAGE)
    from cluster.node.server import run_node  # the node server is heavy; import it only here

    sys.exit(run_node(data_dir.resolve(), node_id, max_machine_version, metrics_port, metrics_bind))


def _bundle_node(
    bundle: Path, argument: str | None, option: str | None, data_dir: Path | None
) -> tuple[str, Path]:
    """The node id a bundle is for (an id given too must be the same) and its data dir."""
    if data_dir is not None:
        raise CliError("give --bundle or --data-dir, not both (a bundle is the data dir)", USAGE)
    node_id = bundle_node_id(bundle)
    given = argument or option
    if given is not None and given != node_id:
        raise CliError(f"{bundle} is {node_id}'s bundle, not {given}'s", USAGE)
    return node_id, bundle


@node_group.command("stop")
@node_id_arguments
@data_dir_option
@grace_option
@output_option
@click.pass_context
@translate_errors
def stop(
    ctx: click.Context,
    node_id_arg: str | None,
    node_id_option: str | None,
    local_data_dir: Path | None,
    grace_s: float,
) -> None:
    """Stop one node (SIGTERM, then SIGKILL after the grace period).

    \b
    Example:
      quorumq --data-dir /tmp/qq node stop n2
    """
    node_id = chosen_node_id(node_id_arg, node_id_option)
    config = load_config(resolve_data_dir(ctx, local_data_dir))
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} (have {config.node_ids()})", USAGE)
    stopped = stop_node(config.node(node_id), grace_s)
    if output_format(ctx) == "table":
        click.echo(f"stopped {node_id}" if stopped else f"{node_id} was not running")
    else:
        emit(ctx, {"node": node_id, "stopped": stopped})


@node_group.command("restart")
@node_id_arguments
@data_dir_option
@max_machine_version_option("Restart with this machine-version cap (recorded in cluster.toml).")
@grace_option
@wait_timeout_option("Seconds to wait for the node to answer again.")
@output_option
@click.pass_context
@translate_errors
def restart(
    ctx: click.Context,
    node_id_arg: str | None,
    node_id_option: str | None,
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
    node_id = chosen_node_id(node_id_arg, node_id_option)
    data_dir = resolve_data_dir(ctx, local_data_dir)
    config = load_config(data_dir)
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} (have {config.node_ids()})", USAGE)
    node = config.node(node_id)
    cap = max_machine_version if max_machine_version is not None else node.max_machine_version
    _check_startable(data_dir, node_id, cap)  # before stopping anything
    was_running = stop_node(node, grace_s)
    if max_machine_version is not None:
        set_node_cap(data_dir, node_id, max_machine_version)
    since = file_size(node.data_dir / "stderr.log")
    spawn_node(data_dir, node_id, max_machine_version)
    status = _wait_answering(data_dir, node_id, timeout_s, since)
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


def _check_startable(data_dir: Path, node_id: str, cap: int | None = None) -> None:
    """Refuse (78) before stopping a running node that could not start again (its secret, its
    machine-version cap)."""
    from cluster.node.server import supported_version  # the node's own check (heavy import)

    try:
        read_secret(data_dir)
        supported_version(cap)
    except ConfigError as err:
        raise CliError(
            f"not touching {node_id}: it could not start again ({err}); nothing was stopped",
            CONFIG,
        ) from err


def _wait_answering(
    data_dir: Path, node_id: str, timeout_s: float, stderr_since: int
) -> dict[str, object]:
    """The node's status once it answers; exit 69 quoting its stderr (what it wrote from
    `stderr_since` on) if it exits first."""
    config = load_config(data_dir)
    node, key, tls = config.node(node_id), client_key(data_dir), _tls(data_dir, config)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = node_status(node, key, timeout_s=1.0, tls=tls)
        if status is not None:
            return status
        if node_pid(node) is None:
            raise CliError(
                f"{node_id} exited at start{stderr_tail(node, stderr_since)}", UNAVAILABLE
            )
        time.sleep(0.1)
    raise CliError(f"{node_id} did not answer within {timeout_s:.0f}s", UNAVAILABLE)


# `members` too: a damaged member set refuses the start; it is rebuilt with the rest
STORAGE_FILES = (
    "raft.journal",
    "raft.journal.meta",
    "raft.journal.retained",  # a directory: the entries kept after compaction (issue 32)
    "raft.dump",
    "members",
)
STORAGE_LEFTOVERS = (
    "raft.journal.tmp",
    "raft.journal.meta.tmp",
    "raft.dump.tmp",
    "raft.dump.1.tmp",
    "raft.dump.live.tmp",
    "members.tmp",
)


@node_group.command("recover")
@node_id_arguments
@data_dir_option
@grace_option
@wait_timeout_option("Seconds to wait for the node to be rebuilt from its peers.")
@output_option
@click.pass_context
@translate_errors
def recover(
    ctx: click.Context,
    node_id_arg: str | None,
    node_id_option: str | None,
    local_data_dir: Path | None,
    grace_s: float,
    timeout_s: float,
) -> None:
    """Rebuild a node whose journal, meta or snapshot is damaged, from its peers.

    Checks that a majority of the cluster is healthy without this node (else exit 69: wiping
    it could lose entries only it and a down node hold), stops it, moves its journal, meta and
    snapshot aside into `recovered-<UTC time>/` in its data dir (nothing is deleted), and starts
    it empty: the leader sends it a snapshot and the log, and the command waits until it has
    applied everything the cluster had committed when it began.

    \b
    Example:
      quorumq --data-dir /tmp/qq node recover n2
    """
    node_id = chosen_node_id(node_id_arg, node_id_option)
    data_dir = resolve_data_dir(ctx, local_data_dir)
    config = load_config(data_dir)
    if node_id not in config.node_ids():
        raise CliError(f"no node {node_id!r} (have {config.node_ids()})", USAGE)
    node, key = config.node(node_id), client_key(data_dir)
    needed = len(config.nodes) // 2 + 1
    healthy, why_not, target = _healthy_peers(config, node_id, key, _tls(data_dir, config))
    if len(healthy) < needed:
        raise CliError(
            f"refusing to recover {node_id}: {len(healthy)} of the other members are healthy "
            f"({', '.join(healthy) or 'none'}), a majority of the cluster ({needed} of "
            f"{len(config.nodes)}) must be, without {node_id}, so that every committed entry "
            f"is held by a healthy member ({'; '.join(why_not)}); bring them back first",
            UNAVAILABLE,
        )
    _check_startable(data_dir, node_id, node.max_machine_version)
    was_running = stop_node(node, grace_s)
    moved_to = _move_storage_aside(node.data_dir)
    since = file_size(node.data_dir / "stderr.log")
    spawn_node(data_dir, node_id)
    _wait_answering(data_dir, node_id, timeout_s, since)
    status = _wait_caught_up(data_dir, node_id, target, timeout_s, since)
    row = {
        "node": node_id,
        "was_running": was_running,
        "moved_to": str(moved_to) if moved_to else None,
        "healthy_peers": healthy,
        "caught_up_to": status.get("last_applied"),
        "role": status.get("role"),
    }
    if output_format(ctx) == "table":
        aside = f"damaged files moved to {moved_to}" if moved_to else "no files to move aside"
        click.echo(
            f"{node_id} rebuilt from {', '.join(healthy)}: {aside}; applied up to "
            f"{row['caught_up_to']} (role {row['role']})"
        )
    else:
        emit(ctx, row)


def _tls(data_dir: Path, config: ClusterConfig) -> ssl.SSLContext | None:
    """The client TLS context for a local cluster with tls = true (its D/tls/ca.crt)."""
    return client_context(data_dir_ca(data_dir, config.tls))


def _healthy_peers(
    config: ClusterConfig, node_id: str, key: bytes, tls: ssl.SSLContext | None
) -> tuple[list[str], list[str], int]:
    """(healthy other members, why each other one is not, the highest commit index seen)."""
    healthy: list[str] = []
    why_not: list[str] = []
    target = 0
    for other in config.nodes:
        if other.id == node_id:
            continue
        status = node_status(other, key, timeout_s=2.0, tls=tls)
        if status is None:
            why_not.append(f"{other.id} does not answer")
        elif status.get("role") not in ("leader", "follower") or not status.get("has_quorum"):
            why_not.append(
                f"{other.id} is {status.get('role')}"
                + ("" if status.get("has_quorum") else " without a quorum")
            )
        else:
            healthy.append(other.id)
            target = max(target, int(status.get("commit_index") or 0))
    return healthy, why_not, target


def _move_storage_aside(node_dir: Path) -> Path | None:
    """Move the node's raft files into a new `recovered-<UTC time>` directory; its path, or None
    if there was nothing to move."""
    present = [n for n in (*STORAGE_FILES, *STORAGE_LEFTOVERS) if (node_dir / n).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = node_dir / f"recovered-{stamp}"
    suffix = 1
    while target.exists():
        suffix += 1
        target = node_dir / f"recovered-{stamp}-{suffix}"
    target.mkdir(mode=0o700)
    for name in present:
        os.replace(node_dir / name, target / name)
    fsync_dir(node_dir)
    return target


def _wait_caught_up(
    data_dir: Path, node_id: str, target: int, timeout_s: float, stderr_since: int
) -> dict[str, object]:
    config = load_config(data_dir)
    node, key, tls = config.node(node_id), client_key(data_dir), _tls(data_dir, config)
    deadline = time.monotonic() + timeout_s
    status: dict[str, object] = {}
    while time.monotonic() < deadline:
        status = node_status(node, key, timeout_s=1.0, tls=tls) or {}
        applied = status.get("raft_last_applied")
        if isinstance(applied, int) and applied >= target:
            return status
        if node_pid(node) is None:
            raise CliError(
                f"{node_id} exited while rebuilding{stderr_tail(node, stderr_since)}",
                UNAVAILABLE,
            )
        time.sleep(0.2)
    raise CliError(
        f"{node_id} started empty but has not caught up to index {target} within "
        f"{timeout_s:.0f}s (it keeps catching up in the background; check `cluster status`)",
        TEMPORARY,
    )
