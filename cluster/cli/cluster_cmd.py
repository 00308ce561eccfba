"""`quorumq cluster start|stop|status`: run a local cluster and look at its nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import click

from cluster.cli.common import (
    cli_context,
    connection_args,
    data_dir_option,
    emit,
    grace_option,
    load_config,
    max_machine_version_option,
    output_format,
    output_option,
    resolve_data_dir,
    tls_context,
    translate_errors,
    wait_timeout_option,
)
from cluster.cli.exits import FAILURE, UNAVAILABLE, USAGE, CliError
from cluster.config import CONFIG_FILE, FSYNC_POLICIES, ClusterConfig, FsyncPolicy, NodeConfig
from cluster.launcher import (
    LocalCluster,
    client_key,
    cluster_status,
    node_status,
    start_cluster,
    stop_cluster,
)

DEFAULT_NODES = 3
STATUS_COLUMNS = [
    "id",
    "address",
    "role",
    "term",
    "commit_index",
    "last_applied",
    "effective_machine_version",
    "supported_machine_version",
    "digest",
    "pid",
]


@click.group("cluster")
def cluster_group() -> None:
    """Start, stop and inspect a local cluster.

    \b
    Example:
      quorumq cluster start --nodes 3 --data-dir /tmp/qq
      quorumq cluster status --data-dir /tmp/qq
      quorumq cluster stop --data-dir /tmp/qq
    """


@cluster_group.command("start")
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=None,
    help="Number of nodes of a new cluster [default: 3]. An existing cluster keeps its own "
    "(a different number is refused: `quorumq member add` adds a node).",
)
@data_dir_option
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65000),
    default=None,
    help="First port: node i uses base+2i (raft), base+2i+1 (client) and base+2n+i (AMQP, "
    "n nodes). Default: free ephemeral ports.",
)
@max_machine_version_option("Cap the machine version every node supports (emulates older code).")
@click.option(
    "--fsync",
    type=click.Choice(FSYNC_POLICIES),
    default=None,
    help="Journal fsync policy of a new cluster (default: batch, safe).",
)
@click.option(
    "--metrics-base-port",
    type=click.IntRange(1024, 65535),
    default=None,
    help="Prometheus metrics of a new cluster: node i serves 127.0.0.1:(base+i)/metrics "
    "(metrics_port in cluster.toml). Default: off.",
)
@click.option(
    "--http-base-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Management API and web UI of a new cluster: node i serves http://127.0.0.1:(base+i)/ "
    "(http_port in cluster.toml; 0: free ports). Default: off.",
)
@click.option(
    "--tls",
    is_flag=True,
    default=False,
    help="Encrypt a new cluster's traffic with TLS: the peer (Raft) traffic with mutual TLS, "
    "the client ports with each node's certificate (clients verify it with DATA_DIR/tls/ca.crt: "
    "found by --data-dir, given by --tls-ca FILE with --endpoints). Writes tls = true to "
    "cluster.toml and creates a cluster CA and one certificate per node in DATA_DIR/tls. "
    "An existing cluster keeps its own setting (edit cluster.toml to change it).",
)
@wait_timeout_option("Seconds to wait for a leader.")
@output_option
@click.pass_context
@translate_errors
def start(
    ctx: click.Context,
    nodes: int | None,
    local_data_dir: Path | None,
    base_port: int | None,
    max_machine_version: int | None,
    fsync: str | None,
    metrics_base_port: int | None,
    http_base_port: int | None,
    tls: bool,
    timeout_s: float,
) -> None:
    """Start the nodes of a cluster in the background, wait until each answers and a leader is
    elected.

    A new data dir gets cluster.toml, secret and client.key (both 0600); a stopped cluster's
    data dir is restarted with its own config; of a cluster with some nodes down, the nodes
    that are down are started (the others are left alone). A node that cannot start is named,
    with the end of its stderr.log, and the command exits 69.

    With tls = true in cluster.toml (--tls for a new cluster), the first start creates
    DATA_DIR/tls: ca.crt, ca.key and NODE.crt/NODE.key (keys 0600); later starts reuse them
    and refuse a set that is incomplete or does not match.

    \b
    Example:
      quorumq cluster start --nodes 3 --data-dir /tmp/qq
      quorumq cluster start --nodes 3 --data-dir /tmp/qq --metrics-base-port 9419
      quorumq cluster start --nodes 3 --data-dir /tmp/qq --http-base-port 15672
      quorumq cluster start --nodes 3 --data-dir /tmp/qq-tls --tls
    """
    data_dir = resolve_data_dir(ctx, local_data_dir)
    _check_node_count(data_dir, nodes)
    cluster = start_cluster(
        data_dir,
        nodes or DEFAULT_NODES,
        base_port=base_port,
        max_machine_version=max_machine_version,
        fsync=cast(FsyncPolicy | None, fsync),
        timeout_s=timeout_s,
        metrics_base_port=metrics_base_port,
        tls=tls,
        http_base_port=http_base_port,
    )
    leader = cluster.leader(timeout_s=timeout_s)
    rows = [
        {"id": n.id, "endpoint": n.client_address, "raft": n.raft_address, "leader": n.id == leader}
        for n in cluster.config.nodes
    ]
    if output_format(ctx) == "table":
        _print_started(ctx, cluster, leader, rows)
    else:
        emit(
            ctx,
            {
                "data_dir": str(cluster.data_dir),
                "leader": leader,
                "nodes": rows,
                "started": cluster.started,
            },
        )


def _print_started(
    ctx: click.Context, cluster: LocalCluster, leader: str, rows: list[dict[str, Any]]
) -> None:
    """`cluster start`'s table output: the nodes, endpoints, credentials, TLS and metrics."""
    config, data_dir = cluster.config, cluster.data_dir
    click.echo(f"cluster {config.name} started in {data_dir}, leader {leader}")
    if len(cluster.started) < len(config.nodes):
        running = [n.id for n in config.nodes if n.id not in cluster.started]
        click.echo(f"started {', '.join(cluster.started)} ({', '.join(running)} were running)")
    emit(ctx, rows, ["id", "endpoint", "raft", "leader"])
    endpoints = ",".join(n.client_address for n in config.nodes)
    click.echo(f"\nendpoints: {endpoints}")
    click.echo(f"credentials: {data_dir / 'client.key'}")
    amqp = [f"{n.host}:{n.amqp_port}" for n in config.nodes if n.amqp_port]
    if amqp:
        scheme = "amqps" if config.tls else "amqp"
        click.echo(f"{scheme}: {','.join(amqp)} (user quorumq, password: the client key)")
    if config.tls:
        tls_dir = data_dir / "tls"
        click.echo(
            f"TLS: on for peer and client traffic (CA and node certificates in {tls_dir}; "
            f"clients verify the nodes with {tls_dir / 'ca.crt'}: --tls-ca with --endpoints)"
        )
    _echo_http_urls(config)


def _check_node_count(data_dir: Path, nodes: int | None) -> None:
    """Refuse (64) a --nodes that differs from the size of the cluster already in `data_dir`."""
    if nodes is None or not (data_dir / CONFIG_FILE).exists():
        return
    members = load_config(data_dir).node_ids()
    if nodes != len(members):
        raise CliError(
            f"{data_dir} holds a cluster of {len(members)} nodes ({', '.join(members)}); "
            f"--nodes {nodes} cannot change that. Start it without --nodes; to grow it, add "
            "members one at a time with `quorumq member add ID --raft-address HOST:PORT "
            "--client-address HOST:PORT` and start each with `quorumq node start ID`",
            USAGE,
        )


def _echo_http_urls(config: ClusterConfig) -> None:
    """The nodes' /metrics and management URLs, when they serve them."""
    bind = config.metrics_bind
    metrics = [f"http://{bind}:{n.metrics_port}/metrics" for n in config.nodes if n.metrics_port]
    if metrics:
        click.echo(f"metrics: {', '.join(metrics)}")
    http = [f"http://{config.http_bind}:{n.http_port}/" for n in config.nodes if n.http_port]
    if http:
        click.echo(f"management: {', '.join(http)} (user admin, password: the client key)")


@cluster_group.command("stop")
@data_dir_option
@grace_option
@output_option
@click.pass_context
@translate_errors
def stop(ctx: click.Context, local_data_dir: Path | None, grace_s: float) -> None:
    """Stop every node of the cluster (SIGTERM, then SIGKILL after the grace period).

    \b
    Example:
      quorumq cluster stop --data-dir /tmp/qq
    """
    config = load_config(resolve_data_dir(ctx, local_data_dir))
    stopped = stop_cluster(config, grace_s)
    if output_format(ctx) == "table":
        click.echo(f"stopped {', '.join(stopped)}" if stopped else "no node was running")
    else:
        emit(ctx, {"stopped": stopped})


@cluster_group.command("status")
@data_dir_option
@click.option("--full-digest", is_flag=True, help="Show whole digests in the table.")
@click.option(
    "--digest",
    "force_digest",
    is_flag=True,
    help="Compute every node's digest even when it holds more than 50,000 messages (each node "
    "stalls about 2 us per message held while it encodes its state).",
)
@output_option
@click.pass_context
@translate_errors
def status(
    ctx: click.Context, local_data_dir: Path | None, full_digest: bool, force_digest: bool
) -> None:
    """Show every node: role, term, commit index, last applied, versions, digest and pid.

    Unreachable nodes are listed as down. Exits 69 when no node answers, 1 (naming the nodes)
    when two nodes that applied the same index have different digests. A node holding more than
    50,000 messages shows no digest (encoding its state would stall it) unless --digest.

    Without a data dir, asks each of --endpoints with --credentials.

    \b
    Example:
      quorumq cluster status --data-dir /tmp/qq
      quorumq -o json cluster status --data-dir /tmp/qq
      quorumq --endpoints 127.0.0.1:7001,127.0.0.1:7003 --credentials key cluster status
    """
    if local_data_dir is None and cli_context(ctx).data_dir is None and cli_context(ctx).endpoints:
        rows = _status_by_endpoints(ctx, force_digest)
    else:
        data_dir = resolve_data_dir(ctx, local_data_dir)
        config = load_config(data_dir)
        tls = tls_context(ctx, data_dir, config)
        rows = cluster_status(config, client_key(data_dir), tls=tls, digest=force_digest)
    divergence = digest_divergence(rows)
    if output_format(ctx) == "table" and not full_digest:
        rows = [_short_digest(row) for row in rows]
    columns = list(STATUS_COLUMNS)
    if any(row.get("memory_alarm") for row in rows):  # a node refusing publishes: memory_alarm
        columns.append("memory_alarm")
    if any(row.get("reason") for row in rows):  # a node that stopped applying says why
        columns.append("reason")
    emit(ctx, rows, columns)
    if all(row.get("role") == "down" for row in rows):
        raise CliError("no node of the cluster is reachable", UNAVAILABLE)
    if divergence:
        raise CliError(divergence, FAILURE)


def digest_divergence(rows: list[dict[str, Any]]) -> str | None:
    """A message naming the nodes whose digest differs from the others' at the same applied
    index (replicas must agree there), or None."""
    by_index: dict[Any, dict[str, list[str]]] = {}
    for row in rows:
        index, digest = row.get("last_applied"), row.get("digest")
        if isinstance(index, int) and isinstance(digest, str):
            by_index.setdefault(index, {}).setdefault(digest, []).append(str(row.get("id")))
    problems = []
    for index, digests in sorted(by_index.items()):
        if len(digests) < 2:
            continue
        groups = sorted(digests.items(), key=lambda item: (-len(item[1]), item[0]))
        odd = [node for _digest, nodes in groups[1:] for node in nodes]
        described = "; ".join(f"{', '.join(nodes)}: {d[:16]}" for d, nodes in groups)
        problems.append(
            f"replicas disagree at applied index {index}: {', '.join(odd)} differ ({described}); "
            f"rebuild a diverged node from its peers with `quorumq node recover ID`"
        )
    return "\n".join(problems) or None


def _status_by_endpoints(ctx: click.Context, digest: bool) -> list[dict[str, Any]]:
    endpoints, key = connection_args(ctx)
    tls = tls_context(ctx)
    rows = []
    for number, endpoint in enumerate(endpoints, start=1):
        host, _, port = endpoint.rpartition(":")
        probe = NodeConfig(f"endpoint{number}", host, 1, int(port), Path("."))
        row = node_status(probe, key, tls=tls, digest=digest) or {
            "address": endpoint,
            "role": "down",
        }
        rows.append({"id": "?", "address": endpoint, **row})
    return rows


def _short_digest(row: dict[str, Any]) -> dict[str, Any]:
    digest = row.get("digest")
    return {**row, "digest": digest[:12]} if isinstance(digest, str) else row


from cluster.cli.init_cmd import add_host, init  # noqa: E402  (bundles for separate hosts)

cluster_group.add_command(init)
cluster_group.add_command(add_host)
