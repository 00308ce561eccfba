"""The report's aggregates folded by the replay tasks equal Spark SQL's over the written tables."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.aggregate import Facts, percentile
from pipeline.analyze import AnalyzeConfig, plot_buckets, run_analysis
from pipeline.logscan import fast_route, route, scan_log
from pipeline.schemas import CONSUMER_SCHEMA, MESSAGE_SCHEMA, RATE_SCHEMA
from pipeline.workload import write_log

pytestmark = pytest.mark.spark


def test_percentile_is_sparks_exact_percentile(spark: SparkSession) -> None:
    rng = random.Random(7)
    samples = [[rng.choice([1, 2, 3, 50, 1000, rng.randint(0, 10**6)]) for _ in range(n)]
               for n in (1, 2, 3, 4, 5, 10, 99, 100, 101, 1000)]  # fmt: skip
    frame = spark.createDataFrame(
        [(i, v) for i, values in enumerate(samples) for v in values], "id int, v long"
    )
    expected = {
        r["id"]: (r["p50"], r["p90"], r["p99"])
        for r in frame.groupBy("id")
        .agg(*(F.percentile("v", p).alias(f"p{int(p * 100)}") for p in (0.5, 0.9, 0.99)))
        .collect()
    }
    for i, values in enumerate(samples):
        counts: dict[int, int] = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        ordered = sorted(counts.items())
        assert tuple(percentile(ordered, p) for p in (0.5, 0.9, 0.99)) == expected[i], values
    assert percentile([], 0.5) is None


def test_fast_route_agrees_with_route_on_every_command_of_a_log(tmp_path: Path) -> None:
    from pipeline.logscan import chunk_records

    log = tmp_path / "w.log"
    write_log(log, 200_000, seed=11, services=4)
    plan = scan_log(log)
    blobs = [c[4] for s, e in plan.chunks for r in chunk_records(str(log), s, e)
             for c in r["commands"]]  # fmt: skip
    assert len(blobs) == plan.commands
    assert [fast_route(b)[0] for b in blobs] == [route(b)[0] for b in blobs]
    for garbage in (b"", b"\xff", b"\xd9\x9c\x40", b"\xd9\x9c\x40\x81\x63ab", b"\x81\x61q"):
        assert fast_route(garbage)[0] == route(garbage)[0]


def _reference(messages: DataFrame, rates: DataFrame, consumers: DataFrame) -> dict[str, Any]:
    """The aggregates as Spark SQL computes them over the written tables."""
    published = messages.filter(F.col("enqueue_ms").isNotNull())
    first = published.filter(F.col("first_delivery_ms").isNotNull()).select(
        "queue", F.lit("first_delivery").alias("measure"),
        (F.col("first_delivery_ms") - F.col("enqueue_ms")).alias("ms"),
    )  # fmt: skip
    acked = published.filter(F.col("outcome") == "acked").select(
        "queue", F.lit("ack").alias("measure"),
        (F.col("settle_ms") - F.col("enqueue_ms")).alias("ms"),
    )  # fmt: skip
    both = first.unionByName(acked)
    every = both.withColumn("queue", F.lit("*")).unionByName(both)
    latency = every.groupBy("queue", "measure").agg(
        F.count("ms").alias("count"),
        F.percentile("ms", 0.5).alias("p50_ms"),
        F.percentile("ms", 0.9).alias("p90_ms"),
        F.percentile("ms", 0.99).alias("p99_ms"),
        F.max("ms").alias("max_ms"),
    )
    outcome = F.col("outcome")
    totals = messages.agg(
        F.count("*").alias("messages"),
        F.sum(F.when(F.col("source") == "publish", 1).otherwise(0)).alias("published"),
        F.sum("delivery_count").alias("deliveries"),
        F.sum(F.when(outcome == "acked", 1).otherwise(0)).alias("acked"),
        F.sum(F.when(outcome.isNull(), 1).otherwise(0)).alias("queued"),
    ).first()
    consumer_totals = consumers.agg(
        F.count("*").alias("consumers"), F.sum("handovers_in").alias("handovers")
    ).first()
    rate_totals = rates.agg(F.sum("published").alias("published"),
                            F.max("ready").alias("ready_max")).first()  # fmt: skip
    histogram = (
        messages.filter((outcome == "acked") & F.col("enqueue_ms").isNotNull())
        .select(F.floor(F.log2(F.col("settle_ms") - F.col("enqueue_ms") + 1)).alias("bin"))
        .groupBy("bin").count().collect()
    )  # fmt: skip
    assert totals is not None and consumer_totals is not None and rate_totals is not None
    return {
        "latency": sorted(
            (r.asDict() for r in latency.collect()), key=lambda r: (r["queue"], r["measure"])
        ),
        "totals": totals.asDict(),
        "consumers": consumer_totals.asDict(),
        "rates": rate_totals.asDict(),
        "histogram": sorted((int(r["bin"]), int(r["count"])) for r in histogram),
    }


def test_the_folded_aggregates_equal_spark_sql_over_the_written_tables(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "w.log"
    write_log(log, 400_000, seed=4, services=3)
    out = tmp_path / "out"
    summary = run_analysis(spark, AnalyzeConfig(log, out, str(log), chunk_bytes=100_000))
    assert summary["replay_check"]["equal"]
    messages = spark.read.schema(MESSAGE_SCHEMA).parquet(str(out / "messages.parquet"))
    rates = spark.read.schema(RATE_SCHEMA).parquet(str(out / "queue_rates.parquet"))
    consumers = spark.read.schema(CONSUMER_SCHEMA).parquet(str(out / "consumers.parquet"))
    ref = _reference(messages, rates, consumers)

    assert summary["latency"] == ref["latency"]
    written = json.loads((out / "summary.json").read_text())
    assert written["latency"] == ref["latency"]
    latency = [r.asDict() for r in spark.read.parquet(str(out / "latency.parquet")).collect()]
    assert sorted(latency, key=lambda r: (r["queue"], r["measure"])) == ref["latency"]
    totals, outcomes = summary["totals"], summary["outcomes"]
    assert (totals["messages"], totals["published"], totals["deliveries"]) == (
        ref["totals"]["messages"], ref["totals"]["published"], ref["totals"]["deliveries"],
    )  # fmt: skip
    assert (outcomes["acked"], outcomes["queued"]) == (ref["totals"]["acked"],
                                                       ref["totals"]["queued"])  # fmt: skip
    ct = summary["consumer_totals"]
    assert (ct["consumers"], ct["handovers"]) == (ref["consumers"]["consumers"],
                                                  ref["consumers"]["handovers"])  # fmt: skip
    assert ref["totals"]["messages"] > 0 and ref["consumers"]["consumers"] > 0

    # the series and histogram of the plots: the same fold over the rows as written
    buckets = plot_buckets(scan_log(log))
    facts = Facts(buckets)
    for row in messages.collect():
        facts.add_message(row.asDict(recursive=True))
    for row in rates.collect():
        facts.add_rate(row.asDict())
    folded = facts.report()
    assert folded["totals"] == summary["totals"] and folded["outcomes"] == summary["outcomes"]
    assert folded["ack_histogram"] == ref["histogram"]
    t = F.floor((F.col("second") - buckets.lo) / buckets.bucket) * buckets.bucket + buckets.lo
    series = (
        rates.withColumn("t", t).groupBy("t")
        .agg(F.sum("published").alias("published"), F.max("ready").alias("ready_max"))
        .orderBy("t").collect()
    )  # fmt: skip
    assert [(r["t"], r["published"], r["ready_max"]) for r in series] == [
        (s["t"], s["published"], s["ready_max"]) for s in folded["series"]
    ]
    assert sum(s["published"] for s in folded["series"]) == ref["rates"]["published"] > 0
