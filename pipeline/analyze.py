"""`pipeline analyze`: log analytics on Spark by replaying an exported log through the machine.

Stages (each reported on the progress stream):
1. scan (driver, streaming): header, snapshot, upgrade points, chunk offsets, end record;
2. parse (executors, one task per chunk): decode records, route each command to its queue;
3. group: queues linked by dead-lettering replay together; groups are placed on partitions,
   largest first (a group is the unit of parallelism);
4. replay (executors): per group, in index order, `fifo.apply` with the recorded metas and
   `fifo.convert` at the recorded upgrades, emitting messages / rates / consumers rows;
5. write: Parquet tables, latency percentiles, plots, `report.md` and `summary.json`; the merged
   final states of the groups are checked against the log's `fifo_digest`.

The log file must be readable at the same path by every executor, and `out_dir` must be shared
(the executors write the Parquet tables, the driver writes the plots and the report).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.logscan import Groups, LogPlan, parse_chunk, partition_keys, place, scan_log
from pipeline.progress import report_progress
from pipeline.replay import GroupReplay, Upgrade, merged_digest
from pipeline.schemas import (
    CONSUMER_SCHEMA,
    LATENCY_SCHEMA,
    MESSAGE_SCHEMA,
    PARSED_SCHEMA,
    RATE_SCHEMA,
    REPLAY_OUT_SCHEMA,
)

BATCH_ROWS = 8192
TABLES = ("messages", "queue_rates", "consumers", "latency")
STAGES = 5
PLOT_POINTS_MAX = 600


@dataclass(frozen=True, slots=True)
class AnalyzeConfig:
    """One analysis: which file, where to, optional time window (epoch ms, [from, to))."""

    log: Path
    out_dir: Path
    chosen_because: str
    window: tuple[int | None, int | None] = (None, None)
    chunk_bytes: int = 16 * 1024 * 1024


class _Progress:
    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.started = time.perf_counter()
        self.stage = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def say(self, text: str) -> None:
        if self.stream is not None:
            print(f"analyze [{self.elapsed():7.1f} s] {text}", file=self.stream, flush=True)

    def done(self, text: str) -> None:
        self.stage += 1
        self.say(f"stage {self.stage}/{STAGES} done: {text}")


# --- executor functions (module level: pickled by reference, imported on executors) ----------


def _parse_batches(
    path: str, chunks: list[tuple[int, int]], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    schema = to_arrow_schema(PARSED_SCHEMA)
    for batch in batches:
        for chunk_id in batch.column(0).to_pylist():
            start, end = chunks[chunk_id]
            columns: list[list[Any]] = [[] for _ in range(8)]
            for row in parse_chunk(path, start, end):
                for column, value in zip(columns, row, strict=True):
                    column.append(value)
                if len(columns[0]) >= BATCH_ROWS:
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)],
                        schema=schema,
                    )
                    columns = [[] for _ in range(8)]
            if columns[0]:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)],
                    schema=schema,
                )


@dataclass(frozen=True, slots=True)
class _ReplaySpec:
    members: dict[str, list[str]]
    initial_version: int
    upgrades: list[Upgrade]
    window: tuple[int | None, int | None]


def _replay_batches(
    spec: _ReplaySpec, snapshot: Any, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    schema = to_arrow_schema(REPLAY_OUT_SCHEMA)
    rows: list[dict[str, Any]] = []
    field_of = {"messages": "message", "queue_rates": "rate", "consumers": "consumer"}
    snapshot_fifo = snapshot.value if snapshot is not None else None

    def add(pairs: Iterator[tuple[str, dict[str, Any]]], replay: GroupReplay) -> None:
        for table, row in pairs:
            if table == "state":
                row = {**row, **{k: replay.stats[k] for k in ("commands", "errors", "resyncs")}}
                rows.append({"table": "state", "state": row})
            else:
                rows.append({"table": table, field_of[table]: row})

    def flush() -> Iterator[pa.RecordBatch]:
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=schema)
            rows.clear()

    current: str | None = None
    replay: GroupReplay | None = None
    pending: list[Upgrade] = []

    def finish() -> None:
        assert replay is not None
        for up in pending:
            replay.upgrade(up)
        add(replay.finish(), replay)

    for batch in batches:
        groups = batch.column("group").to_pylist()
        indexes = batch.column("index").to_pylist()
        terms = batch.column("term").to_pylist()
        times = batch.column("ms").to_pylist()
        versions = batch.column("version").to_pylist()
        blobs = batch.column("blob").to_pylist()
        for group, index, term, ms, version, blob in zip(
            groups, indexes, terms, times, versions, blobs, strict=True
        ):
            if group != current:
                if replay is not None:
                    finish()
                current = group
                replay = GroupReplay(
                    spec.members[group], spec.initial_version, snapshot_fifo, spec.window
                )
                pending = list(spec.upgrades)
            assert replay is not None
            while pending and pending[0].index < index:
                replay.upgrade(pending.pop(0))
            replay.command(index, term, ms, version, blob)
            add(replay.drain(), replay)
        yield from flush()
    if replay is not None:
        finish()
    yield from flush()


# --- driver ------------------------------------------------------------------------------------


def run_analysis(
    spark: SparkSession, config: AnalyzeConfig, progress: TextIO | None = None
) -> dict[str, Any]:
    """Run every stage; returns the summary (also written to `summary.json`)."""
    say = _Progress(progress)
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    say.say(f"log {config.chosen_because}")
    plan = scan_log(
        config.log,
        config.chunk_bytes,
        lambda done, total: say.say(f"scanning: {done >> 20}/{total >> 20} MiB"),
    )
    say.done(
        f"scanned {plan.entries} entries, {plan.commands} commands, {plan.size >> 20} MiB in "
        f"{len(plan.chunks)} chunks"
    )
    sc = spark.sparkContext
    chunk_ids = spark.range(0, max(1, len(plan.chunks)), 1, max(1, len(plan.chunks)))
    path, chunks = plan.path, list(plan.chunks)
    parsed = chunk_ids.mapInArrow(
        lambda batches: _parse_batches(path, chunks, batches), PARSED_SCHEMA
    ).persist(StorageLevel.DISK_ONLY)
    try:
        return _analyse(spark, config, plan, parsed, say)
    finally:
        parsed.unpersist()
        del sc


def _analyse(
    spark: SparkSession, config: AnalyzeConfig, plan: LogPlan, parsed: DataFrame, say: _Progress
) -> dict[str, Any]:
    out = config.out_dir
    with report_progress(spark, "analyze: parse", say.stream):
        shape = parsed.groupBy("kind", "queue", "target").count().collect()
    groups = Groups()
    sizes: dict[str, int] = {}
    global_rows = 0
    for row in shape:
        if row["queue"] is None:
            global_rows += row["count"] if row["kind"] == "cmd" else 0
            continue
        groups.find(row["queue"])
        if row["kind"] == "link" and row["target"] is not None:
            groups.link(row["queue"], row["target"])
    members = groups.members()
    group_of = {name: rep for rep, names in members.items() for name in names}
    for row in shape:
        if row["kind"] == "cmd" and row["queue"] is not None:
            rep = group_of[row["queue"]]
            sizes[rep] = sizes.get(rep, 0) + row["count"] + global_rows
    parallelism = spark.sparkContext.defaultParallelism
    slots = max(1, min(len(members), 2 * parallelism))
    placement = place(sizes, slots)
    parsed_commands = sum(r["count"] for r in shape if r["kind"] == "cmd")
    say.done(
        f"parsed {parsed_commands} commands of {len(group_of)} queues into {len(members)} replay "
        f"groups on {slots} partitions"
    )
    keys = partition_keys(slots)  # hash partitioning then puts each group where LPT placed it
    mapping = spark.createDataFrame(
        [(name, rep, keys[placement[rep]]) for name, rep in group_of.items()],
        "queue string, group string, part int",
    )
    group_df = mapping.select("group", "part").distinct()
    commands = parsed.filter(F.col("kind") == "cmd")
    routed = commands.filter(F.col("queue").isNotNull()).join(F.broadcast(mapping), "queue")
    everywhere = commands.filter(F.col("queue").isNull()).crossJoin(F.broadcast(group_df))
    columns = ["part", "group", "index", "term", "ms", "version", "blob"]
    ordered = (
        routed.select(*columns)
        .unionByName(everywhere.select(*columns))
        .repartition(slots, "part")
        .sortWithinPartitions("group", "index")
    )
    spec = _ReplaySpec(members, plan.initial_version, list(plan.upgrades), config.window)
    snapshot = (
        spark.sparkContext.broadcast(plan.snapshot_fifo) if plan.snapshot_fifo is not None else None
    )
    replayed = ordered.mapInArrow(
        lambda batches: _replay_batches(spec, snapshot, batches), REPLAY_OUT_SCHEMA
    ).persist(StorageLevel.DISK_ONLY)
    paths = {t: out / f"{t}.parquet" for t in TABLES}
    try:
        with report_progress(spark, "analyze: replay", say.stream):
            frames = {
                "messages": replayed.filter(F.col("table") == "messages").select("message.*"),
                "queue_rates": replayed.filter(F.col("table") == "queue_rates").select("rate.*"),
                "consumers": replayed.filter(F.col("table") == "consumers").select("consumer.*"),
            }
            frames["messages"].write.mode("overwrite").parquet(str(paths["messages"]))
        say.done(f"replayed {len(members)} groups into {paths['messages']}")
        with report_progress(spark, "analyze: write", say.stream):
            for table in ("queue_rates", "consumers"):
                frames[table].write.mode("overwrite").parquet(str(paths[table]))
            states = [
                row.asDict() for row in replayed.filter(F.col("table") == "state")
                .select("state.*").collect()
            ]  # fmt: skip
        verify = _verify(plan, states)
        messages = spark.read.schema(MESSAGE_SCHEMA).parquet(str(paths["messages"]))
        rates = spark.read.schema(RATE_SCHEMA).parquet(str(paths["queue_rates"]))
        consumers = spark.read.schema(CONSUMER_SCHEMA).parquet(str(paths["consumers"]))
        latency = latency_table(messages).collect()
        spark.createDataFrame(latency, LATENCY_SCHEMA).coalesce(1).write.mode("overwrite").parquet(
            str(paths["latency"])
        )
        facts = _facts(plan, messages, rates, consumers, latency)
    finally:
        replayed.unpersist()
        if snapshot is not None:
            snapshot.unpersist()
    say.done(
        f"wrote {facts['totals'].get('messages', 0)} messages, "
        f"{facts['consumers'].get('consumers', 0)} consumers, {len(latency)} latency rows "
        f"under {out}"
    )
    summary = _summary(spark, config, plan, members, facts, verify, say.elapsed())
    summary["outputs"] = {t: str(p) for t, p in paths.items()}
    from pipeline.report import write_report  # matplotlib is slow to import

    summary["outputs"].update(write_report(out, summary, facts))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    summary["outputs"]["summary"] = str(out / "summary.json")
    say.done(f"report {out / 'report.md'} ({summary['elapsed_s']} s)")
    return summary


def _verify(plan: LogPlan, states: list[dict[str, Any]]) -> dict[str, Any]:
    expected = (plan.end or {}).get("fifo_digest") or None
    if any(not s["snapshot"] for s in states):
        return {"checked": False, "why": "final states too large to collect"}
    resyncs = sum(int(s["resyncs"]) for s in states)
    if not states:
        return {"checked": False, "why": "no queue in the log", "resyncs": 0}
    version = plan.upgrades[-1].to_version if plan.upgrades else plan.initial_version
    digest = merged_digest(states, version)
    return {
        "checked": expected is not None,
        "fifo_digest": digest,
        "log_fifo_digest": expected,
        "equal": digest == expected,
        "resyncs": resyncs,
    }


def latency_table(messages: DataFrame) -> DataFrame:
    """Publish -> first delivery and publish -> ack percentiles per queue and over all (`*`)."""
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
    return (
        every.groupBy("queue", "measure")
        .agg(
            F.count("ms").alias("count"),
            F.percentile("ms", 0.5).alias("p50_ms"),
            F.percentile("ms", 0.9).alias("p90_ms"),
            F.percentile("ms", 0.99).alias("p99_ms"),
            F.max("ms").alias("max_ms"),
        )
        .select([F.col(f.name).cast(f.dataType) for f in LATENCY_SCHEMA.fields])
    )


OUTCOMES = ("acked", "dead_lettered", "discarded", "expired", "dropped")


def _facts(
    plan: LogPlan,
    messages: DataFrame,
    rates: DataFrame,
    consumers: DataFrame,
    latency: list[Any],
) -> dict[str, Any]:
    """Small aggregates for the report and plots (collected; bounded in size)."""
    outcome = F.col("outcome")
    totals = messages.agg(
        F.count("*").alias("messages"),
        F.sum(F.when(F.col("source") == "publish", 1).otherwise(0)).alias("published"),
        F.sum("delivery_count").alias("deliveries"),
        F.sum("returns").alias("returns"),
        F.sum("timeouts").alias("timeouts"),
        F.sum("consumer_gone").alias("consumer_gone"),
        F.sum("modified").alias("modified"),
        *(F.sum(F.when(outcome == name, 1).otherwise(0)).alias(name) for name in OUTCOMES),
        F.sum(F.when(outcome.isNull(), 1).otherwise(0)).alias("queued"),
    ).first()
    consumer_totals = consumers.agg(
        F.count("*").alias("consumers"),
        F.sum("timeouts").alias("timeouts"),
        F.sum("handovers_in").alias("handovers"),
        F.sum("sac_activations").alias("sac_activations"),
    ).first()
    lo = (plan.first_ms or 0) // 1000
    hi = plan.last_ms // 1000
    bucket = max(1, -(-(hi - lo + 1) // PLOT_POINTS_MAX))
    series = (
        rates.withColumn("t", F.floor((F.col("second") - lo) / bucket) * bucket + lo)
        .groupBy("t")
        .agg(
            *(F.sum(c).alias(c) for c in ("published", "delivered", "acked", "returned",
                                          "dead_lettered")),
            F.max("ready").alias("ready_max"),
            F.max("checked_out").alias("checked_out_max"),
        )
        .orderBy("t")
        .collect()
    )  # fmt: skip
    histogram = (
        messages.filter((outcome == "acked") & F.col("enqueue_ms").isNotNull())
        .select(F.floor(F.log2(F.col("settle_ms") - F.col("enqueue_ms") + 1)).alias("bin"))
        .groupBy("bin")
        .count()
        .orderBy("bin")
        .collect()
    )
    counted = {k: int(v or 0) for k, v in (totals.asDict() if totals else {}).items()}
    outcomes = {name: counted.pop(name, 0) for name in OUTCOMES}
    outcomes["queued"] = counted.pop("queued", 0)
    return {
        "outcomes": outcomes,
        "totals": counted,
        "consumers": {
            k: int(v or 0) for k, v in (consumer_totals.asDict() if consumer_totals else {}).items()
        },
        "bucket_s": bucket,
        "series": [r.asDict() for r in series],
        "ack_histogram": [(int(r["bin"]), int(r["count"])) for r in histogram],
        "latency": sorted((r.asDict() for r in latency), key=lambda r: (r["queue"], r["measure"])),
    }


def _summary(
    spark: SparkSession,
    config: AnalyzeConfig,
    plan: LogPlan,
    members: dict[str, list[str]],
    facts: dict[str, Any],
    verify: dict[str, Any],
    elapsed_s: float,
) -> dict[str, Any]:
    return {
        "log": plan.path,
        "log_chosen": config.chosen_because,
        "node": plan.node,
        "bytes": plan.size,
        "entries": plan.entries,
        "commands": plan.commands,
        "entries_above_saved_commit_index": plan.uncommitted,
        "snapshot_index": plan.snapshot_index,
        "upgrades": [{"index": u.index, "to": u.to_version} for u in plan.upgrades],
        "window": {"from_ms": config.window[0], "to_ms": config.window[1]},
        "groups": len(members),
        "queues": sum(len(v) for v in members.values()),
        "replay_check": verify,
        "outcomes": facts["outcomes"],
        "totals": facts["totals"],
        "consumer_totals": facts["consumers"],
        "latency": facts["latency"],
        "elapsed_s": round(elapsed_s, 3),
        "commands_per_s": round(plan.commands / elapsed_s, 1) if elapsed_s > 0 else None,
        "master": spark.sparkContext.master,
        "default_parallelism": spark.sparkContext.defaultParallelism,
        "spark_version": spark.version,
    }
