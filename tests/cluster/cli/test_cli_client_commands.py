"""CLI validation, help and exit codes of the client-side commands (no cluster needed)."""

from __future__ import annotations

import socket
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cluster.cli.common import table
from cluster.cli.main import cli
from cluster.launcher import init_cluster

COMMANDS = [
    ["cluster"],
    ["cluster", "start"],
    ["cluster", "stop"],
    ["cluster", "status"],
    ["node"],
    ["node", "start"],
    ["node", "stop"],
    ["node", "restart"],
    ["queue"],
    ["queue", "declare"],
    ["queue", "list"],
    ["queue", "info"],
    ["queue", "purge"],
    ["queue", "delete"],
    ["publish"],
    ["consume"],
    ["consumer"],
    ["consumer", "list"],
    ["member"],
    ["member", "list"],
    ["member", "add"],
    ["member", "remove"],
    ["demo"],
    ["completion"],
]


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, standalone_mode=False)


def exit_code(*args: str) -> tuple[int, str]:
    """Run like `main()` does: CliError and usage errors become sysexits codes."""
    from cluster.cli.exits import CliError

    runner = CliRunner()
    result = runner.invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, str(result.exception)
    if isinstance(result.exception, click.UsageError):
        return 64, result.exception.format_message()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    result = run(*command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.output
    assert "quorumq" in result.output.split("Example:")[1]


def test_a_client_command_without_data_dir_or_endpoints_is_a_usage_error() -> None:
    code, message = exit_code("queue", "declare", "jobs")
    assert code == 64
    assert "--data-dir" in message


def test_endpoints_without_credentials_is_a_usage_error() -> None:
    code, message = exit_code("--endpoints", "127.0.0.1:5000", "queue", "list")
    assert code == 64
    assert "--credentials" in message


def test_a_malformed_endpoint_is_a_usage_error(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("ab" * 32)
    code, message = exit_code("--endpoints", "nohost", "--credentials", str(key), "queue", "list")
    assert code == 64
    assert "host:port" in message


def test_a_missing_credentials_file_is_no_input(tmp_path: Path) -> None:
    code, message = exit_code(
        "--endpoints", "127.0.0.1:5000", "--credentials", str(tmp_path / "nope"), "queue", "list"
    )
    assert code == 66
    assert "not found" in message


def test_a_missing_data_dir_is_no_input(tmp_path: Path) -> None:
    code, message = exit_code("--data-dir", str(tmp_path / "missing"), "queue", "list")
    assert code == 66
    assert "does not exist" in message


def test_size_and_body_together_are_refused_before_connecting(tmp_path: Path) -> None:
    code, message = exit_code(
        "--data-dir", str(tmp_path), "publish", "jobs", "--size", "10", "--body", "x"
    )
    assert code == 64
    assert "mutually exclusive" in message


def test_a_queue_cannot_dead_letter_into_itself(tmp_path: Path) -> None:
    code, message = exit_code(
        "--data-dir", str(tmp_path), "queue", "declare", "jobs", "--dead-letter-queue", "jobs"
    )
    assert code == 64
    assert "itself" in message


def test_bad_option_values_are_usage_errors(tmp_path: Path) -> None:
    assert (
        exit_code("--data-dir", str(tmp_path), "queue", "declare", "q", "--max-length", "-1")[0]
        == 64
    )
    assert exit_code("--data-dir", str(tmp_path), "publish", "q", "--window", "0")[0] == 64
    assert exit_code("--data-dir", str(tmp_path), "queue", "declare", "")[0] == 64


def test_member_add_validates_addresses_before_connecting(tmp_path: Path) -> None:
    code, message = exit_code(
        "--data-dir",
        str(tmp_path),
        "member",
        "add",
        "n4",
        "--raft-address",
        "x",
        "--client-address",
        "127.0.0.1:1",
    )
    assert code == 64
    assert "--raft-address" in message


def test_nothing_listening_is_unavailable(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on it now
    key = tmp_path / "key"
    key.write_text("ab" * 32)
    code, message = exit_code(
        "--endpoints", f"127.0.0.1:{port}", "--credentials", str(key), "queue", "list"
    )
    assert code == 69
    assert "no quorumq node reachable" in message


def test_cluster_start_refuses_a_non_empty_dir_without_a_cluster(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    code, message = exit_code("cluster", "start", "--data-dir", str(tmp_path))
    assert code == 73
    assert "not empty" in message


def test_status_of_a_stopped_cluster_shows_every_node_down(tmp_path: Path) -> None:
    init_cluster(tmp_path, 3)
    result = CliRunner().invoke(
        cli, ["-o", "json", "cluster", "status", "--data-dir", str(tmp_path)], standalone_mode=False
    )
    assert '"role": "down"' in result.output
    assert result.output.count('"role": "down"') == 3


def test_init_cluster_writes_config_secret_and_key_with_private_modes(tmp_path: Path) -> None:
    config = init_cluster(tmp_path, 3)
    assert [node.id for node in config.nodes] == ["n1", "n2", "n3"]
    ports = [p for node in config.nodes for p in (node.raft_port, node.client_port)]
    assert len(set(ports)) == 6
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "client.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "cluster.toml").exists()


def test_output_option_is_accepted_after_the_command(tmp_path: Path) -> None:
    init_cluster(tmp_path, 1)
    result = CliRunner().invoke(
        cli, ["cluster", "status", "--data-dir", str(tmp_path), "-o", "json"], standalone_mode=False
    )
    assert result.output.lstrip().startswith("[")


def test_completion_prints_the_eval_line() -> None:
    result = run("completion", "zsh")
    assert "_QUORUMQ_COMPLETE=zsh_source" in result.output


def test_table_aligns_columns_and_marks_missing_cells() -> None:
    text = table([{"id": "n1", "role": "leader"}, {"id": "n22", "role": None}], ["id", "role"])
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "ROLE"]
    assert lines[2].split() == ["n22", "-"]
    assert lines[1].index("leader") == lines[0].index("ROLE")
