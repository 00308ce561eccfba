"""`quorumq consume QUEUE`: read messages, one JSON line (or table line) per message."""

from __future__ import annotations

import json
import time

import click

from cluster.cli.common import connect, connection_options, output_format, translate_errors
from cluster.cli.queue import validate_queue_name
from cluster.client import Client, Consumer, Message


def message_row(message: Message) -> dict[str, object]:
    """The JSON form of a message (a body that is not UTF-8 is given as hex)."""
    try:
        body: str = message.body.decode("utf-8")
        key = "body"
    except UnicodeDecodeError:
        body, key = message.body.hex(), "body_hex"
    return {
        "queue": message.queue,
        "msg_id": message.msg_id,
        key: body,
        "redelivered": message.redelivered,
        "delivery_count": message.delivery_count,
    }


@click.command("consume")
@click.argument("queue")
@click.option(
    "--count",
    type=click.IntRange(1, None),
    default=None,
    help="Stop after this many messages (default: until idle for --timeout).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Unsettled messages the consumer may hold.",
)
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="Settle each message after printing it (--no-ack: as soon as it arrives).",
)
@click.option("--priority", type=int, default=0, show_default=True, help="Consumer priority.")
@click.option(
    "--consumer-timeout",
    "consumer_timeout_ms",
    type=click.IntRange(1, None),
    default=None,
    metavar="MS",
    help="Consumer timeout (default: the queue's).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0, None),
    default=5.0,
    show_default=True,
    help="Stop after this many seconds without a message.",
)
@connection_options
@click.pass_context
@translate_errors
def consume(
    ctx: click.Context,
    queue: str,
    count: int | None,
    prefetch: int,
    ack: bool,
    priority: int,
    consumer_timeout_ms: int | None,
    timeout_s: float,
) -> None:
    """Consume messages and print one line per message (JSON lines with -o jsonl).

    Messages received beyond --count are returned to the queue (not a failed delivery).

    \b
    Example:
      quorumq --data-dir /tmp/qq -o jsonl consume jobs --count 10
    """
    validate_queue_name(queue)
    fmt = output_format(ctx)
    with connect(ctx) as client:
        received, seconds = _consume(
            client, queue, count, prefetch, ack, priority, consumer_timeout_ms, timeout_s, fmt
        )
    rate = received / seconds if seconds > 0 else 0.0
    click.echo(
        f"consumed {received} messages from {queue} in {seconds:.2f}s ({rate:,.0f} msg/s)", err=True
    )


def _consume(
    client: Client,
    queue: str,
    count: int | None,
    prefetch: int,
    ack: bool,
    priority: int,
    consumer_timeout_ms: int | None,
    timeout_s: float,
    fmt: str,
) -> tuple[int, float]:
    consumer = client.consume(
        queue,
        prefetch=min(prefetch, count or prefetch),
        priority=priority,
        timeout_ms=consumer_timeout_ms,
        auto_ack=not ack,
    )
    started = time.monotonic()
    received = 0
    rows: list[dict[str, object]] = []
    while count is None or received < count:
        message = consumer.get(timeout_s)
        if message is None:
            break
        received += 1
        row = message_row(message)
        if fmt == "table":
            click.echo(
                f"{row['msg_id']}\t{row['delivery_count']}\t"
                f"{'R' if row['redelivered'] else '-'}\t{row.get('body', row.get('body_hex'))}"
            )
        elif fmt == "jsonl":
            click.echo(json.dumps(row))
        else:
            rows.append(row)
        if ack:
            consumer.ack([message])
    seconds = time.monotonic() - started
    _give_back(consumer)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    return received, seconds


def _give_back(consumer: Consumer) -> None:
    """Cancel, return whatever arrived beyond what was printed, and wait for the settles."""
    consumer.cancel()
    extra = consumer.take_buffered()
    if extra:
        consumer.nack(extra, requeue=True)
    consumer.wait_settled()
