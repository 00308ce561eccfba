"""Explicit Spark schemas of the pipeline's DataFrames; every transform declares what it returns."""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# The input of a campaign: one row per seed (only seeds are shipped to executors).
SEED_SCHEMA = StructType([StructField("seed", LongType(), nullable=False)])

# One row per fuzzed seed, as written to `<out>/seeds.parquet`.
RESULT_SCHEMA = StructType(
    [
        StructField("seed", LongType(), nullable=False),
        StructField("steps", IntegerType(), nullable=False),
        StructField("initial_machine_version", IntegerType(), nullable=False),
        StructField("final_machine_version", IntegerType(), nullable=True),
        StructField("upgrade_index", IntegerType(), nullable=True),  # null: no upgrade
        StructField("digest", StringType(), nullable=True),  # null when the run crashed
        StructField("ready", LongType(), nullable=True),  # final queue depth
        StructField("total", LongType(), nullable=True),  # final messages total
        StructField("violations", IntegerType(), nullable=False),
        StructField("first_violation", StringType(), nullable=True),
        StructField("error", StringType(), nullable=True),  # the fuzzer itself raised
        StructField("failed", BooleanType(), nullable=False),
        StructField("reproduce", StringType(), nullable=False),
        StructField("elapsed_ms", DoubleType(), nullable=False),
    ]
)

# The one-row campaign totals computed from the results.
TOTALS_SCHEMA = StructType(
    [
        StructField("seeds", LongType(), nullable=False),
        StructField("failures", LongType(), nullable=False),
        StructField("violations", LongType(), nullable=False),
        StructField("errors", LongType(), nullable=False),
        StructField("seed_ms_total", DoubleType(), nullable=False),
    ]
)

# Failing seeds, smallest first, with what reproduces each one locally.
FAILURE_SCHEMA = StructType(
    [
        StructField("seed", LongType(), nullable=False),
        StructField("violations", IntegerType(), nullable=False),
        StructField("first_violation", StringType(), nullable=True),
        StructField("error", StringType(), nullable=True),
        StructField("reproduce", StringType(), nullable=False),
    ]
)

# Per upgrade index (-1: no upgrade): what the plot shows.
UPGRADE_PROFILE_SCHEMA = StructType(
    [
        StructField("upgrade_index", IntegerType(), nullable=False),
        StructField("seeds", LongType(), nullable=False),
        StructField("mean_ready", DoubleType(), nullable=True),
        StructField("max_ready", LongType(), nullable=True),
        StructField("violations", LongType(), nullable=False),
        StructField("failures", LongType(), nullable=False),
    ]
)
