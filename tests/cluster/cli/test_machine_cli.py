"""`quorumq machine ...` and `quorumq log export`: help, validation and exit codes (no cluster)."""

from __future__ import annotations

import socket
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pysyncobj.journal import FileJournal

from cluster.cli.exits import CliError
from cluster.cli.main import cli
from cluster.launcher import init_cluster
from raft.logfile import read_log

COMMANDS = [["machine"], ["machine", "status"], ["machine", "upgrade"], ["log"], ["log", "export"]]


def exit_code(*args: str) -> tuple[int, str]:
    """Run like `main()` does: CliError and usage errors become sysexits codes."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if isinstance(result.exception, click.UsageError):
        return 64, result.exception.format_message()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    code, output = exit_code(*command, "--help")
    assert code == 0
    assert "quorumq" in output.split("Example:")[1]


def test_an_unknown_target_version_is_a_usage_error_before_any_connection(tmp_path: Path) -> None:
    code, message = exit_code("--data-dir", str(tmp_path), "machine", "upgrade", "--to", "9")
    assert code == 64 and "knows versions" in message


def test_dry_run_options_without_dry_run_are_a_usage_error(tmp_path: Path) -> None:
    code, message = exit_code("--data-dir", str(tmp_path), "machine", "upgrade", "--every", "3")
    assert code == 64 and "--dry-run" in message


def test_dry_run_without_a_log_is_a_usage_error() -> None:
    code, message = exit_code("machine", "upgrade", "--dry-run", "--to", "2")
    assert code == 64 and "--log" in message


def test_every_must_be_positive(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"")
    code, _ = exit_code("machine", "upgrade", "--dry-run", "--log", str(log), "--every", "0")
    assert code == 64


def test_machine_status_with_nothing_listening_is_unavailable(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    key = tmp_path / "key"
    key.write_text("ab" * 32)
    endpoint = f"127.0.0.1:{port}"
    code, _ = exit_code("--endpoints", endpoint, "--credentials", str(key), "machine", "status")
    assert code == 69


def test_log_export_needs_an_out_file_and_a_data_dir(tmp_path: Path) -> None:
    assert exit_code("log", "export", "--data-dir", str(tmp_path))[0] == 64
    code, message = exit_code("log", "export", "--out", str(tmp_path / "o.log"))
    assert code == 64 and "--data-dir" in message
    code, message = exit_code(
        "log", "export", "--data-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "o")
    )
    assert code == 66


def test_log_export_of_an_unknown_node_or_a_cluster_without_journals(tmp_path: Path) -> None:
    init_cluster(tmp_path / "D", 3)
    out = str(tmp_path / "o.log")
    code, message = exit_code(
        "log", "export", "--data-dir", str(tmp_path / "D"), "--node", "n9", "--out", out
    )
    assert code == 64 and "n9" in message
    code, message = exit_code("log", "export", "--data-dir", str(tmp_path / "D"), "--out", out)
    assert code == 66 and "no node" in message
    code, message = exit_code(
        "log",
        "export",
        "--data-dir",
        str(tmp_path / "D"),
        "--node",
        "n1",
        "--out",
        str(tmp_path / "nodir" / "o.log"),
    )
    assert code == 73


def test_log_export_picks_the_node_with_the_longest_journal(tmp_path: Path) -> None:
    config = init_cluster(tmp_path / "D", 3)
    for node, entries in zip(config.nodes, (2, 5, 3), strict=True):
        journal = FileJournal(str(node.data_dir / "raft.journal"))
        for index in range(1, entries + 1):
            journal.add(b"\x01", index, 1)  # pysyncobj no-ops
        journal._destroy()
    out = tmp_path / "o.log"
    code, output = exit_code("log", "export", "--data-dir", str(tmp_path / "D"), "--out", str(out))
    assert code == 0, output
    assert "exported n2: 5 entries [1..5]" in output
    assert len(list(read_log(out))) == 1 + 5 + 1
