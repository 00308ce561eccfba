"""`quorumq machine status|upgrade`: the replicated machine version, upgrades and their dry-run."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

import fifo
from cluster.cli.common import connect, connection_options, emit, output_format, translate_errors
from cluster.cli.exits import DATA, FAILURE, NO_INPUT, USAGE, CliError
from cluster.client.errors import CommandRefused
from raft.dryrun import DryRunReport, SplitResult, dry_run
from raft.logfile import LogFileError

Progress = Callable[[int, int], None]


@click.group("machine")
def machine_group() -> None:
    """Show and upgrade the replicated state machine's version.

    \b
    Example:
      quorumq --data-dir /tmp/qq machine status
      quorumq --data-dir /tmp/qq machine upgrade --to 2
      quorumq machine upgrade --dry-run --log /tmp/qq.log --to 2
    """


@machine_group.command("status")
@connection_options
@click.pass_context
@translate_errors
def status(ctx: click.Context) -> None:
    """Show the effective version, each node's supported version and every past switch.

    Each member's supported version is the one it recorded through the log when it started;
    `refused` lists nodes whose code is older than the effective version.

    \b
    Example:
      quorumq --data-dir /tmp/qq machine status
      quorumq --data-dir /tmp/qq -o json machine status
    """
    with connect(ctx) as client:
        machine: dict[str, Any] = dict(client.machine())
    if output_format(ctx) != "table":
        emit(ctx, machine)
        return
    click.echo(f"effective machine version: {machine.get('effective_version')}")
    target = machine.get("upgrade_target")
    click.echo(f"upgrade possible now to: {target if target is not None else '-'}")
    click.echo("")
    emit(ctx, _node_rows(machine), ["node", "supported", "refused"])
    click.echo("")
    switches = machine.get("switches") or []
    click.echo("switches:" if switches else "switches: none (running the initial version)")
    if switches:
        emit(ctx, list(switches), ["index", "version"])


def _node_rows(machine: dict[str, Any]) -> list[dict[str, Any]]:
    supported = machine.get("supported") or {}
    refused = machine.get("refused") or {}
    members = list(machine.get("members") or supported)
    return [
        {"node": node, "supported": supported.get(node), "refused": refused.get(node)}
        for node in members
    ]


@machine_group.command("upgrade")
@click.option(
    "--to",
    "to_version",
    type=click.IntRange(1, None),
    default=None,
    help=f"Target version (default: the latest this code knows, {fifo.LATEST_VERSION}).",
)
@click.option("--dry-run", is_flag=True, help="Replay an exported log instead (no cluster).")
@click.option(
    "--log",
    "log_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Exported log (quorumq log export) for --dry-run.",
)
@click.option(
    "--every",
    type=click.IntRange(1, None),
    default=None,
    help="Dry-run: upgrade before every k-th command entry (default: at most 32 split points).",
)
@connection_options
@click.pass_context
@translate_errors
def upgrade(
    ctx: click.Context,
    to_version: int | None,
    dry_run: bool,
    log_file: Path | None,
    every: int | None,
) -> None:
    """Upgrade the cluster's machine now, or prove on a recorded log that it is safe.

    Without --dry-run: asks the leader to append the upgrade entry; refused (exit 65) with the
    reason while a member does not support the target. With --dry-run: replays the log as it
    ran and, from every k-th entry, upgraded; exits 0 only when safe, 1 otherwise.

    \b
    Example:
      quorumq --data-dir /tmp/qq machine upgrade --to 2
      quorumq machine upgrade --dry-run --log /tmp/qq.log --to 2 --every 10
    """
    target = to_version if to_version is not None else fifo.LATEST_VERSION
    _check_target(target, dry_run)
    if dry_run:
        _dry_run(ctx, log_file, target, every)
        return
    if log_file is not None or every is not None:
        raise CliError("--log and --every go with --dry-run", USAGE)
    with connect(ctx) as client:
        before = client.machine().get("effective_version")
        try:
            result = dict(client.admin("machine_upgrade", {"to": target}, timeout_s=15.0))
        except CommandRefused as err:
            raise CliError(f"upgrade refused: {err.message}", DATA) from err
    result["previous_version"] = before
    if output_format(ctx) != "table":
        emit(ctx, result)
    elif result.get("changed"):
        click.echo(f"upgraded the machine from version {before} to {result['effective_version']}")
    else:
        click.echo(f"already at machine version {result.get('effective_version')}; nothing to do")


def _check_target(target: int, dry_run: bool) -> None:
    """A usage error unless `target` is released, or unreleased in a dry run with the flag a
    node needs to run it (cluster.node.server.UNRELEASED_FLAG)."""
    from cluster.node.server import UNRELEASED_FLAG

    allowed = fifo.SUPPORTED_VERSIONS
    if dry_run and os.environ.get(UNRELEASED_FLAG) == "1":
        allowed = (*allowed, *fifo.UNRELEASED_VERSIONS)
    if target not in allowed:
        raise CliError(
            f"--to {target}: this code knows versions {fifo.SUPPORTED_VERSIONS} (a dry run to "
            f"unreleased {fifo.UNRELEASED_VERSIONS} only with {UNRELEASED_FLAG}=1)",
            USAGE,
        )


# --- dry-run -------------------------------------------------------------------------------------


def _dry_run(ctx: click.Context, log_file: Path | None, target: int, every: int | None) -> None:
    if log_file is None:
        raise CliError("--dry-run needs --log FILE (from: quorumq log export)", USAGE)
    if not log_file.exists():
        raise CliError(f"log file {log_file} does not exist", NO_INPUT)
    try:
        with progress_bar("replaying") as progress:
            report = dry_run(log_file, target, every, progress)
    except LogFileError as err:
        raise CliError(f"{log_file}: {err}", DATA) from err
    if report.commands == 0:
        raise CliError(nothing_to_check(str(log_file), "a dry run"), DATA)
    if output_format(ctx) != "table":
        emit(ctx, report.to_plain())
    else:
        _print_report(ctx, report)
    if not report.safe:
        raise CliError(_unsafe_summary(report), FAILURE)


@contextmanager
def progress_bar(label: str) -> Iterator[Progress | None]:
    """A rich progress bar on stderr when it is a terminal; None otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress as RichProgress

    with RichProgress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _print_report(ctx: click.Context, report: DryRunReport) -> None:
    click.echo(
        f"dry-run of {report.log}: {report.entries} entries, {report.commands} commands, "
        f"v{report.from_version} -> v{report.to_version} before every {report.every} "
        f"command entries ({len(report.splits)} split points)"
    )
    emit(ctx, [_split_row(s) for s in report.splits], list(_split_row(report.splits[0])))
    for split in report.splits:
        for example in split.new_error_examples[:2]:
            click.echo(f"  split {split.index}: new error reply: {example}")
        for error in split.errors[:3]:
            click.echo(f"  split {split.index}: error: {error}")
    for error in report.baseline_errors[:3]:
        click.echo(f"baseline error: {error}")
    differing = sum(s.replies_differ for s in report.splits)
    first = next((s.differences[0] for s in report.splits if s.differences), None)
    if first is not None:
        click.echo(f"{differing} differing replies in all; first: {first}")
    if all(split.status == "skipped" for split in report.splits):
        click.echo(f"every split point is skipped: this log already runs v{report.to_version}")
    verdict = "SAFE" if report.safe else "UNSAFE"
    digest = report.baseline_digest[:12]
    click.echo(
        f"{verdict}: upgrade to v{report.to_version} (checked {report.commands} commands at "
        f"{len(report.splits)} split points; baseline digest {digest})"
    )


def nothing_to_check(log: str, what: str) -> str:
    """Why an export without commands cannot be judged (a dry run, an analysis)."""
    return (
        f"{log} holds 0 commands: nothing to check, so {what} cannot call it safe or say "
        "anything of its traffic. A node compacts its log into a snapshot every 5 minutes (or "
        "every snapshot_every_entries entries), and an export keeps only what came after; "
        "export right after representative traffic, or keep it as docs/upgrades.md "
        "('Keeping traffic for a dry run') says"
    )


def _split_row(split: SplitResult) -> dict[str, Any]:
    def pair(name: str) -> str:
        before, after = split.before.get(name, "-"), split.after.get(name, "-")
        return f"{before}" if before == after else f"{before}->{after}"

    return {
        "index": split.index,
        "status": split.status,
        "total": pair("total"),
        "ready": pair("ready"),
        "consumers": pair("consumers"),
        "enqueuers": pair("enqueuers"),
        "replies_differ": split.replies_differ,
        "new_errors": split.new_errors,
        "errors": len(split.errors),
    }


def _unsafe_summary(report: DryRunReport) -> str:
    unsafe = [s for s in report.splits if s.status == "unsafe"]
    reasons = []
    if report.baseline_errors:
        reasons.append(f"the baseline replay failed: {report.baseline_errors[0]}")
    if unsafe:
        first = unsafe[0]
        why = "counters changed" if not first.conserved else "errors or new error replies"
        reasons.append(f"{len(unsafe)} unsafe split points (first at index {first.index}: {why})")
    return "upgrade is NOT safe: " + "; ".join(reasons)
