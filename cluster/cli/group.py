"""`quorumq group list` and `quorumq group describe GROUP`: consumer groups (machine v3)."""

from __future__ import annotations

from typing import Any

import click

from cluster.cli.common import (
    connect,
    connection_options,
    emit,
    output_format,
    plain,
    table,
    translate_errors,
    untyped,
)
from cluster.cli.exits import DATA, CliError


@click.group("group")
def group_group() -> None:
    """Inspect consumer groups: members, partitions each, lag, the last rebalance.

    \b
    Example:
      quorumq --data-dir /tmp/qq group describe billing
    """


@group_group.command("list")
@connection_options
@click.pass_context
@translate_errors
def list_groups(ctx: click.Context) -> None:
    """List the consumer groups: queue, partitions, members, epoch, hand-overs pending, and the
    last rebalance (index, moves, partitions reassigned).

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json group list
    """
    with connect(ctx) as client:
        rows = untyped(plain(client.query("consumer_groups", {})))
    emit(ctx, [_fields(row) for row in rows or []])


@group_group.command("describe")
@click.argument("group")
@connection_options
@click.pass_context
@translate_errors
def describe_group(ctx: click.Context, group: str) -> None:
    """One group: members in join order (epoch, partitions each), every partition (member, lag
    = messages waiting, checked out, hand-over pending) and the last rebalance.

    \b
    Example:
      quorumq --data-dir /tmp/qq group describe billing
    """
    with connect(ctx) as client:
        found = untyped(plain(client.query("consumer_group", {"group": group})))
    if not found:
        raise CliError(f"no consumer group {group!r}", DATA)
    described = {
        **_fields(found["overview"]),
        "members": [_fields(m) for m in found["members"]],
        "partitions": [_fields(p) for p in found["partitions"]],
    }
    if output_format(ctx) != "table":
        emit(ctx, described)
        return
    summary = {k: v for k, v in described.items() if k not in ("members", "partitions")}
    members = [
        {**m, "count": len(m["partitions"]), "partitions": ",".join(m["partitions"])}
        for m in described["members"]
    ]
    click.echo(table([summary]))
    click.echo()
    click.echo(table(members, ["member", "join_seq", "epoch", "count", "partitions"]))
    click.echo()
    columns = ["partition", "member", "holder", "pending", "lag", "checked_out"]
    click.echo(table(described["partitions"], columns))


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "type"}
