"""`quorumq queue declare|list|info|groups|purge|delete`."""

from __future__ import annotations

from typing import Any

import click

from cluster.cli.common import (
    connect,
    connection_options,
    emit,
    output_format,
    plain,
    read_query,
    stale_ok_option,
    translate_errors,
    untyped,
)
from cluster.cli.exits import DATA, USAGE, CliError
from cluster.client import Client, CommandRefused
from cluster.client.errors import ClusterError
from cluster.client.groups import declare_partitioned_queue
from fifo.commands import (
    CONSUMER_TIMEOUT_MS_DEFAULT,
    GROUP_KEY_DEFAULT,
    GroupConfig,
    GroupPolicy,
    QueueConfig,
)

QUEUE_NAME_BYTES_MAX = 255
LIST_COLUMNS = ["name", "ready", "returned", "checked_out", "total", "bytes", "consumers"]
GROUP_COLUMNS = ["group", "ready", "checked_out", "owner", "oldest_age_ms"]
GROUPS_NEED = (
    "message groups need machine version 3 (so do partitioned queues); the cluster runs an older "
    "one (upgrade it with `quorumq machine upgrade --to 3` once every node supports 3)"
)


def groups_refused(err: CommandRefused) -> CliError | None:
    """The clear error for a grouped command an older machine does not know."""
    if err.code == "unknown_command" and "machine version" in err.message:
        return CliError(f"{GROUPS_NEED}: {err.message}", DATA)
    return None


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
    "--group-key",
    default=None,
    metavar="K",
    help=f"Message groups (machine v3): the annotation naming a message's group "
    f"(`publish --group` sets {GROUP_KEY_DEFAULT}, the default when only --group-policy is "
    "given). Messages without it share the queue's default group.",
)
@click.option(
    "--group-policy",
    type=click.Choice(["sequenced", "exclusive"]),
    default=None,
    help="Message groups (machine v3): sequenced = a group is held by one consumer while it "
    "holds messages of it; exclusive = a group sticks to one consumer while it lives.",
)
@click.option(
    "--rebalance-groups-on-join",
    is_flag=True,
    help="With --group-policy exclusive: a joining consumer takes over idle groups so owners "
    "differ by at most one group.",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 256),
    default=None,
    help="A partitioned queue: NAME.0 .. NAME.{P-1}, single active consumer each, consumed "
    "through consumer groups; publishes to NAME are routed by key (machine v3).",
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
    group_key: str | None,
    group_policy: str | None,
    rebalance_groups_on_join: bool,
    partitions: int | None,
) -> None:
    """Create a queue (a no-op when it exists with the same settings).

    With --partitions P, a partitioned queue (machine v3): P single-active-consumer queues
    NAME.0 .. NAME.{P-1} with the given settings. Publish to NAME (`publish NAME --key K`:
    routed to NAME.<crc32(K) mod P>, round robin without a key); consume through a consumer
    group (`group describe`, `join_group` in the client library); delete it with `queue delete
    NAME`.

    \b
    Example:
      quorumq --data-dir /tmp/qq queue declare jobs --max-length 10000 --overflow reject-publish
      quorumq --data-dir /tmp/qq queue declare orders --group-policy sequenced
      quorumq --data-dir /tmp/qq queue declare parted --partitions 8
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
    groups = _group_config(group_key, group_policy, rebalance_groups_on_join)
    if partitions is not None and groups is not None:
        raise CliError(
            "--partitions and message groups do not combine: a partition has a single active "
            "consumer, so its messages are already in order",
            USAGE,
        )
    with connect(ctx) as client:
        target_created = False
        if dead_letter_queue is not None and client.overview(dead_letter_queue) is None:
            target_created = client.declare_queue(dead_letter_queue).created
        try:
            if partitions is None:
                reply = client.declare_queue(name, config, groups)
            else:
                reply = declare_partitioned_queue(client, name, partitions, config)
        except CommandRefused as err:
            raise groups_refused(err) or err from err
    if output_format(ctx) == "table":
        click.echo(f"queue {name} {'declared' if reply.created else 'already exists'}")
        if target_created:
            click.echo(f"dead-letter queue {dead_letter_queue} declared (it did not exist)")
    else:
        out: dict[str, Any] = {"queue": name, "created": reply.created}
        if dead_letter_queue is not None:
            out["dead_letter_queue_created"] = target_created
        emit(ctx, out)


@queue_group.command("list")
@stale_ok_option
@connection_options
@click.pass_context
@translate_errors
def list_queues(ctx: click.Context, stale_ok: bool) -> None:
    """List every queue with its counters: READY every message waiting for delivery (returned
    ones included, as in /metrics), RETURNED how many of those were returned, CHECKED_OUT
    delivered and not settled, TOTAL all of them.

    A node without a leader answers `unavailable` (its state may be stale): the client asks
    another node, and exits 69 when none has a leader. `--stale-ok` prints it anyway.

    \b
    Example:
      quorumq --data-dir /tmp/qq -o json queue list
    """
    with connect(ctx) as client:
        rows = [
            waiting_as_ready(row) for row in _rows(read_query(client, "overview", None, stale_ok))
        ]
    emit(ctx, rows, LIST_COLUMNS if output_format(ctx) == "table" else None)


@queue_group.command("info")
@click.argument("name")
@stale_ok_option
@connection_options
@click.pass_context
@translate_errors
def info(ctx: click.Context, name: str, stale_ok: bool) -> None:
    """Show one queue: counters, config and consumers. For a partitioned queue, its
    partitions (each is a queue of its own: `queue info NAME.3`).

    \b
    Example:
      quorumq --data-dir /tmp/qq queue info jobs
      quorumq --data-dir /tmp/qq queue info orders.3
    """
    validate_queue_name(name)
    with connect(ctx) as client:
        overview = read_query(client, "overview", {"queue": name}, stale_ok)
        partitions = None if overview else _partition_count(client, name)
        grouping = _group_fields(client, name) if overview else {}
    if partitions:
        emit(ctx, {"queue": name, "partitioned": True, "partitions": partitions,
                   "members": ", ".join(f"{name}.{i}" for i in range(partitions)),
                   "consume": f"quorumq consume {name} --group NAME"})  # fmt: skip
        return
    if not overview:
        raise no_queue(name)
    emit(ctx, {**waiting_as_ready(untyped(plain(overview))), **grouping})


def waiting_as_ready(row: Any) -> Any:
    """`ready` as /metrics and RabbitMQ count it: every message waiting for delivery, returned
    ones included (`returned` says how many of them); the machine's own `ready` is only the
    never-delivered ones."""
    if isinstance(row, dict) and isinstance(row.get("ready"), int):
        return {**row, "ready": row["ready"] + int(row.get("returned") or 0)}
    return row


def no_queue(name: str) -> CliError:
    """The error of a command naming a queue that does not exist (exit 65, as when the queue
    itself refuses a command for it)."""
    return CliError(f"no queue {name!r}", DATA)


def _group_fields(client: Client, name: str) -> dict[str, Any]:
    """`group_policy`, `group_key` (and the rebalance flag) of a grouped queue; `group_policy:
    none` for a plain one; nothing when the node cannot say (older code)."""
    try:
        found = client.query("group_config", {"queue": name})
    except ClusterError:
        return {}
    if not isinstance(found, dict):
        return {"group_policy": "none"}
    return {
        "group_policy": found.get("policy"),
        "group_key": found.get("group_key"),
        "rebalance_groups_on_join": found.get("rebalance_groups_on_join"),
    }


def _group_config(key: str | None, policy: str | None, rebalance: bool) -> GroupConfig | None:
    """The message-group config the declare options ask for (None: no groups)."""
    if key is None and policy is None:
        if rebalance:
            raise CliError("--rebalance-groups-on-join needs --group-policy exclusive", USAGE)
        return None
    if rebalance and policy != "exclusive":
        raise CliError("--rebalance-groups-on-join needs --group-policy exclusive", USAGE)
    if key is not None and not 0 < len(key.encode()) <= 255:
        raise CliError("--group-key must be 1..255 bytes", USAGE)
    chosen: GroupPolicy = "exclusive" if policy == "exclusive" else "sequenced"
    return GroupConfig(key or GROUP_KEY_DEFAULT, chosen, rebalance)


@queue_group.command("groups")
@click.argument("name")
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Groups to show (oldest waiting message first).",
)
@connection_options
@click.pass_context
@translate_errors
def groups(ctx: click.Context, name: str, limit: int) -> None:
    """Show the message groups of a grouped queue (machine v3): waiting (ready) and checked-out
    messages, the owner (its consumer tag and key) and the age of the oldest waiting message.

    The default group (messages without the group annotation) is shown as `-` (null in JSON).

    \b
    Example:
      quorumq --data-dir /tmp/qq queue groups orders
      quorumq --data-dir /tmp/qq -o json queue groups orders
    """
    validate_queue_name(name)
    with connect(ctx) as client:
        overview = client.overview(name)
        if overview is None:
            raise no_queue(name)
        status = client.query("machine")
        version = status.get("effective_version") if isinstance(status, dict) else None
        if isinstance(version, int) and version < 3:
            raise CliError(f"{GROUPS_NEED} (the cluster runs version {version})", DATA)
        found = client.groups(name, limit)
    rows = [
        {
            "group": info.group,
            "ready": info.ready,
            "returned": info.returned,
            "checked_out": info.checked_out,
            "owner": info.owner_tag,
            "owner_key": info.owner,
            "oldest_age_ms": info.oldest_age_ms,
        }
        for info in found
    ]
    if output_format(ctx) == "table":
        shown = [{**row, "group": "-" if row["group"] is None else row["group"],
                  "owner": row["owner"] or "-"} for row in rows]  # fmt: skip
        emit(ctx, shown, GROUP_COLUMNS)
    else:
        emit(ctx, rows)


@queue_group.command("purge")
@click.argument("name")
@click.option(
    "--group",
    default=None,
    metavar="G",
    help="Only the waiting messages of message group G of a grouped queue (machine v3).",
)
@click.option(
    "--default-group",
    is_flag=True,
    help="Only the waiting messages of the default group (no group annotation).",
)
@connection_options
@click.pass_context
@translate_errors
def purge(ctx: click.Context, name: str, group: str | None, default_group: bool) -> None:
    """Drop every ready message of a queue (checked-out messages stay).

    \b
    Example:
      quorumq --data-dir /tmp/qq queue purge jobs
      quorumq --data-dir /tmp/qq queue purge orders --group customer-42
    """
    validate_queue_name(name)
    if group is not None and default_group:
        raise CliError("--group and --default-group are mutually exclusive", USAGE)
    with connect(ctx) as client:
        try:
            reply = client.purge_queue(name, group=group, default_group=default_group)
        except CommandRefused as err:
            raise groups_refused(err) or err from err
    scope = "" if group is None and not default_group else (
        f" of group {group}" if group is not None else " of the default group")  # fmt: skip
    if output_format(ctx) == "table":
        click.echo(f"purged {reply.count} messages{scope} from {name}")
    else:
        out: dict[str, Any] = {"queue": name, "purged": reply.count}
        if group is not None or default_group:
            out["group"] = group
        emit(ctx, out)


@queue_group.command("delete")
@click.argument("name")
@connection_options
@click.pass_context
@translate_errors
def delete(ctx: click.Context, name: str) -> None:
    """Delete a queue with its messages; its consumers are cancelled.

    A partitioned queue's name deletes it as a whole, in one step: every partition NAME.<i>
    with its messages (their consumers cancelled), the consumer groups over it and its routing
    (round-robin position, publishers' dedup). A single partition cannot be deleted alone.

    \b
    Example:
      quorumq --data-dir /tmp/qq queue delete jobs
      quorumq --data-dir /tmp/qq queue delete orders      # partitioned: orders.0 .. orders.7
    """
    validate_queue_name(name)
    with connect(ctx) as client:
        partitions = _partition_count(client, name)
        reply = client.delete_queue(name)
        sources = dead_letter_sources(client, name)
    if sources:
        click.echo(
            f"warning: {', '.join(sources)} dead-letter into {name}: what they dead-letter is "
            f"dropped until {name} is declared again",
            err=True,
        )
    if output_format(ctx) == "table":
        what = f"partitioned queue {name} ({partitions} partitions, " if partitions else \
            f"{name} ("  # fmt: skip
        click.echo(f"deleted {what}{reply.messages} messages)")
    else:
        out: dict[str, Any] = {"queue": name, "deleted": True, "messages": reply.messages}
        if partitions:
            out["partitions"] = partitions
        emit(ctx, out)


def dead_letter_sources(client: Client, target: str) -> list[str]:
    """The queues whose dead-letter queue is `target` (sorted)."""
    return sorted(o.name for o in client.overview() if o.config.dead_letter_queue == target)


def _partition_count(client: Client, name: str) -> int | None:
    """The partitions of `name` if it is a partitioned queue (None: not one, or an older node
    that cannot say)."""
    try:
        count = client.query("partitions", {"queue": name})
    except ClusterError:
        return None
    return count if isinstance(count, int) else None


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
