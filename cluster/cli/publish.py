"""`quorumq publish QUEUE`: confirmed, pipelined publishing from the command line."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator

import click

from cluster.cli.common import connect, connection_options, emit, output_format, translate_errors
from cluster.cli.exits import USAGE, CliError
from cluster.cli.queue import validate_queue_name
from cluster.client import Client, Publisher

BODY_BYTES_MAX = 8 * 1024 * 1024
CHUNK = 1000  # messages handed to the publisher at a time (progress granularity)


def bodies(count: int, size: int | None, text: str | None) -> Iterator[bytes]:
    """`count` bodies: the given text, or `size` bytes starting with a run token and a number.

    The run token makes bodies unique across publish runs, so consumers can check for loss.
    """
    if text is not None:
        body = text.encode()
        for _ in range(count):
            yield body
        return
    width = size if size is not None else 100
    run = uuid.uuid4().hex[:8].encode()
    for number in range(count):
        head = b"%s-%d " % (run, number)
        yield (head + b"x" * width)[:width]

PUBLISH_COUNT_MAX = 10_000_000  # a typo of a few extra zeros must not fill the cluster's disks


@click.command("publish")
@click.argument("queue")
@click.option(
    "--count",
    type=click.IntRange(1, PUBLISH_COUNT_MAX),
    default=1,
    show_default=True,
    help=f"Messages to publish (at most {PUBLISH_COUNT_MAX:,}).",
)
@click.option(
    "--size",
    type=click.IntRange(0, BODY_BYTES_MAX),
    default=None,
    help="Body size in bytes (default 100).",
)
@click.option("--body", "text", default=None, help="The body text of every message.")
@click.option(
    "--window",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Unconfirmed messages in flight.",
)
@click.option(
    "--ttl",
    "ttl_ms",
    type=click.IntRange(0, None),
    default=None,
    metavar="MS",
    help="Per-message time to live.",
)
@connection_options
@click.pass_context
@translate_errors
def publish(
    ctx: click.Context,
    queue: str,
    count: int,
    size: int | None,
    text: str | None,
    window: int,
    ttl_ms: int | None,
) -> None:
    """Publish messages with confirms and print how many were confirmed, and how fast.

    \b
    Example:
      quorumq --data-dir /tmp/qq publish jobs --count 2000 --size 100 --window 500
      quorumq --data-dir /tmp/qq publish jobs --body 'hello'
    """
    validate_queue_name(queue)
    if size is not None and text is not None:
        raise CliError("--size and --body are mutually exclusive", USAGE)
    with connect(ctx) as client:
        started = time.monotonic()
        confirmed = _publish(client, queue, bodies(count, size, text), count, window, ttl_ms)
        seconds = time.monotonic() - started
    rate = confirmed / seconds if seconds > 0 else 0.0
    if output_format(ctx) == "table":
        click.echo(
            f"confirmed {confirmed} messages to {queue} in {seconds:.2f}s ({rate:,.0f} msg/s)"
        )
    else:
        emit(
            ctx,
            {
                "queue": queue,
                "confirmed": confirmed,
                "seconds": round(seconds, 3),
                "rate": round(rate, 1),
            },
        )


def _publish(
    client: Client, queue: str, items: Iterator[bytes], count: int, window: int, ttl_ms: int | None
) -> int:
    with client.publisher(queue, window=window) as publisher:
        if sys.stderr.isatty():
            _publish_with_progress(publisher, items, count, ttl_ms)
        else:
            publisher.publish_many(items, ttl_ms=ttl_ms)
        publisher.wait_for_confirms()
        return publisher.confirmed


def _publish_with_progress(
    publisher: Publisher, items: Iterator[bytes], count: int, ttl_ms: int | None
) -> None:
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task("publishing", total=count)
        chunk: list[bytes] = []
        for body in items:
            chunk.append(body)
            if len(chunk) >= CHUNK:
                publisher.publish_many(chunk, ttl_ms=ttl_ms)
                chunk = []
                progress.update(task, completed=publisher.confirmed)
        if chunk:
            publisher.publish_many(chunk, ttl_ms=ttl_ms)
        publisher.wait_for_confirms()
        progress.update(task, completed=publisher.confirmed)
