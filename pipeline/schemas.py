"""Explicit Spark schemas of the pipeline's DataFrames; every transform declares what it returns."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
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

# --- pipeline analyze ------------------------------------------------------------------------

DELIVERY_SCHEMA = StructType(
    [
        StructField("consumer", StringType(), nullable=False),
        StructField("index", LongType(), nullable=False),
        StructField("ms", LongType(), nullable=False),
    ]
)

# `messages.parquet`: one row per message of the log (outcome null: still in its queue).
MESSAGE_SCHEMA = StructType(
    [
        StructField("queue", StringType(), nullable=False),
        StructField("seq", LongType(), nullable=False),  # order of arrival in its queue
        StructField("source", StringType(), nullable=False),  # publish|dead_letter|snapshot|...
        StructField("dead_lettered_from", StringType(), nullable=True),
        StructField("enqueue_index", LongType(), nullable=True),
        StructField("enqueue_ms", LongType(), nullable=True),
        StructField("body_bytes", LongType(), nullable=False),
        StructField("deliveries", ArrayType(DELIVERY_SCHEMA, containsNull=False), nullable=False),
        StructField("delivery_count", IntegerType(), nullable=False),  # all (the list keeps 32)
        StructField("first_delivery_ms", LongType(), nullable=True),
        StructField("returns", IntegerType(), nullable=False),  # given back by a client
        StructField("timeouts", IntegerType(), nullable=False),  # released: consumer timeout
        StructField("consumer_gone", IntegerType(), nullable=False),  # consumer down/cancelled
        StructField("modified", IntegerType(), nullable=False),
        StructField("settle_index", LongType(), nullable=True),
        StructField("settle_ms", LongType(), nullable=True),
        # acked | dead_lettered | discarded | expired | dropped | null (still queued)
        StructField("outcome", StringType(), nullable=True),
        StructField("outcome_reason", StringType(), nullable=True),
        StructField("dead_letter_target", StringType(), nullable=True),
    ]
)

# `queue_rates.parquet`: per queue per second with activity; depths after its last command.
RATE_SCHEMA = StructType(
    [
        StructField("queue", StringType(), nullable=False),
        StructField("second", LongType(), nullable=False),  # epoch seconds
        StructField("published", LongType(), nullable=False),
        StructField("delivered", LongType(), nullable=False),
        StructField("acked", LongType(), nullable=False),
        StructField("returned", LongType(), nullable=False),
        StructField("dead_lettered", LongType(), nullable=False),
        StructField("ready", LongType(), nullable=False),
        StructField("checked_out", LongType(), nullable=False),
    ]
)

# `consumers.parquet`: per consumer (`tag@node/incarnation/number`) of a queue.
CONSUMER_SCHEMA = StructType(
    [
        StructField("queue", StringType(), nullable=False),
        StructField("consumer", StringType(), nullable=False),
        StructField("first_ms", LongType(), nullable=False),
        StructField("last_ms", LongType(), nullable=False),
        StructField("deliveries", LongType(), nullable=False),
        StructField("acks", LongType(), nullable=False),
        StructField("returns", LongType(), nullable=False),
        StructField("timeouts", LongType(), nullable=False),
        StructField("timed_out_messages", LongType(), nullable=False),
        StructField("sac_activations", LongType(), nullable=False),
        StructField("handovers_in", LongType(), nullable=False),
        StructField("handovers_out", LongType(), nullable=False),
        StructField("sac_active_ms", LongType(), nullable=False),
        StructField("cancel_reason", StringType(), nullable=True),
    ]
)

# `latency.parquet`: per queue (and `*` for all), publish -> first delivery / -> ack, in ms.
LATENCY_SCHEMA = StructType(
    [
        StructField("queue", StringType(), nullable=False),
        StructField("measure", StringType(), nullable=False),  # first_delivery | ack
        StructField("count", LongType(), nullable=False),
        StructField("p50_ms", DoubleType(), nullable=True),
        StructField("p90_ms", DoubleType(), nullable=True),
        StructField("p99_ms", DoubleType(), nullable=True),
        StructField("max_ms", LongType(), nullable=True),
    ]
)
