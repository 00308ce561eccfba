"""Which nodes of the cluster answer: said alongside a "no quorum" error (as `cluster status`
knows it, in the time of one short probe per node, made in parallel)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from cluster import config as cluster_config
from cluster.cli.common import cli_context, tls_context
from cluster.cli.exits import CliError
from cluster.client.errors import ClusterError
from cluster.config import NodeConfig
from cluster.launcher import node_status

PROBE_TIMEOUT_S = 0.5
PROBES_MAX = 16  # probes in parallel (a cluster has a handful of nodes)


def _nodes(ctx: click.Context) -> tuple[list[tuple[str, NodeConfig]], bytes] | None:
    """(label, node) per node to probe, with the client key; None when they cannot be told."""
    options = cli_context(ctx)
    if options.endpoints:
        if not options.credentials:
            return None
        key = cluster_config.read_client_key(Path(options.credentials))
        nodes = []
        for endpoint in options.endpoints.split(","):
            host, _, port = endpoint.strip().rpartition(":")
            nodes.append((endpoint.strip(), NodeConfig("?", host, 1, int(port), Path("."))))
        return nodes, key
    if options.data_dir is None:
        return None
    config = cluster_config.load(options.data_dir)
    key_path = Path(options.credentials or options.data_dir / cluster_config.CLIENT_KEY_FILE)
    key = cluster_config.read_client_key(key_path)
    return [(node.id, node) for node in config.nodes], key


def reachability(ctx: click.Context) -> str | None:
    """`n1 up; unreachable: n2, n3` for the cluster the command was given (None: unknown)."""
    try:
        found = _nodes(ctx)
        if found is None:
            return None
        nodes, key = found
        tls = tls_context(ctx)
        with ThreadPoolExecutor(max_workers=min(PROBES_MAX, max(1, len(nodes)))) as pool:
            answers = list(
                pool.map(lambda item: node_status(item[1], key, PROBE_TIMEOUT_S, tls), nodes)
            )
    except (ClusterError, CliError, OSError, ValueError, click.ClickException):
        return None
    up = [label for (label, _), status in zip(nodes, answers, strict=True) if status]
    down = [label for (label, _), status in zip(nodes, answers, strict=True) if not status]
    if not down:
        return f"all {len(nodes)} nodes answer, none has a leader (an election under way?)"
    return f"{len(up)} of {len(nodes)} nodes up ({', '.join(up) or 'none'}); unreachable: " + (
        ", ".join(down)
    )
