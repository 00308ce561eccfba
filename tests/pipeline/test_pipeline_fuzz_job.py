"""The fuzz campaign job on real Spark (local[2]): its Parquet rows, summary, plot, and failures."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import fifo
from fifo import fuzz
from pipeline.campaign import PARQUET_NAME, PLOT_NAME, SUMMARY_NAME, Campaign, execute
from pipeline.fuzz_job import CampaignConfig, fuzz_seed
from pipeline.schemas import RESULT_SCHEMA
from tests.pipeline.planted import lossy_enqueue

pytestmark = [
    pytest.mark.spark,
    # pandas 3 is fine for the Arrow batches we use; pyspark 4.3 still nags about it
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

SEEDS = 20
STEPS = 100
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLANTED = "tests.pipeline.planted:lossy_enqueue"

Outcome = tuple[dict[str, Any], Path]


@pytest.fixture(scope="module")
def clean(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """A 20 seeds x 100 steps campaign with a random v1 -> v2 upgrade per seed."""
    out = tmp_path_factory.mktemp("clean")
    campaign = Campaign(SEEDS, 0, 4, CampaignConfig(STEPS, 1, "random"))
    return execute(spark, campaign, out), out


@pytest.fixture(scope="module")
def planted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """The same campaign size on a machine that acks and loses some enqueues."""
    out = tmp_path_factory.mktemp("planted")
    campaign = Campaign(SEEDS, 0, 4, CampaignConfig(STEPS, 1, "random", apply_fn=PLANTED))
    return execute(spark, campaign, out), out


def read_rows(spark: SparkSession, out: Path) -> list[dict[str, Any]]:
    """Every Parquet row of a campaign, by seed."""
    frame = spark.read.parquet(str(out / PARQUET_NAME))
    return [row.asDict() for row in frame.orderBy("seed").collect()]


def test_parquet_has_one_row_per_seed_with_the_declared_columns(
    spark: SparkSession, clean: Outcome
) -> None:
    """Every seed has exactly one row, with the columns and types of RESULT_SCHEMA."""
    frame = spark.read.parquet(str(clean[1] / PARQUET_NAME))
    assert [(f.name, f.dataType) for f in frame.schema.fields] == [
        (f.name, f.dataType) for f in RESULT_SCHEMA.fields
    ]
    assert [row["seed"] for row in read_rows(spark, clean[1])] == list(range(SEEDS))


def test_rows_record_the_upgrade_and_versions(spark: SparkSession, clean: Outcome) -> None:
    """With --upgrade-at random every seed upgrades once, from v1 to the latest, inside its log."""
    for row in read_rows(spark, clean[1]):
        assert row["initial_machine_version"] == 1
        assert row["final_machine_version"] == fifo.LATEST_VERSION
        assert 0 <= row["upgrade_index"] < STEPS
        assert row["steps"] == STEPS and row["elapsed_ms"] > 0
        assert not row["failed"] and row["violations"] == 0 and row["error"] is None


def test_executor_rows_equal_a_local_run_of_the_same_seed(
    spark: SparkSession, clean: Outcome
) -> None:
    """A seed gives the same digest on an executor as in this process (determinism)."""
    row = read_rows(spark, clean[1])[7]
    local = fuzz.run(7, STEPS, 1, upgrade_at="random", snapshot_check=True)
    assert (row["digest"], row["upgrade_index"], row["ready"], row["total"]) == (
        local.digest,
        local.upgrade_index,
        local.ready,
        local.total,
    )


def test_a_row_reproduce_command_replays_its_seed_exactly(
    spark: SparkSession, clean: Outcome
) -> None:
    """The row's `quorumq fuzz` command, run as printed, passes and prints the same digest."""
    row = read_rows(spark, clean[1])[3]
    words = shlex.split(row["reproduce"])
    assert words[:2] == ["quorumq", "fuzz"]
    executable = str(Path(sys.executable).parent / "quorumq")
    done = subprocess.run([executable, *words[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert row["digest"] in done.stdout


def test_summary_reports_seeds_failures_and_rate(clean: Outcome) -> None:
    """summary.json counts every seed, no failure, a rate, and where it ran."""
    summary = json.loads((clean[1] / SUMMARY_NAME).read_text())
    assert summary == clean[0]
    assert (summary["seeds"], summary["failures"], summary["failing_seeds"]) == (SEEDS, 0, [])
    assert summary["seeds_per_s"] > 0
    assert summary["master"] == "local[2]"
    assert summary["spark_version"]


def test_plot_is_a_png(clean: Outcome) -> None:
    """The upgrade-profile plot is written as a PNG file."""
    assert (clean[1] / PLOT_NAME).read_bytes()[:8] == PNG_MAGIC


def test_planted_violation_is_reported_with_its_seed_and_reproduce_command(
    spark: SparkSession, planted: Outcome
) -> None:
    """A machine that loses acked enqueues fails seeds; each names its seed and command."""
    summary, out = planted
    failed = [row for row in read_rows(spark, out) if row["failed"]]
    assert failed, "the planted bug went unnoticed"
    assert summary["failures"] == len(failed)
    assert [f["seed"] for f in summary["failing_seeds"]] == [row["seed"] for row in failed]
    for entry in summary["failing_seeds"]:
        assert entry["reproduce"].startswith(f"quorumq fuzz --seed {entry['seed']} ")
        assert entry["first_violation"]


def test_a_reported_failure_reproduces_locally(spark: SparkSession, planted: Outcome) -> None:
    """Re-running a failing seed with the planted machine finds the same first violation."""
    row = next(row for row in read_rows(spark, planted[1]) if row["failed"])
    local = fuzz.run(
        row["seed"], STEPS, 1, upgrade_at="random", snapshot_check=True, apply_fn=lossy_enqueue
    )
    assert local.violations
    assert f"step {local.violations[0].step}: " in row["first_violation"]
    assert local.violations[0].invariant in row["first_violation"]


def test_a_crashing_run_becomes_a_failed_row() -> None:
    """An exception inside the fuzzer is recorded as a failed row, not a failed job."""
    row = fuzz_seed(5, CampaignConfig(STEPS, 99))
    assert row["failed"] and row["error"]
    assert row["reproduce"].startswith("quorumq fuzz --seed 5 ")
