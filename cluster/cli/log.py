"""`quorumq log export`: write a node's replicated log as a CBOR sequence (raft/logfile.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cluster.cli.common import (
    data_dir_option,
    emit,
    load_config,
    output_format,
    output_option,
    resolve_data_dir,
    translate_errors,
)
from cluster.cli.exits import CANT_CREATE, DATA, NO_INPUT, USAGE, CliError
from cluster.cli.machine import progress_bar
from cluster.config import ClusterConfig
from raft.export import JOURNAL_FILE, ExportError, ExportSummary, export_to_file, journal_bounds


@click.group("log")
def log_group() -> None:
    """Export the replicated log, for the upgrade dry-run and offline analysis.

    \b
    Example:
      quorumq log export --data-dir /tmp/qq --out /tmp/qq.log
      quorumq machine upgrade --dry-run --log /tmp/qq.log --to 2
    """


@log_group.command("export")
@data_dir_option
@click.option(
    "--node",
    "node_id",
    default=None,
    help="Node whose journal to read (default: the one with the longest log).",
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Output file (CBOR sequence, see docs/upgrades.md).",
)
@output_option
@click.pass_context
@translate_errors
def export(ctx: click.Context, local_data_dir: Path | None, node_id: str | None, out: Path) -> None:
    """Write a node's log (snapshot, commands with their meta, hello and upgrade entries).

    Reads the node's journal and dump from disk, so it works on a running or a stopped node;
    streaming, with a progress bar on a terminal. Entries above the node's saved commit index
    are flagged `uncommitted`.

    \b
    Example:
      quorumq log export --data-dir /tmp/qq --node n1 --out /tmp/qq.log
    """
    data_dir = resolve_data_dir(ctx, local_data_dir)
    config = load_config(data_dir)
    node = _pick_node(config, node_id)
    node_dir = config.node(node).data_dir
    node_dir = node_dir if node_dir.is_absolute() else data_dir / node_dir
    if not out.parent.exists():
        raise CliError(f"cannot write {out}: {out.parent} does not exist", CANT_CREATE)
    try:
        with progress_bar(f"exporting {node}") as progress:
            summary = export_to_file(node_dir, node, list(config.node_ids()), out, progress)
    except ExportError as err:
        raise CliError(f"{node}: {err}", DATA) from err
    except OSError as err:
        raise CliError(f"cannot write {out}: {err}", CANT_CREATE) from err
    row = _summary_row(summary, out)
    if output_format(ctx) != "table":
        emit(ctx, row)
        return
    _print_summary(summary, node, out)


def not_exported(summary: ExportSummary) -> str | None:
    """What the export lacks: the entries compacted into the node's snapshot (None: nothing)."""
    if not summary.snapshot_index:
        return None
    text = (
        f"not exported: the commands of entries 1..{summary.snapshot_index}, compacted into "
        f"{summary.node}'s snapshot (the export starts from that state)"
    )
    if summary.commands == 0:
        text += (
            "; this export holds 0 commands: a dry run or an analysis of it has nothing to "
            "check (docs/upgrades.md, 'Keeping traffic for a dry run')"
        )
    return text


def _print_summary(summary: ExportSummary, node: str, out: Path) -> None:
    first = summary.first_index if summary.first_index is not None else "-"
    snap = f"snapshot at {summary.snapshot_index} + " if summary.snapshot_index else ""
    click.echo(
        f"exported {node}: {snap}{summary.entries} entries [{first}..{summary.last_index}] "
        f"({summary.commands} commands, {summary.hellos} hello, {summary.upgrades} upgrade) "
        f"to {out}, {summary.bytes_written:,} bytes; machine v{summary.effective_version}, "
        f"digest {summary.digest[:12]}"
    )
    lacking = not_exported(summary)
    if lacking is not None:
        click.echo(lacking)


def _pick_node(config: ClusterConfig, node_id: str | None) -> str:
    if node_id is not None:
        if node_id not in config.node_ids():
            raise CliError(f"no node {node_id!r} (have {config.node_ids()})", USAGE)
        return node_id
    best: tuple[int, str] | None = None
    for node in config.nodes:
        journal = node.data_dir / JOURNAL_FILE
        if not journal.exists():
            continue
        try:
            last = journal_bounds(journal)[1]
        except ExportError:
            continue
        if best is None or last > best[0]:
            best = (last, node.id)
    if best is None:
        raise CliError("no node of this cluster has a journal yet", NO_INPUT)
    return best[1]


def _summary_row(summary: ExportSummary, out: Path) -> dict[str, Any]:
    return {
        "node": summary.node,
        "out": str(out),
        "snapshot_index": summary.snapshot_index,
        "not_exported": not_exported(summary),
        "first_index": summary.first_index,
        "last_index": summary.last_index,
        "commit_index": summary.commit_index,
        "entries": summary.entries,
        "commands": summary.commands,
        "hellos": summary.hellos,
        "upgrades": summary.upgrades,
        "effective_version": summary.effective_version,
        "digest": summary.digest,
        "bytes": summary.bytes_written,
    }
