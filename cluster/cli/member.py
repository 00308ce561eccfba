"""`quorumq member list|add|remove`: cluster membership."""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any

import click

from cluster import config as cluster_config
from cluster.cli.common import (
    connect,
    connection_args,
    connection_options,
    emit,
    load_config,
    output_format,
    tls_context,
    translate_errors,
)
from cluster.cli.exits import DATA, UNAVAILABLE, USAGE, CliError
from cluster.client.client import Client
from cluster.config import ClusterConfig
from cluster.errors import ConfigError
from cluster.launcher import (
    NoLeader,
    client_key,
    cluster_status,
    node_status,
    stop_node,
    wait_for_leader,
)

NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ADMIN_TIMEOUT_S = 40.0  # the node answers within 30 s (cluster.node.membership)
LEADER_WAIT_S = 10.0
FORCE_HELP = (
    "Make the change even if it leaves the cluster unable to lose a node (a member that "
    "does not answer, or too few left)."
)


@click.group("member")
def member_group() -> None:
    """List, add and remove cluster members.

    \b
    Example:
      quorumq --data-dir /tmp/qq member list
    """


@member_group.command("list")
@connection_options
@click.pass_context
@translate_errors
def list_members(ctx: click.Context) -> None:
    """List the members with their role and addresses.

    With --data-dir, every node of cluster.toml is asked; `committed` says whether the member
    set the leader applied holds it (a node still listed after a failed `member remove`, or
    not yet listed after `member add`, shows up here).

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json member list
    """
    data_dir = ctx.find_root().obj.data_dir
    if data_dir is not None:
        config = load_config(Path(data_dir))
        tls = tls_context(ctx, Path(data_dir), config)
        rows = cluster_status(config, client_key(Path(data_dir)), tls=tls)
        by_id = {node.id: node for node in config.nodes}
        committed = _committed(rows)
        emit(
            ctx,
            [
                {
                    "id": row["id"],
                    "role": row.get("role"),
                    "client": row.get("address"),
                    "raft": by_id[row["id"]].raft_address if row["id"] in by_id else None,
                    "committed": None if committed is None else row["id"] in committed,
                }
                for row in rows
            ],
        )
        return
    with connect(ctx) as client:
        status = client.status()
        members = status.get("members") if isinstance(status, dict) else None
    emit(ctx, [{"id": m} for m in members] if isinstance(members, list) else [status])


def _committed(rows: list[dict[str, Any]]) -> set[str] | None:
    """The member set the leader reports (None when no node leads)."""
    for row in rows:
        members = row.get("members")
        if row.get("role") == "leader" and isinstance(members, list):
            return {str(m) for m in members}
    return None


def _check_node_id(node_id: str) -> None:
    if not NODE_ID.match(node_id):
        raise CliError(f"bad node id {node_id!r}: letters, digits, '-' and '_' only", USAGE)


def _check_address(address: str, what: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"bad {what} {address!r}: expected host:port", USAGE)


@member_group.command("add")
@click.argument("node_id")
@click.option("--raft-address", required=True, help="host:port of the new node's peer port.")
@click.option("--client-address", required=True, help="host:port of its client port.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@connection_options
@click.pass_context
@translate_errors
def add(
    ctx: click.Context, node_id: str, raft_address: str, client_address: str, force: bool
) -> None:
    """Add a voting member through the Raft log, then start it with `node start`.

    The leader refuses (exit 65) a duplicate id or address, or (without --force) an add while
    another member does not answer (an earlier add whose node never started: start it or
    remove it first); and (exit 69) a change while another one is in flight or when the
    members that answer would not be a majority of the new set: to replace a dead node,
    remove it first, then add its replacement. With
    --data-dir, cluster.toml gets the node once the change is committed; the new node starts
    empty and is rebuilt from its peers (snapshot and log) before it may vote.

    \b
    Example:
      quorumq --data-dir /tmp/qq member add n4 --raft-address 127.0.0.1:7006 \\
        --client-address 127.0.0.1:7007
      quorumq --data-dir /tmp/qq node start --node-id n4 &
    """
    _check_node_id(node_id)
    _check_address(raft_address, "--raft-address")
    _check_address(client_address, "--client-address")
    data_dir = ctx.find_root().obj.data_dir
    if data_dir is not None:  # before any change: cluster.toml must be able to take the node
        _config_after_add(Path(data_dir), node_id, raft_address, client_address)
    args: dict[str, str | int] = {
        "node": node_id,
        "raft_address": raft_address,
        "client_address": client_address,
    }
    if force:
        args["force"] = True
    result = _admin_on_leader(ctx, "member_add", args)
    if data_dir is not None:
        config = _config_after_add(Path(data_dir), node_id, raft_address, client_address)
        cluster_config.write(Path(data_dir), config)
    if output_format(ctx) == "table":
        hint = f"; start it with: quorumq --data-dir {data_dir} node start --node-id {node_id}"
        click.echo(f"member {node_id} added{hint if data_dir is not None else ''}")
    else:
        emit(ctx, {"node": node_id, "result": result})


def _admin_on_leader(
    ctx: click.Context, action: str, args: dict[str, str | int]
) -> dict[str, object]:
    """Send a membership admin action to the leader (only the leader appends a change; with
    --endpoints, to the node the client lands on, which names the leader if it is not). A node
    that is not the leader names the leader's address from the replicated member set (a member
    added later is in no local cluster.toml): the command asks there once more, no further."""
    data_dir = ctx.find_root().obj.data_dir
    if data_dir is None:
        with connect(ctx) as client:
            result = client.admin(action, args, timeout_s=ADMIN_TIMEOUT_S)
        address = result.get("leader_address")
        if not result.get("changed") and isinstance(address, str):
            result = _admin_at(address, action, args, connection_args(ctx)[1], tls_context(ctx))
        return _changed(result)
    config = load_config(Path(data_dir))
    key = client_key(Path(data_dir))
    tls = tls_context(ctx, Path(data_dir), config)
    try:
        leader = wait_for_leader(config, key, timeout_s=LEADER_WAIT_S, tls=tls)
    except NoLeader as err:
        raise CliError(f"cluster unavailable: {err}; nothing was changed", UNAVAILABLE) from err
    address = _address_of(leader, config, key, tls)
    for _attempt in range(2):  # once more if leadership moved meanwhile
        result = _admin_at(address, action, args, key, tls)
        moved = result.get("leader_address")
        if result.get("changed") or not isinstance(moved, str):
            break
        address = moved
    return _changed(result)


def _address_of(leader: str, config: ClusterConfig, key: bytes, tls: ssl.SSLContext | None) -> str:
    """The leader's client address: cluster.toml's, else (a member added since on another host)
    the one a node of cluster.toml names from the replicated member set."""
    if leader in config.node_ids():
        return config.node(leader).client_address
    for node in config.nodes:
        status = node_status(node, key, timeout_s=2.0, tls=tls) or {}
        address = status.get("leader_address")
        if status.get("leader") == leader and isinstance(address, str):
            return address
    raise CliError(
        f"the leader {leader} is not in cluster.toml and no node named its address", UNAVAILABLE
    )


def _admin_at(
    address: str,
    action: str,
    args: dict[str, str | int],
    key: bytes,
    tls: ssl.SSLContext | None,
) -> dict[str, object]:
    """The admin action's result from the node at `address` only (authenticated by the cluster
    key, and with TLS by the CA and the host name of `address`, like any node)."""
    with Client(
        [address],
        key,
        name="quorumq-cli",
        reconnect=False,
        prefer_leader=False,
        connect_timeout_s=5.0,
        tls=tls,
    ) as client:
        return client.admin(action, args, timeout_s=ADMIN_TIMEOUT_S)


def _changed(result: dict[str, object]) -> dict[str, object]:
    """The result of a change that was made; CliError (69 if it may work later, else 65) with
    the node's reason if it was refused."""
    if result.get("changed"):
        return result
    reason = result.get("refused", "refused")
    code = UNAVAILABLE if result.get("unavailable") else DATA
    raise CliError(f"refused: {reason}; nothing was changed", code)


def _config_after_add(
    data_dir: Path, node_id: str, raft_address: str, client_address: str
) -> ClusterConfig:
    config = load_config(data_dir)
    try:
        return cluster_config.with_member_added(
            config, node_id, raft_address, client_address, data_dir.resolve()
        )
    except ConfigError as err:
        raise CliError(f"{err}; nothing was changed", USAGE) from err


@member_group.command("remove")
@click.argument("node_id")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@connection_options
@click.pass_context
@translate_errors
def remove(ctx: click.Context, node_id: str, force: bool) -> None:
    """Remove a voting member through the Raft log; with --data-dir, stop its process if it
    runs on this host and drop it from cluster.toml once the change is committed.

    Refused (exit 65) for a node that is not a member or the last one, or (without --force)
    an answering member whose removal leaves the cluster unable to lose another (add its
    replacement first); (exit 69) while another change is in flight, when the members left
    that answer would not be a majority, or when the node leads (it hands leadership over at
    once: run the command again).

    \b
    Example:
      quorumq --data-dir /tmp/qq member remove n3
    """
    _check_node_id(node_id)
    args: dict[str, str | int] = {"node": node_id}
    if force:
        args["force"] = True
    result = _admin_on_leader(ctx, "member_remove", args)
    data_dir = ctx.find_root().obj.data_dir
    stopped = False
    if data_dir is not None:
        config = load_config(Path(data_dir))
        if node_id in config.node_ids():
            # a removed member is no voter: its process would run on, unmanaged (cluster.toml
            # no longer names it, so `node stop` could not find it)
            stopped = stop_node(config.node(node_id))
            cluster_config.write(
                Path(data_dir), cluster_config.with_member_removed(config, node_id)
            )
    if output_format(ctx) == "table":
        click.echo(f"member {node_id} removed{'; its process stopped' if stopped else ''}")
    else:
        emit(ctx, {"node": node_id, "result": result, "stopped": stopped})
