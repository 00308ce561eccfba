"""`quorumq consume` argument checks for --balance (before any network call)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cluster.cli.exits import USAGE, CliError
from cluster.cli.main import cli


def test_several_queues_without_balance_is_a_usage_error(tmp_path: object) -> None:
    """Several QUEUEs only make sense with --balance GROUP: a usage error (exit 64)."""
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path), "consume", "a", "b"])
    assert isinstance(result.exception, CliError)
    assert result.exception.exit_code == USAGE
    assert "--balance GROUP" in str(result.exception)


@pytest.mark.parametrize("poll", ["0", "-1"])
def test_a_bad_balance_poll_is_refused(poll: str) -> None:
    """The poll interval has a floor (the balancer queries the whole group every poll)."""
    result = CliRunner().invoke(cli, ["consume", "--balance", "g", "--balance-poll", poll, "a"])
    assert result.exit_code == 2
