"""Entry point of the `quorumq` CLI: the root group, global options and error mapping.

Each command group lives in its own module and is registered here with `cli.add_command`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from cluster.cli.exits import SOFTWARE, CliError


@dataclass
class CliContext:
    """Global options shared by every command."""

    output: str
    data_dir: Path | None
    endpoints: str | None
    credentials: str | None
    tls_ca: str | None = None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json", "jsonl"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="QUORUMQ_DATA_DIR",
    help="Cluster data dir (reads cluster.toml and the credentials from it).",
)
@click.option(
    "--endpoints",
    envvar="QUORUMQ_ENDPOINTS",
    help="Comma-separated client endpoints host:port, instead of --data-dir.",
)
@click.option(
    "--credentials",
    envvar="QUORUMQ_CREDENTIALS",
    help="Path of a client key file (with --endpoints).",
)
@click.option(
    "--tls-ca",
    envvar="QUORUMQ_TLS_CA",
    metavar="FILE",
    help="The cluster CA (D/tls/ca.crt) of a cluster with tls = true: connect over TLS and "
    "verify the nodes' certificates with it. Needed with --endpoints; with --data-dir it is "
    "found in D/tls when cluster.toml says tls = true.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    output: str,
    data_dir: Path | None,
    endpoints: str | None,
    credentials: str | None,
    tls_ca: str | None,
) -> None:
    """quorumq: a replicated work queue with RabbitMQ quorum-queue semantics.

    \b
    Example:
      quorumq cluster start --nodes 3 --data-dir /tmp/qq
      quorumq --data-dir /tmp/qq queue declare jobs
      quorumq --data-dir /tmp/qq publish jobs --count 1000
      quorumq --data-dir /tmp/qq consume jobs --count 10 -o jsonl
      quorumq --endpoints 10.0.0.1:5701 --credentials client.key --tls-ca ca.crt queue list
    """
    ctx.obj = CliContext(output, data_dir, endpoints, credentials, tls_ca)


def main() -> None:
    """Run the CLI, turning a CliError into its message and exit code."""
    try:
        cli.main(standalone_mode=False)
    except CliError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(64 if isinstance(err, click.UsageError) else err.exit_code)
    except Exception as err:  # the edge of the program: report, never a bare traceback
        click.echo(f"internal error: {type(err).__name__}: {err}", err=True)
        sys.exit(SOFTWARE)
    sys.exit(0)


from cluster.cli.pipeline import pipeline  # noqa: E402  (groups register after `cli` exists)

cli.add_command(pipeline)

from cluster.cli.fuzz import fuzz  # noqa: E402

cli.add_command(fuzz)

from cluster.cli.cluster_cmd import cluster_group  # noqa: E402
from cluster.cli.completion import completion  # noqa: E402
from cluster.cli.consume import consume  # noqa: E402
from cluster.cli.consumer import consumer_group  # noqa: E402
from cluster.cli.demo import demo  # noqa: E402
from cluster.cli.member import member_group  # noqa: E402
from cluster.cli.node import node_group  # noqa: E402
from cluster.cli.publish import publish  # noqa: E402
from cluster.cli.queue import queue_group  # noqa: E402

for _command in (
    cluster_group,
    node_group,
    queue_group,
    publish,
    consume,
    consumer_group,
    member_group,
    demo,
    completion,
):
    cli.add_command(_command)

from cluster.cli.machine import machine_group  # noqa: E402

cli.add_command(machine_group)

from cluster.cli.log import log_group  # noqa: E402

cli.add_command(log_group)

from cluster.cli.group import group_group  # noqa: E402

cli.add_command(group_group)

from cluster.cli.simulate import simulate  # noqa: E402

cli.add_command(simulate)
