"""Issue 34, item 8: a log export with no commands (its traffic compacted into the snapshot) is
never called "SAFE" by the upgrade dry run nor analysed into an empty report; the analytics
prefer an export that holds commands over one that only has a higher commit index."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import fifo
from cluster.cli.exits import DATA, CliError
from cluster.cli.main import cli
from pipeline.logscan import pick_log
from pipeline.workload import write_log
from raft.logfile import EndRecord, Header, LogWriter


def write_empty_export(path: Path, node: str = "n1", commit_index: int = 5000) -> None:
    """An export as a node writes it right after a snapshot: no entry, no command."""
    with LogWriter.open(path) as writer:
        writer.write(Header(node, "test", commit_index, 0))
        end = fifo.digest(fifo.init_state(1))
        writer.write(EndRecord(0, 0, commit_index, 1, "", end))


def invoke(*args: str) -> tuple[int, str]:
    """(exit code, stdout + the error message), as `main` exits."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if isinstance(result.exception, click.UsageError):
        return 64, result.exception.format_message()
    if result.exception is not None:
        raise result.exception
    return 0, result.output


def test_a_dry_run_of_an_export_without_commands_is_refused_not_safe(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    write_empty_export(log)
    code, output = invoke("machine", "upgrade", "--dry-run", "--log", str(log), "--to", "2")
    assert code == DATA, output
    assert "SAFE" not in output.replace("NOT SAFE", "")
    assert "0 commands" in output and "docs/upgrades.md" in output


def test_a_dry_run_says_how_many_commands_it_checked(tmp_path: Path) -> None:
    from tests.raft.test_dryrun import write_log as write_v1_log

    log = tmp_path / "traffic.log"
    write_v1_log(log, steps=90)
    code, output = invoke("machine", "upgrade", "--dry-run", "--log", str(log), "--to", "2")
    assert code == 0, output
    assert "SAFE: upgrade to v2 (checked 92 commands" in output


def test_pick_log_prefers_an_export_with_commands_over_a_higher_commit_index(
    tmp_path: Path,
) -> None:
    write_log(tmp_path / "n1.log", 2_000, seed=1, services=1)
    write_empty_export(tmp_path / "n2.log", node="n2", commit_index=10**9)
    chosen, because = pick_log([tmp_path / "n1.log", tmp_path / "n2.log"])
    assert chosen == tmp_path / "n1.log"
    assert "commands" in because and "n2 (0 commands" in because


@pytest.mark.parametrize("as_directory", [False, True], ids=["file", "directory"])
def test_analyze_refuses_exports_without_commands_before_starting_spark(
    tmp_path: Path, as_directory: bool
) -> None:
    write_empty_export(tmp_path / "n1.log")
    if as_directory:
        write_empty_export(tmp_path / "n2.log", node="n2")
    target = tmp_path if as_directory else tmp_path / "n1.log"
    out = tmp_path / "out"
    code, output = invoke("pipeline", "analyze", "--log", str(target), "--out", str(out))
    assert code == DATA, output
    assert "starting spark" not in output
    assert "0 commands" in output
