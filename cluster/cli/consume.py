"""`quorumq consume QUEUE`: read messages, one JSON line (or table line) per message."""

from __future__ import annotations

import json
import queue as queue_module
import signal
import threading
import time

import click

from cluster.cli.common import (
    cli_error,
    connect,
    connection_options,
    output_format,
    translate_errors,
)
from cluster.cli.exits import DATA, USAGE, CliError
from cluster.cli.publish import partition_count
from cluster.cli.queue import no_queue, validate_queue_name
from cluster.client import Client, CommandRefused, Consumer, LeaderlessBalancer, Message
from cluster.client.groups import join_group
from fifo import limits

CONSUME_COUNT_MAX = 1_000_000_000
IDLE_TIMEOUT_S_MAX = 24 * 3600.0  # larger values overflow the wait (threading.TIMEOUT_MAX)


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
        "group": message.group,  # message group (machine v3), None for the default group
    }


@click.command("consume")
@click.argument("queues", metavar="QUEUE...", nargs=-1, required=True)
@click.option(
    "--balance",
    "group",
    default=None,
    metavar="GROUP",
    help="Balance the QUEUEs (single-active-consumer) with the other consumers of GROUP; "
    "runs until interrupted unless --count or --timeout is given.",
)
@click.option(
    "--group",
    "consumer_group",
    default=None,
    metavar="NAME",
    help="Join consumer group NAME of the partitioned QUEUE (`queue declare QUEUE --partitions "
    "P`) and consume the partitions the cluster assigns to this member (machine v3).",
)
@click.option(
    "--balance-poll",
    "poll_s",
    type=click.FloatRange(0.05, 3600),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="With --balance: how often to re-read the group and release a queue above the share.",
)
@click.option(
    "--count",
    type=click.IntRange(1, CONSUME_COUNT_MAX),
    default=None,
    help=f"Stop after this many messages, at most {CONSUME_COUNT_MAX:,} (default: until idle "
    "for --timeout).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(1, limits.prefetch_max),
    default=100,
    show_default=True,
    help=f"Unsettled messages the consumer may hold (at most {limits.prefetch_max:,}).",
)
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="Settle each message after printing it (--no-ack: as soon as it arrives).",
)
@click.option(
    "--priority",
    type=click.IntRange(-limits.priority_abs_max, limits.priority_abs_max),
    default=0,
    show_default=True,
    help=f"Consumer priority (-{limits.priority_abs_max}..{limits.priority_abs_max}).",
)
@click.option(
    "--consumer-timeout",
    "consumer_timeout_ms",
    type=click.IntRange(1, limits.timeout_ms_max),
    default=None,
    metavar="MS",
    help="Consumer timeout (default: the queue's).",
)
@click.option(
    "--timestamps",
    is_flag=True,
    help="Add received_ns (when the message was handed out) and settling_ns (just before its "
    "ack is sent) to each row: the host's monotonic clock, comparable across processes.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0, IDLE_TIMEOUT_S_MAX),
    default=5.0,
    show_default=True,
    help="Stop after this many seconds without a message (at most a day).",
)
@connection_options
@click.pass_context
@translate_errors
def consume(
    ctx: click.Context,
    queues: tuple[str, ...],
    group: str | None,
    consumer_group: str | None,
    poll_s: float,
    count: int | None,
    prefetch: int,
    ack: bool,
    priority: int,
    consumer_timeout_ms: int | None,
    timestamps: bool,
    timeout_s: float,
) -> None:
    """Consume messages and print one line per message (JSON lines with -o jsonl).

    With --count N, exactly N messages are taken: the consumer never holds credit for more.
    A partitioned queue is consumed through a consumer group: --group NAME joins it (members
    of one group share the partitions; leaving returns what was not settled). With --balance,
    every consumer of GROUP subscribes to every QUEUE and releases the queues above its fair
    share (the leaderless balancer); progress goes to stderr.

    \b
    Example:
      quorumq --data-dir /tmp/qq -o jsonl consume jobs --count 10
      quorumq --data-dir /tmp/qq -o jsonl consume --balance orders o1 o2 o3 o4 o5 o6
      quorumq --data-dir /tmp/qq -o jsonl consume parted --group billing --count 100
    """
    for name in queues:
        validate_queue_name(name)
    fmt = output_format(ctx)
    if group is not None:
        explicit = ctx.get_parameter_source("timeout_s") is not click.core.ParameterSource.DEFAULT
        idle_s = timeout_s if explicit else None
        _consume_balanced(ctx, group, queues, poll_s, count, prefetch, idle_s, fmt)
        return
    if len(queues) != 1:
        raise CliError("give one QUEUE, or several with --balance GROUP", USAGE)
    (queue,) = queues
    with connect(ctx) as client:
        try:
            if consumer_group is not None:
                received, seconds = _consume_group(
                    client, consumer_group, queue, count, prefetch, timeout_s, fmt
                )
            else:
                received, seconds = _consume(
                    client, queue, count, prefetch, ack, priority, consumer_timeout_ms,
                    timeout_s, fmt, timestamps,
                )  # fmt: skip
        except CommandRefused as err:
            raise _refused(client, queue, consumer_group, err) from err
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
    timestamps: bool = False,
) -> tuple[int, float]:
    prefetch = min(prefetch, count or prefetch)
    consumer = client.consume(
        queue,
        prefetch=prefetch,
        priority=priority,
        timeout_ms=consumer_timeout_ms,
        auto_ack=not ack and count is None,
    )
    started = time.monotonic()
    received = 0
    rows: list[dict[str, object]] = []
    settle = _CountedSettle(consumer, count, prefetch, ack)
    while count is None or received < count:
        message = consumer.get(timeout_s)
        if message is None:
            break
        received_ns = time.monotonic_ns()
        received += 1
        settle.arrived(message)
        row = message_row(message)
        if timestamps:
            row["received_ns"] = received_ns
            row["settling_ns"] = time.monotonic_ns()  # the ack below is sent after this
        if fmt == "table":
            click.echo(
                f"{row['msg_id']}\t{row['delivery_count']}\t"
                f"{'R' if row['redelivered'] else '-'}\t{row.get('body', row.get('body_hex'))}"
            )
        elif fmt == "jsonl":
            click.echo(json.dumps(row))
        else:
            rows.append(row)
        settle.printed(message)
    seconds = time.monotonic() - started
    _give_back(consumer, settle)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    return received, seconds


class _CountedSettle:
    """Acks for `consume`: with --count N, never one that would let the queue deliver more than
    N (each ack frees prefetch credit), so nothing arrives beyond N to be returned (a return
    would count against the delivery limit); the acks held back go after the cancel."""

    def __init__(self, consumer: Consumer, count: int | None, prefetch: int, ack: bool) -> None:
        self.consumer, self.count, self.prefetch, self.ack = consumer, count, prefetch, ack
        self.acked = 0
        self.held: list[Message] = []

    def arrived(self, message: Message) -> None:
        """--no-ack: settled on arrival (when --count allows it)."""
        if not self.ack and self.count is not None:
            self._settle(message)

    def printed(self, message: Message) -> None:
        """--ack: settled once printed (when --count allows it)."""
        if self.ack:
            self._settle(message)

    def _settle(self, message: Message) -> None:
        if self.count is not None and self.acked + 1 + self.prefetch > self.count:
            self.held.append(message)
            return
        self.acked += 1
        self.consumer.ack([message])

    def finish(self) -> None:
        """After the cancel: the acks held back."""
        if self.held:
            self.consumer.ack(self.held)
            self.held = []


def _consume_group(
    client: Client,
    group: str,
    queue: str,
    count: int | None,
    prefetch: int,
    timeout_s: float,
    fmt: str,
) -> tuple[int, float]:
    """Join consumer group `group` of partitioned queue `queue`, print and ack until count or
    idle, then leave (what was not settled goes back to its partition)."""
    started = time.monotonic()
    received = 0
    with join_group(client, group, queue, prefetch=min(prefetch, count or prefetch)) as member:
        while count is None or received < count:
            message = member.get(timeout_s)
            if message is None:
                break
            received += 1
            _print(message, fmt)
            message.ack()
    return received, time.monotonic() - started


def _refused(client: Client, queue: str, group: str | None, err: CommandRefused) -> CliError:
    """What to do instead, told in CLI terms (the machine's text names its commands)."""
    partitions = partition_count(client, queue)
    base, _, index = queue.rpartition(".")
    parent = partition_count(client, base) if base and index.isdigit() else None
    if group is None and partitions is not None:
        advice = f"{queue} is a partitioned queue: consume it with `--group NAME`"
    elif group is None and parent is not None:
        advice = (
            f"{queue} is a partition of {base}: consume {base} with `--group NAME` (the "
            "cluster assigns its partitions to the group's members)"
        )
    elif group is not None and partitions is None and client.overview(queue) is not None:
        advice = f"{queue} is not a partitioned queue: consume it without --group"
    elif client.overview(queue) is None and partitions is None:
        return no_queue(queue)
    else:
        return cli_error(err)
    return CliError(f"refused ({err.code}): {advice}", DATA)


def _give_back(consumer: Consumer, settle: _CountedSettle) -> None:
    """Cancel, send the acks held back, return whatever arrived beyond what was printed, and
    wait for the settles."""
    consumer.cancel()
    settle.finish()
    extra = consumer.take_buffered()
    if extra:
        consumer.nack(extra, requeue=True)
    consumer.wait_settled()


def _consume_balanced(
    ctx: click.Context,
    group: str,
    queues: tuple[str, ...],
    poll_s: float,
    count: int | None,
    prefetch: int,
    idle_s: float | None,
    fmt: str,
) -> None:
    """Consume a group of queues through the leaderless balancer until count, idle or a signal."""
    inbox: queue_module.Queue[Message] = queue_module.Queue(maxsize=prefetch * len(queues))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def changed(active: list[str]) -> None:
        click.echo(f"balance {group}: active on {len(active)} of {len(queues)}: "
                   f"{' '.join(active) or '-'}", err=True)  # fmt: skip

    received = 0
    with connect(ctx) as client:
        try:
            balancer = LeaderlessBalancer(
                client,
                group,
                queues,
                prefetch=prefetch,
                poll_s=poll_s,
                on_message=inbox.put,
                on_change=changed,
            )
        except ValueError as error:
            raise CliError(str(error), USAGE) from error
        balancer.start()
        click.echo(f"balance {group}: app {balancer.app_id} on {len(queues)} queues", err=True)
        idle_since = time.monotonic()
        try:
            while not stop.is_set() and (count is None or received < count):
                try:
                    message = inbox.get(timeout=0.2)
                except queue_module.Empty:
                    if idle_s is not None and time.monotonic() - idle_since > idle_s:
                        break
                    continue
                idle_since = time.monotonic()
                received += 1
                _print(message, fmt)
                message.ack()
        except KeyboardInterrupt:
            pass
        finally:
            balancer.close()
    click.echo(f"consumed {received} messages; released {balancer.releases} queues", err=True)


def _print(message: Message, fmt: str) -> None:
    row = message_row(message)
    if fmt == "table":
        click.echo(f"{row['queue']}\t{row['msg_id']}\t{row.get('body', row.get('body_hex'))}")
    else:
        click.echo(json.dumps(row))
