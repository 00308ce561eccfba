"""`quorumq fuzz`: output, exit codes, and the same digest under different hash seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import fifo
import fifo.fuzz
from cluster.cli import exits
from cluster.cli.main import cli, main
from fifo.commands import Purge
from fifo.effects import Effect
from fifo.fuzz import FuzzResult, Violation
from fifo.meta import Meta
from fifo.replies import Reply
from fifo.state import State

ROOT = Path(__file__).resolve().parents[3]
QUORUMQ = Path(sys.executable).with_name("quorumq")


def run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """Run the real entry point (with its exit-code mapping) and return its exit code."""
    monkeypatch.setattr(sys, "argv", ["quorumq", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return int(exit_info.value.code or 0)


def test_json_output_has_the_documented_fields() -> None:
    """-o json prints seed, steps, versions, upgrade index, digest and violations."""
    result = CliRunner().invoke(cli, ["-o", "json", "fuzz", "--seed", "4", "--steps", "300",
                                      "--machine-version", "1", "--upgrade-at", "100"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["seed"] == 4 and report["steps"] == 300
    assert report["final_machine_version"] == fifo.LATEST_VERSION
    assert report["upgrade_index"] == 100
    assert report["violations"] == [] and len(report["digest"]) == 64
    assert report["digest"] == fifo.fuzz.run(4, 300, 1, upgrade_at=100).digest


def test_output_flag_after_the_command_wins() -> None:
    """`quorumq fuzz ... -o json` (the flag after the command) prints JSON too."""
    result = CliRunner().invoke(cli, ["fuzz", "--seed", "4", "--steps", "50",
                                      "--machine-version", "2", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["steps"] == 50


def test_table_output_is_readable() -> None:
    """The default table output lists the digest and the violation count."""
    result = CliRunner().invoke(cli, ["fuzz", "--seed", "4", "--steps", "100",
                                      "--machine-version", "2"])
    assert result.exit_code == 0, result.output
    assert "digest" in result.output and "violations" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "1", "--steps", "0", "--machine-version", "1"], "--steps"),
        (["--seed", "1", "--steps", "10", "--machine-version", "9"], "--machine-version 9"),
        (["--seed", "1", "--steps", "10", "--machine-version", "1", "--upgrade-at", "soon"],
         "neither 'random' nor an integer"),
        (["--seed", "1", "--steps", "10", "--machine-version", str(fifo.LATEST_VERSION),
          "--upgrade-at", "3"], "--upgrade-at needs"),
        (["--seed", "1", "--steps", "10", "--machine-version", "1", "--upgrade-at", "10"],
         "must be below --steps"),
        (["--steps", "10", "--machine-version", "1"], "--seed"),
    ],
)
def test_bad_flags_exit_64_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
    message: str,
) -> None:
    """Usage errors exit EX_USAGE (64) and say what is wrong."""
    assert run_main(monkeypatch, "fuzz", *args) == exits.USAGE
    assert message in capsys.readouterr().err


def test_violation_exits_1_and_prints_the_reproducer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with a violation exits FAILURE and prints the command that reproduces it."""
    def fake_run(seed: int, steps: int, version: int, *_: object) -> FuzzResult:
        bad = Violation(3, "Settle(...)", "accounting", "planted")
        return FuzzResult(seed, steps, version, version, None, "0" * 64, [bad], 0, 0,
                          f"quorumq fuzz --seed {seed} --steps {steps} --machine-version 2 -o json")

    monkeypatch.setattr(fifo.fuzz, "run", fake_run)
    code = run_main(monkeypatch, "-o", "json", "fuzz", "--seed", "8", "--steps", "10",
                    "--machine-version", "2")
    captured = capsys.readouterr()
    assert code == exits.FAILURE
    assert json.loads(captured.out)["violations"][0]["invariant"] == "accounting"
    assert "quorumq fuzz --seed 8 --steps 10 --machine-version 2" in captured.err


def test_help_ends_with_an_example() -> None:
    """--help documents the command with an example at the end."""
    result = CliRunner().invoke(cli, ["fuzz", "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output
    assert result.output.rstrip().endswith("--upgrade-at random -o json")


def quorumq_json(hash_seed: str, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([str(QUORUMQ), "fuzz", *args, "-o", "json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.mark.slow
def test_real_process_same_digest_under_hash_seeds_1_and_2() -> None:
    """The installed `quorumq fuzz --seed 7 --steps 5000 --machine-version 2` is hash-seed free."""
    args = ("--seed", "7", "--steps", "5000", "--machine-version", "2")
    first, second = quorumq_json("1", *args), quorumq_json("2", *args)
    assert first["violations"] == [] and first["final_machine_version"] == 2
    assert first["digest"] == second["digest"]


@pytest.mark.slow
def test_real_process_upgrade_at_random_reports_the_index() -> None:
    """`--machine-version 1 --upgrade-at random` exits 0 and says where it upgraded."""
    report = quorumq_json("0", "--seed", "7", "--steps", "5000", "--machine-version", "1",
                          "--upgrade-at", "random")
    assert report["final_machine_version"] == fifo.LATEST_VERSION
    assert isinstance(report["upgrade_index"], int) and 0 <= report["upgrade_index"] < 5000


def test_snapshot_check_reports_where_it_snapshotted() -> None:
    """--snapshot-check runs the snapshot + replay check and says at which entry."""
    result = CliRunner().invoke(cli, ["fuzz", "--seed", "5", "--steps", "200",
                                      "--machine-version", "2", "--snapshot-check", "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert isinstance(report["snapshot_index"], int) and 0 <= report["snapshot_index"] <= 200
    assert report["reproduce"].endswith("--snapshot-check -o json")


def test_shrink_prints_a_minimal_log_for_a_violation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--shrink adds the minimal failing log to the report (planted bug: Purge raises)."""
    real_apply = fifo.apply

    def purge_raises(meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        if isinstance(command, Purge):
            raise RuntimeError("planted")
        return real_apply(meta, command, state)

    monkeypatch.setattr(fifo, "apply", purge_raises)
    code = run_main(monkeypatch, "fuzz", "--seed", "0", "--steps", "500", "--machine-version",
                    "2", "--shrink", "-o", "json")
    report = json.loads(capsys.readouterr().out)
    assert code == exits.FAILURE
    assert report["violations"][0]["invariant"] == "apply_raised"
    assert report["shrunk"]["reproducible"] and len(report["shrunk"]["entries"]) == 1
    assert "Purge(" in report["shrunk"]["entries"][0]
