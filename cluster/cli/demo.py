"""`quorumq demo`: the README's main job, a 3-node cluster end to end in one command."""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import click

from cluster.cli.cluster_cmd import STATUS_COLUMNS
from cluster.cli.common import plain, table, translate_errors, untyped
from cluster.client import Client
from cluster.launcher import client_key, cluster_status, start_cluster, stop_cluster

DEMO_QUEUE = "demo-jobs"
DEMO_MESSAGES = 1000
CONVERGE_TIMEOUT_S = 10.0  # then the table shows the digests as they are


def _step(number: int, text: str) -> None:
    click.secho(f"\n[{number}/6] {text}", bold=True)


@click.command("demo")
@click.option(
    "--data-dir",
    "local_data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the demo cluster lives (default: a new temp dir).",
)
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
@click.option(
    "--messages",
    type=click.IntRange(1, 1_000_000),
    default=DEMO_MESSAGES,
    show_default=True,
    help="Messages to publish and consume.",
)
@click.pass_context
@translate_errors
def demo(ctx: click.Context, local_data_dir: Path | None, keep: bool, messages: int) -> None:
    """Start a 3-node cluster, publish and consume through it, show its status, stop it (and
    remove its temp dir: a --data-dir you give is kept, as is everything with --keep).

    \b
    Example:
      quorumq demo
      quorumq demo --data-dir ./quorumq-demo --keep
    """
    temporary = local_data_dir is None  # a temp dir of our own: removed unless --keep
    data_dir = local_data_dir or Path(tempfile.mkdtemp(prefix="quorumq-demo-"))
    _step(1, f"starting a 3-node cluster in {data_dir}")
    cluster = start_cluster(data_dir, 3)
    config, leader = cluster.config, cluster.leader()
    try:
        for node in config.nodes:
            click.echo(
                f"  {node.id}: client {node.client_address}, raft {node.raft_address}"
                + ("  <- leader" if node.id == leader else "")
            )
        with Client.from_data_dir(data_dir, name="quorumq-demo") as client:
            _run_traffic(client, messages)
            _step(5, "cluster status (every node applied the same log: equal digests)")
            with suppress(AssertionError):  # followers apply the last entries: wait for it
                cluster.converged(timeout_s=CONVERGE_TIMEOUT_S)
            rows = cluster_status(config, client_key(data_dir), tls=cluster.tls)
            click.echo(table([_short(row) for row in rows], STATUS_COLUMNS))
            click.echo("\nqueue overview:")
            overview = untyped(plain(client.query("overview", {"queue": DEMO_QUEUE})) or {})
            click.echo(
                table([{"field": k, "value": v} for k, v in overview.items()], ["field", "value"])
            )
    finally:
        if keep:
            _step(6, "leaving the cluster running (--keep)")
            click.echo(f"  try: quorumq --data-dir {data_dir} queue list")
            click.echo(f"  stop it with: quorumq cluster stop --data-dir {data_dir}")
        else:
            _step(6, "stopping the cluster")
            stopped = stop_cluster(config)
            click.echo(f"  stopped {', '.join(stopped)}")
            if temporary:
                shutil.rmtree(data_dir, ignore_errors=True)
                click.echo(f"  removed {data_dir}")
    click.secho(
        "\ndemo finished: every published message was confirmed, consumed and acked.", fg="green"
    )


def _run_traffic(client: Client, messages: int) -> None:
    _step(2, f"declaring queue {DEMO_QUEUE!r}")
    reply = client.declare_queue(DEMO_QUEUE)
    click.echo(f"  {'created' if reply.created else 'already there'}")
    _step(3, f"publishing {messages} messages with confirms (window 100)")
    started = time.monotonic()
    with client.publisher(DEMO_QUEUE, window=100) as publisher:
        publisher.publish_many(b"demo message %d" % i for i in range(messages))
        publisher.wait_for_confirms()
    seconds = time.monotonic() - started
    click.echo(
        f"  {publisher.confirmed} confirmed in {seconds:.2f}s "
        f"({publisher.confirmed / max(seconds, 1e-9):,.0f} msg/s)"
    )
    _step(4, f"consuming and acking {messages} messages (prefetch 100)")
    started = time.monotonic()
    consumer = client.consume(DEMO_QUEUE, prefetch=100)
    seen: set[int] = set()
    while len(seen) < messages:
        message = consumer.get(timeout_s=10.0)
        if message is None:
            break
        seen.add(message.msg_id)
        message.ack()
    consumer.cancel()
    consumer.wait_settled()
    seconds = time.monotonic() - started
    click.echo(f"  {len(seen)} distinct messages consumed and acked in {seconds:.2f}s")
    if len(seen) < messages:
        raise click.ClickException(f"only {len(seen)} of {messages} messages came back")


def _short(row: dict[str, object]) -> dict[str, object]:
    digest = row.get("digest")
    return {**row, "digest": digest[:12]} if isinstance(digest, str) else row
