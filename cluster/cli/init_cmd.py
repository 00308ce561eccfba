"""`quorumq cluster init --hosts` and `cluster add-host`: bundles for nodes on separate hosts."""

from __future__ import annotations

from pathlib import Path

import click

from cluster.bundles import (
    AUTHORITY_DIR,
    CLIENT_DIR,
    CLIENT_PORT_DEFAULT,
    HOSTS_MAX,
    HostListError,
    HostSpec,
    add_node_bundle,
    init_bundles,
    parse_host,
    parse_hosts,
)
from cluster.cli.common import emit, output_format, output_option, translate_errors
from cluster.cli.exits import CANT_CREATE, USAGE, CliError
from cluster.config import FSYNC_POLICIES, FsyncPolicy

_OUT_HELP = "The directory to write (new or empty for init; the init one for add-host)."


@click.command("init")
@click.option(
    "--hosts",
    required=True,
    metavar="H1,H2,H3",
    help="One node per item: HOST or HOST:PORT, a name or an IPv4 address "
    f"(1 to {HOSTS_MAX}; 3 or 5 to survive a failure). PORT is the client port "
    f"(default {CLIENT_PORT_DEFAULT}); the peer "
    "(Raft) port is PORT+1. The names or addresses are the ones clients and peers dial and "
    "what the TLS certificates name.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=_OUT_HELP,
)
@click.option("--name", default="quorumq", show_default=True, help="The cluster's name.")
@click.option(
    "--bind",
    default=None,
    metavar="ADDRESS",
    help="The address every node listens on (default: each node's own host; 0.0.0.0 when a "
    "host's name or address is not on one of its interfaces, behind NAT).",
)
@click.option(
    "--fsync",
    type=click.Choice(FSYNC_POLICIES),
    default="batch",
    show_default=True,
    help="When nodes fsync their journal (docs/cluster.md; batch: once per batch of entries).",
)
@output_option
@click.pass_context
@translate_errors
def init(
    ctx: click.Context, hosts: str, out: Path, name: str, bind: str | None, fsync: str
) -> None:
    """Write one bundle per host, a client bundle and the CA, for nodes on separate machines.

    \b
    OUT/n1, OUT/n2, ...  one per host, in --hosts order: copy each to its host only
                         (cluster.toml, secret, tls/ca.crt and that node's key pair)
    OUT/client           ca.crt, client.key, endpoints, client.env: for client machines
    OUT/authority        the CA key and the secret: keep it off the nodes (it issues
                         bundles for new hosts: `quorumq cluster add-host`)

    TLS is on (peers: mutual TLS 1.3; clients verify the nodes against ca.crt).
    Then on each host: `quorumq node start --bundle DIR` (docs/deploy.md, step by step).

    \b
    Example:
      quorumq cluster init --hosts 10.0.0.1,10.0.0.2,10.0.0.3 --out ./qq-bundles
      scp -rp ./qq-bundles/n1 root@10.0.0.1:/var/lib/quorumq    # and n2, n3 likewise
      quorumq node start --bundle /var/lib/quorumq              # on 10.0.0.1
      cd ./qq-bundles/client && set -a && . ./client.env && quorumq cluster status
    """
    specs = _hosts(hosts)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"--out {out} is not an empty directory: give a new one", CANT_CREATE)
    policy: FsyncPolicy = fsync  # type: ignore[assignment]  # (click checked the choice)
    config = init_bundles(out, specs, name=name, bind=bind, fsync=policy)
    rows = [
        {
            "node": node.id,
            "bundle": str(out / node.id),
            "client": node.client_address,
            "peer": node.raft_address,
        }
        for node in config.nodes
    ]
    if output_format(ctx) != "table":
        emit(ctx, rows)
        return
    for row in rows:
        click.echo(f"{row['node']}: {row['bundle']}  (client {row['client']}, peer {row['peer']})")
    click.echo(f"client bundle: {out / CLIENT_DIR}")
    click.echo(f"CA key and secret: {out / AUTHORITY_DIR} (keep it off the nodes)")


def _hosts(text: str) -> list[HostSpec]:
    try:
        return parse_hosts(text)
    except HostListError as err:
        raise CliError(f"--hosts: {err}", USAGE) from err


@click.command("add-host")
@click.argument("host", metavar="HOST[:PORT]")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help=_OUT_HELP,
)
@click.option("--bind", default=None, metavar="ADDRESS", help="As for `cluster init`.")
@output_option
@click.pass_context
@translate_errors
def add_host(ctx: click.Context, host: str, out: Path, bind: str | None) -> None:
    """Issue a bundle for one more node (the next id) from OUT/authority, to replace or add one.

    The running members learn of it only through `member add` (docs/cluster.md: remove a dead
    member first, add a live one's replacement before removing it).

    \b
    Example:
      quorumq cluster add-host 10.0.0.4 --out ./qq-bundles      # writes ./qq-bundles/n4
      quorumq member add n4 --raft-address 10.0.0.4:5702 --client-address 10.0.0.4:5701
    """
    try:
        spec = parse_host(host)
    except HostListError as err:
        raise CliError(f"HOST: {err}", USAGE) from err
    try:
        node = add_node_bundle(out, spec, bind)
    except HostListError as err:
        raise CliError(str(err), USAGE) from err
    row = {
        "node": node.id,
        "bundle": str(out / node.id),
        "client": node.client_address,
        "peer": node.raft_address,
    }
    if output_format(ctx) != "table":
        emit(ctx, row)
        return
    click.echo(
        f"{node.id}: {out / node.id}  (client {node.client_address}, peer {node.raft_address})"
    )
    click.echo(
        f"then: quorumq member add {node.id} --raft-address {node.raft_address} "
        f"--client-address {node.client_address}"
    )
