"""`quorumq consumer list [QUEUE]`."""

from __future__ import annotations

import click

from cluster.cli.common import connect, connection_options, emit, plain, translate_errors, untyped
from cluster.cli.queue import validate_queue_name


@click.group("consumer")
def consumer_group() -> None:
    """Inspect consumers.

    \b
    Example:
      quorumq --data-dir /tmp/qq consumer list jobs
    """


@consumer_group.command("list")
@click.argument("queue", required=False)
@connection_options
@click.pass_context
@translate_errors
def list_consumers(ctx: click.Context, queue: str | None) -> None:
    """List the consumers of one queue (or of every queue): key, tag, status, credit, pending.

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json consumer list jobs
    """
    if queue is not None:
        validate_queue_name(queue)
    with connect(ctx) as client:
        result = untyped(plain(client.query("consumers", {"queue": queue} if queue else {})))
    if isinstance(result, dict):
        rows = [dict(row, queue=name) for name, items in result.items() for row in items or []]
    else:
        rows = list(result or [])
    emit(ctx, rows)
