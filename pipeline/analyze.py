"""`pipeline analyze`: log analytics on Spark by replaying an exported log through the machine.

Stages (each reported on the progress stream):
1. scan (driver, streaming): header, snapshot, upgrade points, chunk offsets, end record;
2. parse (executors, one task per chunk): count the commands of each queue and the dead-letter
   links; only these counts come back, never the commands;
3. group: queues linked by dead-lettering replay together; groups are placed on tasks, largest
   first (a group is the unit of parallelism);
4. replay (executors, one task per slot): each task streams the log itself, keeps the commands
   of its groups (and the cluster-wide ones), replays each group in index order with
   `fifo.apply` at the recorded metas and `fifo.convert` at the recorded upgrades, and writes
   the messages / queue_rates / consumers rows straight to Parquet part files; the groups'
   final states come back to the driver and are checked against the log's `fifo_digest`;
5. aggregate: latency percentiles, totals and series with Spark SQL over the written tables,
   then plots, `report.md` and `summary.json`.

No command crosses a shuffle or goes through the JVM: Spark schedules the tasks, the data moves
from the log file to the Parquet files inside one Python worker. The log file must be readable
at the same path by every executor, and `out_dir` must be shared (the executors write the
Parquet tables and their progress files there, the driver writes the plots and the report).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.aggregate import Buckets, Facts
from pipeline.logscan import (
    Groups,
    LogPlan,
    chunk_records,
    chunk_shape,
    fast_route,
    place,
    scan_log,
)
from pipeline.progress import report_progress
from pipeline.replay import GroupReplay, Upgrade, merged_digest
from pipeline.schemas import (
    CONSUMER_SCHEMA,
    LATENCY_SCHEMA,
    MESSAGE_SCHEMA,
    RATE_SCHEMA,
)

BATCH_ROWS = 8192
TABLES = ("messages", "queue_rates", "consumers", "latency")
TABLE_SCHEMAS = {
    "messages": MESSAGE_SCHEMA,
    "queue_rates": RATE_SCHEMA,
    "consumers": CONSUMER_SCHEMA,
}
STAGES = 5
PLOT_POINTS_MAX = 600
PROGRESS_DIR = "_progress"  # under --out: one file per replay task, commands done so far
PROGRESS_INTERVAL_S = 5.0


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

Shape = dict[tuple[str, str | None, str | None], int]


def _shape_task(path: str, chunks: list[tuple[int, int]], ids: Iterable[int]) -> Iterator[Shape]:
    """Stage 2 on an executor: the counts of some chunks (nothing of the commands is kept)."""
    for chunk_id in ids:
        yield chunk_shape(path, *chunks[chunk_id])


@dataclass(frozen=True, slots=True)
class _ReplaySpec:
    """What every replay task needs (small: shipped with the task)."""

    path: str
    chunks: list[tuple[int, int]]
    members: dict[str, list[str]]
    placement: dict[str, int]
    initial_version: int
    upgrades: list[Upgrade]
    window: tuple[int | None, int | None]
    out_dir: str
    buckets: Buckets


class _TableWriter:
    """One task's Parquet part file of one table, written in batches of BATCH_ROWS rows."""

    def __init__(self, directory: Path, part: int, schema: pa.Schema) -> None:
        self.final = directory / f"part-{part:05d}.parquet"
        self.temp = directory / f".part-{part:05d}.parquet.{os.getpid()}.tmp"
        self.schema = schema
        self.rows: list[dict[str, Any]] = []
        self.count = 0
        self.writer = pq.ParquetWriter(str(self.temp), schema)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_batch(pa.RecordBatch.from_pylist(self.rows, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
        os.replace(self.temp, self.final)  # a retried task replaces its part whole


def _progress_file(out_dir: str, part: int) -> Path:
    return Path(out_dir) / PROGRESS_DIR / f"part-{part:05d}"


def _replay_task(
    spec: _ReplaySpec, snapshot: Any, parts: Iterable[int]
) -> Iterator[dict[str, Any]]:
    """Stage 4 on an executor: one `_PartReplay` per part (slot) given to this task."""
    snapshot_fifo = snapshot.value if snapshot is not None else None
    for part in parts:
        yield _PartReplay(spec, snapshot_fifo, part).run()


class _PartReplay:
    """Streams the whole log once and replays the groups placed on one part (each group in index
    order, with its own upgrades), writing their rows straight to the tables' part files."""

    def __init__(self, spec: _ReplaySpec, snapshot_fifo: bytes | None, part: int) -> None:
        self.spec = spec
        self.part = part
        self.mine = [g for g, p in spec.placement.items() if p == part]
        self.replays = {
            g: GroupReplay(spec.members[g], spec.initial_version, snapshot_fifo, spec.window)
            for g in self.mine
        }
        self.pending = {g: list(spec.upgrades) for g in self.mine}
        self.group_of = {name: g for g in self.mine for name in spec.members[g]}
        out = Path(spec.out_dir)
        self.writers = {
            t: _TableWriter(out / f"{t}.parquet", part, to_arrow_schema(schema))
            for t, schema in TABLE_SCHEMAS.items()
        }
        self.states: list[dict[str, Any]] = []
        self.progress = _progress_file(spec.out_dir, part)
        self.facts = Facts(spec.buckets)
        self.fold = {
            "messages": self.facts.add_message,
            "queue_rates": self.facts.add_rate,
            "consumers": self.facts.add_consumer,
        }

    def take(self, group: str, pairs: Iterable[tuple[str, dict[str, Any]]]) -> None:
        for table, row in pairs:
            if table == "state":
                stats = self.replays[group].stats
                extra = {k: stats[k] for k in ("commands", "errors", "resyncs")}
                self.states.append({**row, **extra})
            else:
                self.writers[table].add(row)
                self.fold[table](row)

    def run(self) -> dict[str, Any]:
        spec, mine, replays, pending, group_of = (
            self.spec, self.mine, self.replays, self.pending, self.group_of,
        )  # fmt: skip
        done = last_index = 0
        for start, end in spec.chunks if mine else ():
            for record in chunk_records(spec.path, start, end):
                for index, term, ms, version, blob in record.get("commands", ()):
                    if index <= last_index:
                        raise ValueError(f"{spec.path}: command index {index} after {last_index}")
                    last_index = index
                    queue = fast_route(blob)[0]
                    if queue is None:
                        targets: list[str] | tuple[str] = mine
                    elif queue in group_of:
                        targets = (group_of[queue],)
                    else:
                        continue
                    for group in targets:
                        replay, ups = replays[group], pending[group]
                        while ups and ups[0].index < index:
                            replay.upgrade(ups.pop(0))
                        replay.command(index, term, ms, version, blob)
                        if replay.out:
                            self.take(group, replay.drain())
                    done += len(targets)
            _write_progress(self.progress, done)
        for group in mine:
            for up in pending[group]:
                replays[group].upgrade(up)
            self.take(group, replays[group].finish())
        rows = {}
        for table, writer in self.writers.items():
            writer.close()
            rows[table] = writer.count
        _write_progress(self.progress, done)
        return {
            "part": self.part,
            "commands": done,
            "rows": rows,
            "states": self.states,
            "facts": self.facts,
        }


def _write_progress(path: Path, done: int) -> None:
    temp = path.with_suffix(f".{os.getpid()}.tmp")
    temp.write_text(str(done))
    os.replace(temp, path)


def _read_progress(out_dir: Path) -> int:
    total = 0
    for path in (out_dir / PROGRESS_DIR).glob("part-*[0-9]"):
        with contextlib.suppress(OSError, ValueError):
            total += int(path.read_text())
    return total


@contextlib.contextmanager
def _replay_progress(say: _Progress, out_dir: Path, total: int) -> Iterator[None]:
    """While the replay runs: commands replayed so far (from the tasks' progress files)."""
    stop = threading.Event()

    def poll() -> None:
        last = -1
        while not stop.wait(PROGRESS_INTERVAL_S):
            done = _read_progress(out_dir)
            if done != last:
                say.say(f"replay: {done}/{total} commands ({done / max(1e-9, say.elapsed()):.0f}"
                        " per s overall)")  # fmt: skip
                last = done

    thread = threading.Thread(target=poll, name="analyze-progress", daemon=True)
    if say.stream is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


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
    path, chunks = plan.path, list(plan.chunks)
    with report_progress(spark, "analyze: parse", say.stream):
        shapes = (
            sc.parallelize(range(len(chunks)), max(1, len(chunks)))
            .mapPartitions(lambda ids: _shape_task(path, chunks, ids))
            .collect()
        )
    shape: Shape = {}
    for part in shapes:
        for key, count in part.items():
            shape[key] = shape.get(key, 0) + count
    groups = Groups()
    sizes: dict[str, int] = {}
    global_rows = shape.get(("cmd", None, None), 0)
    for kind, queue, target in shape:
        if queue is None:
            continue
        groups.find(queue)
        if kind == "link" and target is not None:
            groups.link(queue, target)
    members = groups.members()
    group_of = {name: rep for rep, names in members.items() for name in names}
    for (kind, queue, _), count in shape.items():
        if kind == "cmd" and queue is not None:
            rep = group_of[queue]
            sizes[rep] = sizes.get(rep, 0) + count
    sizes = {rep: size + global_rows for rep, size in sizes.items()}
    slots = max(1, min(len(members), sc.defaultParallelism))
    placement = place(sizes, slots)
    parsed_commands = sum(c for (kind, _, _), c in shape.items() if kind == "cmd")
    say.done(
        f"parsed {parsed_commands} commands of {len(group_of)} queues into {len(members)} replay "
        f"groups on {slots} tasks"
    )
    paths = {t: out / f"{t}.parquet" for t in TABLES}
    for table in TABLES:
        shutil.rmtree(paths[table], ignore_errors=True)
        paths[table].mkdir(parents=True)
    shutil.rmtree(out / PROGRESS_DIR, ignore_errors=True)
    (out / PROGRESS_DIR).mkdir()
    buckets = plot_buckets(plan)
    spec = _ReplaySpec(
        path, chunks, members, placement, plan.initial_version, list(plan.upgrades),
        config.window, str(out), buckets,
    )  # fmt: skip
    snapshot = sc.broadcast(plan.snapshot_fifo) if plan.snapshot_fifo is not None else None
    try:
        with _replay_progress(say, out, sum(sizes.values())):
            results = (
                sc.parallelize(range(slots), slots)
                .mapPartitions(lambda parts: _replay_task(spec, snapshot, parts))
                .collect()
            )
    finally:
        if snapshot is not None:
            snapshot.unpersist()
        shutil.rmtree(out / PROGRESS_DIR, ignore_errors=True)
    states = [state for result in results for state in result["states"]]
    written = {t: sum(r["rows"][t] for r in results) for t in TABLE_SCHEMAS}
    say.done(
        f"replayed {len(members)} groups: " + ", ".join(f"{n} {t} rows" for t, n in written.items())
    )
    verify = _verify(plan, states)
    merged = Facts(spec.buckets)
    for result in results:
        merged.merge(result["facts"])
    latency = merged.latency_rows()
    paths["latency"].mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(latency, schema=to_arrow_schema(LATENCY_SCHEMA)),
        str(paths["latency"] / "part-00000.parquet"),
    )
    facts = merged.report() | {"bucket_s": spec.buckets.bucket, "latency": latency}
    say.done(
        f"wrote {facts['totals']['messages']} messages, {facts['consumers']['consumers']} "
        f"consumers, {len(latency)} latency rows under {out}"
    )
    summary = _summary(spark, config, plan, members, facts, verify, say.elapsed())
    summary["outputs"] = {t: str(p) for t, p in paths.items()}
    from pipeline.report import write_report  # matplotlib is slow to import

    summary["outputs"].update(write_report(out, summary, facts))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    summary["outputs"]["summary"] = str(out / "summary.json")
    say.done(f"report {out / 'report.md'} ({summary['elapsed_s']} s)")
    return summary


def plot_buckets(plan: LogPlan) -> Buckets:
    """At most PLOT_POINTS_MAX buckets of whole seconds over the log's time span."""
    lo, hi = (plan.first_ms or 0) // 1000, plan.last_ms // 1000
    return Buckets(lo, max(1, -(-(hi - lo + 1) // PLOT_POINTS_MAX)))


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
