"""`quorumq publish QUEUE`: confirmed, pipelined publishing from the command line."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import click

from cluster.cli.common import connect, connection_options, emit, output_format, translate_errors
from cluster.cli.exits import USAGE, CliError
from cluster.cli.queue import groups_refused, validate_queue_name
from cluster.client import Client, CommandRefused, Publisher
from cluster.client.errors import ClusterError
from cluster.client.groups import partition_of

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
TIMEOUT_S_MAX = 3600.0


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
@click.option(
    "--group",
    "--key",
    "group",
    default=None,
    metavar="G",
    help="Message group of every message (machine v3; the x-group-id annotation). To a "
    "partitioned queue it is the partition key: every message of G goes to partition "
    "crc32(G) mod P (without it, round robin).",
)
@click.option(
    "--spread-groups",
    type=click.IntRange(1, 1_000_000),
    default=None,
    metavar="N",
    help="With --group G: message i goes to group G<i mod N> (G0 .. G<N-1>), round robin.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0.1, TIMEOUT_S_MAX),
    default=30.0,
    show_default=True,
    metavar="S",
    help="Seconds to wait for a confirm (across reconnects) before giving up: exit 69 when "
    "the nodes answered that there is no leader (after 4 s of such answers, naming the nodes "
    "that do not answer), 75 when the outcome of a "
    "message is unknown (it may have been stored: publish it again, dedup keeps one copy "
    "only within one publisher).",
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
    group: str | None,
    spread_groups: int | None,
    timeout_s: float,
) -> None:
    """Publish messages with confirms and print how many were confirmed, and how fast.

    Generated bodies start with a run token and the message number (`3f2a9c1e-17 xxx...`).

    QUEUE may be a partitioned queue's name (`queue declare NAME --partitions P`): the cluster
    routes each message to one partition, NAME.<crc32(key) mod P> for a message with a key
    (`--key`, the same as `--group`: its message group), round robin without one. A resend after
    a reconnect is deduplicated over the whole partitioned queue. The partition of a key is also
    `cluster.client.groups.partition_of(key, P)`.

    \b
    Example:
      quorumq --data-dir /tmp/qq publish jobs --count 2000 --size 100 --window 500
      quorumq --data-dir /tmp/qq publish jobs --body 'hello'
      quorumq --data-dir /tmp/qq publish orders --count 1000 --group customer- --spread-groups 50
      quorumq --data-dir /tmp/qq publish parted --count 100 --key customer-42
      quorumq --data-dir /tmp/qq publish jobs --body 'now or never' --timeout 2
    """
    validate_queue_name(queue)
    if size is not None and text is not None:
        raise CliError("--size and --body are mutually exclusive", USAGE)
    if spread_groups is not None and group is None:
        raise CliError("--spread-groups needs --group (the group name prefix)", USAGE)
    if group is not None and not 0 < len(group.encode()) <= 240:
        raise CliError("--group must be 1..240 bytes", USAGE)
    with connect(ctx, request_timeout_s=timeout_s, reconnect_timeout_s=timeout_s) as client:
        started = time.monotonic()
        items = bodies(count, size, text)
        try:
            if group is None:
                confirmed = _publish(client, queue, items, count, window, ttl_ms)
            else:
                confirmed = _publish_grouped(client, queue, items, window, ttl_ms, group,
                                             spread_groups)  # fmt: skip
        except CommandRefused as err:
            raise groups_refused(err) or err from err
        seconds = time.monotonic() - started
        partitions = partition_count(client, queue)
    rate = confirmed / seconds if seconds > 0 else 0.0
    routed = routing_summary(queue, partitions, group, spread_groups)
    if output_format(ctx) == "table":
        click.echo(
            f"confirmed {confirmed} messages to {queue} in {seconds:.2f}s ({rate:,.0f} msg/s)"
        )
        if routed:
            click.echo(routed["routing"])
    else:
        emit(
            ctx,
            {
                "queue": queue,
                "confirmed": confirmed,
                "seconds": round(seconds, 3),
                "rate": round(rate, 1),
                **routed,
            },
        )


def partition_count(client: Client, queue: str) -> int | None:
    """The partitions of `queue` if it is a partitioned queue (None: a plain queue, or a
    cluster too old to say)."""
    try:
        count = client.query("partitions", {"queue": queue})
    except ClusterError:
        return None
    return count if isinstance(count, int) else None


def routing_summary(
    queue: str, partitions: int | None, group: str | None, spread: int | None
) -> dict[str, Any]:
    """Where a publish to a partitioned queue went (empty for a plain queue)."""
    if partitions is None:
        return {}
    out: dict[str, Any] = {"partitions": partitions}
    if group is not None and spread is None:
        out["partition"] = f"{queue}.{partition_of(group, partitions)}"
        out["routing"] = f"partitioned queue: key {group!r} -> {out['partition']}"
    elif group is not None:
        out["routing"] = f"partitioned queue: {spread} keys over {partitions} partitions (crc32)"
    else:
        out["routing"] = f"partitioned queue: round robin over {partitions} partitions"
    return out


def _publish_grouped(
    client: Client,
    queue: str,
    items: Iterator[bytes],
    window: int,
    ttl_ms: int | None,
    group: str,
    spread: int | None,
) -> int:
    """Publish with a message group per message (one command per message, pipelined)."""
    with client.publisher(queue, window=window) as publisher:
        for number, body in enumerate(items):
            name = group if spread is None else f"{group}{number % spread}"
            publisher.publish(body, ttl_ms=ttl_ms, group=name)
        publisher.wait_for_confirms()
        return publisher.confirmed


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
