"""`quorumq pipeline fuzz` through the real CLI entry point, on the shared local[2] session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import fifo
from cluster.cli import exits
from cluster.cli.main import main
from tests.fifo.unreleased_machine import register as register_unreleased

pytestmark = [
    pytest.mark.spark,
    # pandas 3 is fine for the Arrow batches we use; pyspark 4.3 still nags about it
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def run_cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """Run `quorumq ARGS` in this process and return its exit code."""
    monkeypatch.setattr("sys.argv", ["quorumq", *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    code = stopped.value.code
    return code if isinstance(code, int) else exits.SOFTWARE


def test_clean_campaign_exits_0_and_prints_the_summary_as_json(
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """No failure: exit 0, the summary on stdout equals summary.json, progress on stderr."""
    code = run_cli(
        monkeypatch,
        "-o",
        "json",
        "pipeline",
        "fuzz",
        "--seeds",
        "8",
        "--steps",
        "50",
        "--upgrade-at",
        "random",
        "--master",
        "local[2]",
        "--out",
        str(tmp_path),
    )
    captured = capsys.readouterr()
    assert code == exits.OK, captured.err
    summary = json.loads(captured.out)
    assert (summary["seeds"], summary["failures"]) == (8, 0)
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert "fuzzing 8 seeds" in captured.err


def test_planted_bug_exits_1_and_prints_each_failing_seed_with_its_command(
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A broken machine: exit 1 (FAILURE), and the table names the seeds and their commands."""
    code = run_cli(
        monkeypatch,
        "pipeline",
        "fuzz",
        "--seeds",
        "20",
        "--steps",
        "100",
        "--upgrade-at",
        "random",
        "--apply-fn",
        "tests.pipeline.planted:lossy_enqueue",
        "--master",
        "local[2]",
        "--out",
        str(tmp_path),
    )
    captured = capsys.readouterr()
    assert code == exits.FAILURE
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failures"] > 0
    for failing in summary["failing_seeds"]:
        assert f"seed {failing['seed']}: " in captured.out
        assert f"reproduce: {failing['reproduce']}" in captured.out
    assert f"{summary['failures']} of 20 seeds failed" in captured.err


def test_an_unreleased_machine_version_passes_the_cli_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unreleased version (a test-only machine past the latest) is fuzzed before it ships,
    as `quorumq fuzz` does: the CLI accepts it (not in SUPPORTED_VERSIONS), and refuses an
    upgrade from it (nothing newer to go to). No Spark: its workers would not see the test-only
    machine."""
    from cluster.cli.exits import CliError
    from cluster.cli.pipeline import _check_machine_version

    version = register_unreleased(monkeypatch)
    assert version not in fifo.SUPPORTED_VERSIONS
    _check_machine_version(version, None)
    with pytest.raises(CliError, match="--upgrade-at needs"):
        _check_machine_version(version, "random")
    with pytest.raises(CliError, match="is not one of"):
        _check_machine_version(version + 1, None)


@pytest.mark.parametrize(
    "flags",
    [
        ["--seeds", "0", "--steps", "10"],
        ["--seeds", "5", "--steps", "10", "--upgrade-at", "soon"],
        ["--seeds", "5", "--steps", "10", "--upgrade-at", "-3"],
        ["--seeds", "5", "--steps", "10", "--upgrade-at", "10"],
        ["--seeds", "5", "--steps", "10", "--machine-version", "99"],
        [
            "--seeds",
            "5",
            "--steps",
            "10",
            "--machine-version",
            str(fifo.LATEST_VERSION),
            "--upgrade-at",
            "random",
        ],  # the latest version has nothing to upgrade to
        ["--seeds", "5", "--steps", "10", "--apply-fn", "no_such_module:apply"],
        ["--seeds", "5", "--steps", "10", "--apply-fn", "no-colon"],
        ["--steps", "10"],
    ],
)
def test_bad_flags_exit_64_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: list[str]
) -> None:
    """Usage errors are caught before any Spark work and exit with EX_USAGE."""
    code = run_cli(monkeypatch, "pipeline", "fuzz", *flags, "--out", str(tmp_path / "o"))
    assert code == exits.USAGE
    assert not (tmp_path / "o" / "summary.json").exists()


def test_an_out_dir_that_cannot_be_created_exits_73(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--out under a regular file cannot be created: EX_CANTCREAT."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = run_cli(
        monkeypatch,
        "pipeline",
        "fuzz",
        "--seeds",
        "2",
        "--steps",
        "5",
        "--out",
        str(blocker / "out"),
    )
    assert code == exits.CANT_CREATE
