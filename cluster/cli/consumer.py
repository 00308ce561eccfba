"""`quorumq consumer list [QUEUE]`."""

from __future__ import annotations

import click

from cluster.cli.common import (
    connect,
    connection_options,
    emit,
    plain,
    read_query,
    stale_ok_option,
    translate_errors,
    untyped,
)
from cluster.cli.queue import no_queue, validate_queue_name


@click.group("consumer")
def consumer_group() -> None:
    """Inspect consumers.

    \b
    Example:
      quorumq --data-dir /tmp/qq consumer list jobs
    """


@consumer_group.command("list")
@click.argument("queue", required=False)
@stale_ok_option
@connection_options
@click.pass_context
@translate_errors
def list_consumers(ctx: click.Context, queue: str | None, stale_ok: bool) -> None:
    """List the consumers of one queue (or of every queue): key, tag, status, credit, pending.

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json consumer list jobs
      quorumq --endpoints 127.0.0.1:7003 --credentials key consumer list jobs --stale-ok
    """
    if queue is not None:
        validate_queue_name(queue)
    with connect(ctx) as client:
        args = {"queue": queue} if queue else {}
        result = untyped(plain(read_query(client, "consumers", args, stale_ok)))
        if queue is not None and read_query(client, "overview", args, stale_ok) is None:
            raise no_queue(queue)
    if isinstance(result, dict):
        rows = [dict(row, queue=name) for name, items in result.items() for row in items or []]
    else:
        rows = list(result or [])
    emit(ctx, rows)
