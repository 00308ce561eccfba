"""Distributed fuzz campaigns: seeds partitioned over Spark tasks, one result row per seed.

Only seeds travel to the executors and only small aggregates come back to the driver; every seed
runs `fifo.fuzz.run` with invariants on, a snapshot/replay check and, when asked, a v1->v2 upgrade.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pipeline.schemas import (
    FAILURE_SCHEMA,
    RESULT_SCHEMA,
    TOTALS_SCHEMA,
    UPGRADE_PROFILE_SCHEMA,
)

UpgradeAt = int | Literal["random"] | None
NO_UPGRADE_INDEX = -1  # the upgrade profile's group for seeds that never upgraded
DETAIL_CHARS_MAX = 2_000  # a violation detail can print a whole queue; keep rows small


@dataclass(frozen=True, slots=True)
class CampaignConfig:
    """What every seed of a campaign runs; shipped to the executors with the task closure.

    `apply_fn` names a replacement apply function as `module:function`, imported on the executor
    (a planted broken machine in tests); it must be importable wherever the executors run.
    """

    steps: int
    machine_version: int
    upgrade_at: UpgradeAt = None
    snapshot_check: bool = True
    apply_fn: str | None = None


def resolve_apply_fn(name: str) -> Callable[..., Any]:
    """Import `module:function` and return the function; ValueError when it cannot be found."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected module:function, got {name!r}")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {name!r}: {err}") from err
    if not callable(function):
        raise ValueError(f"{name!r} is not callable")
    return function  # type: ignore[no-any-return]


def _describe_violation(violation: Any) -> str:
    """One line for a fifo.fuzz Violation: step, invariant, detail and the command."""
    text = (
        f"step {violation.step}: {violation.invariant}: {violation.detail} "
        f"(command {violation.command})"
    )
    return text[:DETAIL_CHARS_MAX]


def _fallback_reproduce(seed: int, config: CampaignConfig) -> str:
    """The `quorumq fuzz` command for a seed whose run raised before producing its own."""
    parts = [f"quorumq fuzz --seed {seed} --steps {config.steps}"]
    parts.append(f"--machine-version {config.machine_version}")
    if config.upgrade_at is not None:
        parts.append(f"--upgrade-at {config.upgrade_at}")
    if config.snapshot_check:
        parts.append("--snapshot-check")
    return " ".join(parts)


def fuzz_seed(seed: int, config: CampaignConfig) -> dict[str, Any]:
    """Run one seed and return its RESULT_SCHEMA row; a crash of the run is a failed row."""
    from fifo import fuzz  # imported on the executor, where the task runs

    started = time.perf_counter()
    apply_fn = resolve_apply_fn(config.apply_fn) if config.apply_fn else None
    row = _crashed_row(seed, config)
    try:
        result = fuzz.run(
            seed,
            config.steps,
            config.machine_version,
            upgrade_at=config.upgrade_at,
            snapshot_check=config.snapshot_check,
            apply_fn=apply_fn,
        )
    except Exception as err:  # a crashing seed is a finding, not a reason to fail the job
        row["error"] = f"{type(err).__name__}: {err}"[:DETAIL_CHARS_MAX]
    else:
        row.update(_result_columns(result))
    row["failed"] = row["violations"] > 0 or row["error"] is not None
    row["elapsed_ms"] = (time.perf_counter() - started) * 1000.0
    return row


def _crashed_row(seed: int, config: CampaignConfig) -> dict[str, Any]:
    """The columns known before the run: what a row says when the fuzzer itself raised."""
    return {
        "seed": seed,
        "steps": config.steps,
        "initial_machine_version": config.machine_version,
        "final_machine_version": None,
        "upgrade_index": None,
        "digest": None,
        "ready": None,
        "total": None,
        "violations": 0,
        "first_violation": None,
        "error": None,
        "reproduce": _fallback_reproduce(seed, config),
    }


def _result_columns(result: Any) -> dict[str, Any]:
    """The columns a finished `fifo.fuzz.FuzzResult` fills in."""
    violations = result.violations
    return {
        "initial_machine_version": result.initial_machine_version,
        "final_machine_version": result.final_machine_version,
        "upgrade_index": result.upgrade_index,
        "digest": result.digest,
        "ready": result.ready,
        "total": result.total,
        "violations": len(violations),
        "first_violation": _describe_violation(violations[0]) if violations else None,
        "reproduce": result.reproduce,
    }


def seed_frame(spark: SparkSession, first_seed: int, seeds: int, partitions: int) -> DataFrame:
    """The SEED_SCHEMA frame of seeds first_seed .. first_seed+seeds-1, in `partitions` slices."""
    frame = spark.range(first_seed, first_seed + seeds, 1, numPartitions=partitions)
    return frame.withColumnRenamed("id", "seed")


def _fuzz_batches(
    config: CampaignConfig,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor-side function of `run_campaign`: seed batches in, result batches out."""
    arrow_schema = to_arrow_schema(RESULT_SCHEMA)

    def fuzz_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            seeds = batch.column("seed").to_pylist()
            rows = [fuzz_seed(int(seed), config) for seed in seeds]
            yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

    return fuzz_batches


def run_campaign(seeds: DataFrame, config: CampaignConfig) -> DataFrame:
    """SEED_SCHEMA -> RESULT_SCHEMA: fuzz every seed where its partition lives."""
    return seeds.mapInArrow(_fuzz_batches(config), RESULT_SCHEMA)


def totals(results: DataFrame) -> DataFrame:
    """RESULT_SCHEMA -> TOTALS_SCHEMA: one row of campaign counts."""
    frame = results.agg(
        F.count(F.lit(1)).alias("seeds"),
        F.coalesce(F.sum(F.col("failed").cast("long")), F.lit(0)).alias("failures"),
        F.coalesce(F.sum(F.col("violations").cast("long")), F.lit(0)).alias("violations"),
        F.count(F.col("error")).alias("errors"),
        F.coalesce(F.sum("elapsed_ms"), F.lit(0.0)).alias("seed_ms_total"),
    )
    return _conform(frame, TOTALS_SCHEMA)


def failures(results: DataFrame) -> DataFrame:
    """RESULT_SCHEMA -> FAILURE_SCHEMA: the failed seeds, smallest seed first."""
    return _conform(results.where(F.col("failed")), FAILURE_SCHEMA).orderBy("seed")


def upgrade_profile(results: DataFrame) -> DataFrame:
    """RESULT_SCHEMA -> UPGRADE_PROFILE_SCHEMA: depth and violations by upgrade index."""
    index = F.coalesce(F.col("upgrade_index"), F.lit(NO_UPGRADE_INDEX)).alias("upgrade_index")
    grouped = results.groupBy(index).agg(
        F.count(F.lit(1)).alias("seeds"),
        F.avg("ready").alias("mean_ready"),
        F.max("ready").alias("max_ready"),
        F.sum(F.col("violations").cast("long")).alias("violations"),
        F.sum(F.col("failed").cast("long")).alias("failures"),
    )
    return _conform(grouped, UPGRADE_PROFILE_SCHEMA).orderBy("upgrade_index")


def _conform(frame: DataFrame, schema: StructType) -> DataFrame:
    """Select and cast `frame`'s columns to exactly the fields of `schema`, in its order."""
    return frame.select(*[F.col(field.name).cast(field.dataType) for field in schema.fields])
