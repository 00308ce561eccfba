"""The pure DataFrame -> DataFrame transforms of the fuzz job, on hand-made result rows."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from pipeline.fuzz_job import NO_UPGRADE_INDEX, failures, seed_frame, totals, upgrade_profile
from pipeline.schemas import (
    FAILURE_SCHEMA,
    RESULT_SCHEMA,
    SEED_SCHEMA,
    TOTALS_SCHEMA,
    UPGRADE_PROFILE_SCHEMA,
)

pytestmark = pytest.mark.spark


def result_row(
    seed: int, upgrade_index: int | None, ready: int, violations: int = 0, error: str | None = None
) -> dict[str, Any]:
    """A RESULT_SCHEMA row with the fields these tests vary."""
    return {
        "seed": seed,
        "steps": 10,
        "initial_machine_version": 1,
        "final_machine_version": 2,
        "upgrade_index": upgrade_index,
        "digest": "d",
        "ready": ready,
        "total": ready,
        "violations": violations,
        "first_violation": "step 3: x" if violations else None,
        "error": error,
        "failed": bool(violations or error),
        "reproduce": f"quorumq fuzz --seed {seed}",
        "elapsed_ms": 2.0,
    }


@pytest.fixture(scope="module")
def results(spark: SparkSession) -> DataFrame:
    """Five seeds: two upgraded at 4, one at 7, two never upgraded; seeds 3 and 4 failed."""
    rows = [
        result_row(0, 4, 2),
        result_row(1, 4, 6),
        result_row(2, 7, 1),
        result_row(3, None, 5, violations=2),
        result_row(4, None, 3, error="KeyError: 'q'"),
    ]
    return spark.createDataFrame(rows, RESULT_SCHEMA)


def test_seed_frame_holds_consecutive_seeds_in_the_asked_partitions(spark: SparkSession) -> None:
    """Seeds first .. first+n-1, once each, in exactly the requested number of partitions."""
    frame = seed_frame(spark, 100, 9, 4)
    assert frame.schema == SEED_SCHEMA
    assert frame.rdd.getNumPartitions() == 4
    assert sorted(row.seed for row in frame.collect()) == list(range(100, 109))


def test_totals_count_seeds_failures_violations_and_errors(results: DataFrame) -> None:
    """One row: 5 seeds, 2 failures (a violation and a crash), 2 violations, 1 error."""
    frame = totals(results)
    assert [f.name for f in frame.schema.fields] == [f.name for f in TOTALS_SCHEMA.fields]
    row = frame.first()
    assert row is not None
    assert (row.seeds, row.failures, row.violations, row.errors) == (5, 2, 2, 1)
    assert row.seed_ms_total == pytest.approx(10.0)


def test_failures_lists_failed_seeds_in_order(results: DataFrame) -> None:
    """Only failed seeds, smallest first, with their reproduce commands."""
    frame = failures(results)
    assert [f.name for f in frame.schema.fields] == [f.name for f in FAILURE_SCHEMA.fields]
    assert [(r.seed, r.reproduce) for r in frame.collect()] == [
        (3, "quorumq fuzz --seed 3"),
        (4, "quorumq fuzz --seed 4"),
    ]


def test_upgrade_profile_groups_by_upgrade_index(results: DataFrame) -> None:
    """Depth and violations per upgrade index; seeds that never upgraded group under -1."""
    frame = upgrade_profile(results)
    assert [f.name for f in frame.schema.fields] == [f.name for f in UPGRADE_PROFILE_SCHEMA.fields]
    rows = [
        (r.upgrade_index, r.seeds, r.mean_ready, r.max_ready, r.violations, r.failures)
        for r in frame.collect()
    ]
    assert rows == [
        (NO_UPGRADE_INDEX, 2, 4.0, 5, 2, 2),
        (4, 2, 4.0, 6, 0, 0),
        (7, 1, 1.0, 1, 0, 0),
    ]
