"""`quorumq queue declare|list|info|purge|delete`."""

from __future__ import annotations

from typing import Any

import click

from cluster.cli.common import (
    connect,
    connection_options,
    emit,
    output_format,
    plain,
    translate_errors,
    untyped,
)
from cluster.cli.exits import USAGE, CliError
from cluster.client.groups import declare_partitioned_queue
from fifo.commands import CONSUMER_TIMEOUT_MS_DEFAULT, QueueConfig

QUEUE_NAME_BYTES_MAX = 255
LIST_COLUMNS = ["name", "ready", "returned", "checked_out", "total", "bytes", "consumers"]


def validate_queue_name(name: str) -> str:
    """A usage error for an empty, too long or control-character queue name."""
    if not name or len(name.encode()) > QUEUE_NAME_BYTES_MAX:
        raise CliError(f"queue name must be 1..{QUEUE_NAME_BYTES_MAX} bytes", USAGE)
    if any(ord(char) < 0x20 for char in name):
        raise CliError("queue name must not contain control characters", USAGE)
    return name


@click.group("queue")
def queue_group() -> None:
    """Declare, list, inspect, purge and delete queues.

    \b
    Example:
      quorumq --data-dir /tmp/qq queue declare jobs --delivery-limit 5
      quorumq --data-dir /tmp/qq queue list
    """


@queue_group.command("declare")
@click.argument("name")
@click.option("--single-active-consumer", is_flag=True, help="One active consumer at a time.")
@click.option(
    "--delivery-limit",
    type=click.IntRange(0, None),
    default=None,
    help="Failed deliveries before a message is dead-lettered.",
)
@click.option(
    "--max-length", type=click.IntRange(0, None), default=None, help="Maximum ready messages."
)
@click.option(
    "--max-bytes",
    type=click.IntRange(0, None),
    default=None,
    help="Maximum bytes of ready messages.",
)
@click.option(
    "--overflow",
    type=click.Choice(["drop-head", "reject-publish"]),
    default="drop-head",
    show_default=True,
    help="What to do over a limit.",
)
@click.option(
    "--message-ttl",
    type=click.IntRange(0, None),
    default=None,
    metavar="MS",
    help="Message time to live in milliseconds.",
)
@click.option(
    "--consumer-timeout",
    type=click.IntRange(1, None),
    default=CONSUMER_TIMEOUT_MS_DEFAULT,
    show_default=True,
    metavar="MS",
    help="Default consumer timeout (machine v2).",
)
@click.option(
    "--dead-letter-queue",
    default=None,
    metavar="Q",
    help="Queue that receives dead-lettered messages.",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 256),
    default=None,
    help="A partitioned queue: NAME.0 .. NAME.{P-1}, single active consumer each, consumed "
    "through consumer groups (machine v3).",
)
@connection_options
@click.pass_context
@translate_errors
def declare(
    ctx: click.Context,
    name: str,
    single_active_consumer: bool,
    delivery_limit: int | None,
    max_length: int | None,
    max_bytes: int | None,
    overflow: str,
    message_ttl: int | None,
    consumer_timeout: int,
    dead_letter_queue: str | None,
    partitions: int | None,
) -> None:
    """Create a queue (a no-op when it exists with the same settings).

    \b
    Example:
      quorumq --data-dir /tmp/qq queue declare jobs --max-length 10000 --overflow reject-publish
    """
    validate_queue_name(name)
    if dead_letter_queue is not None:
        validate_queue_name(dead_letter_queue)
        if dead_letter_queue == name:
            raise CliError("a queue cannot dead-letter into itself", USAGE)
    config = QueueConfig(
        single_active_consumer=single_active_consumer or partitions is not None,
        delivery_limit=delivery_limit,
        max_length=max_length,
        max_bytes=max_bytes,
        overflow="reject_publish" if overflow == "reject-publish" else "drop_head",
        message_ttl_ms=message_ttl,
        dead_letter_queue=dead_letter_queue,
        consumer_timeout_ms=consumer_timeout,
    )
    with connect(ctx) as client:
        if partitions is None:
            reply = client.declare_queue(name, config)
        else:
            reply = declare_partitioned_queue(client, name, partitions, config)
    if output_format(ctx) == "table":
        click.echo(f"queue {name} {'declared' if reply.created else 'already exists'}")
    else:
        emit(ctx, {"queue": name, "created": reply.created})


@queue_group.command("list")
@connection_options
@click.pass_context
@translate_errors
def list_queues(ctx: click.Context) -> None:
    """List every queue with its counters.

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json queue list
    """
    with connect(ctx) as client:
        rows = _rows(client.query("overview"))
    emit(ctx, rows, LIST_COLUMNS if output_format(ctx) == "table" else None)


@queue_group.command("info")
@click.argument("name")
@connection_options
@click.pass_context
@translate_errors
def info(ctx: click.Context, name: str) -> None:
    """Show one queue: counters, config and consumers.

    \b
    Example:
      quorumq --data-dir /tmp/qq queue info jobs
    """
    validate_queue_name(name)
    with connect(ctx) as client:
        overview = client.query("overview", {"queue": name})
    if not overview:
        raise CliError(f"no queue {name!r}", USAGE)
    emit(ctx, untyped(plain(overview)))


@queue_group.command("purge")
@click.argument("name")
@connection_options
@click.pass_context
@translate_errors
def purge(ctx: click.Context, name: str) -> None:
    """Drop every ready message of a queue (checked-out messages stay).

    \b
    Example:
      quorumq --data-dir /tmp/qq queue purge jobs
    """
    validate_queue_name(name)
    with connect(ctx) as client:
        reply = client.purge_queue(name)
    if output_format(ctx) == "table":
        click.echo(f"purged {reply.count} messages from {name}")
    else:
        emit(ctx, {"queue": name, "purged": reply.count})


@queue_group.command("delete")
@click.argument("name")
@connection_options
@click.pass_context
@translate_errors
def delete(ctx: click.Context, name: str) -> None:
    """Delete a queue with its messages; its consumers are cancelled.

    \b
    Example:
      quorumq --data-dir /tmp/qq queue delete jobs
    """
    validate_queue_name(name)
    with connect(ctx) as client:
        reply = client.delete_queue(name)
    if output_format(ctx) == "table":
        click.echo(f"deleted {name} ({reply.messages} messages)")
    else:
        emit(ctx, {"queue": name, "deleted": True, "messages": reply.messages})


def _rows(result: Any) -> list[Any]:
    """Queries may answer a list of maps or a map by name; make rows either way."""
    if isinstance(result, list):
        return [
            {k: v for k, v in row.items() if k != "type"} if isinstance(row, dict) else row
            for row in plain(result)
        ]
    if isinstance(result, dict):
        return [
            {"name": key, **value} if isinstance(value, dict) else {"name": key, "value": value}
            for key, value in result.items()
        ]
    return list(plain(result) or [])
