"""`quorumq member list|add|remove`: cluster membership."""

from __future__ import annotations

import re
from pathlib import Path

import click

from cluster.cli.common import (
    connect,
    connection_options,
    emit,
    load_config,
    output_format,
    translate_errors,
)
from cluster.cli.exits import USAGE, CliError
from cluster.launcher import client_key, cluster_status

NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json member list
    """
    data_dir = ctx.find_root().obj.data_dir
    if data_dir is not None:
        config = load_config(Path(data_dir))
        rows = cluster_status(config, client_key(Path(data_dir)))
        by_id = {node.id: node for node in config.nodes}
        emit(
            ctx,
            [
                {
                    "id": row["id"],
                    "role": row.get("role"),
                    "client": row.get("address"),
                    "raft": by_id[row["id"]].raft_address if row["id"] in by_id else None,
                }
                for row in rows
            ],
        )
        return
    with connect(ctx) as client:
        status = client.status()
        members = status.get("members") if isinstance(status, dict) else None
    emit(ctx, members if isinstance(members, list) else [status])


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
@connection_options
@click.pass_context
@translate_errors
def add(ctx: click.Context, node_id: str, raft_address: str, client_address: str) -> None:
    """Add a member through the log (then start it with `node start`).

    \b
    Example:
      quorumq --data-dir /tmp/qq member add n4 --raft-address 127.0.0.1:7006 \\
        --client-address 127.0.0.1:7007
    """
    _check_node_id(node_id)
    _check_address(raft_address, "--raft-address")
    _check_address(client_address, "--client-address")
    with connect(ctx) as client:
        result = client.admin(
            "member_add",
            {"node": node_id, "raft_address": raft_address, "client_address": client_address},
        )
    if output_format(ctx) == "table":
        click.echo(f"member {node_id} added")
    else:
        emit(ctx, {"node": node_id, "result": result})


@member_group.command("remove")
@click.argument("node_id")
@connection_options
@click.pass_context
@translate_errors
def remove(ctx: click.Context, node_id: str) -> None:
    """Remove a member through the log (stop its process afterwards).

    \b
    Example:
      quorumq --data-dir /tmp/qq member remove n3
    """
    _check_node_id(node_id)
    with connect(ctx) as client:
        result = client.admin("member_remove", {"node": node_id})
    if output_format(ctx) == "table":
        click.echo(f"member {node_id} removed")
    else:
        emit(ctx, {"node": node_id, "result": result})
