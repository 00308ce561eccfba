"""Run a fuzz campaign end to end: Parquet rows, `summary.json` and a PNG plot in one directory."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from pyspark import StorageLevel
from pyspark.sql import SparkSession

from pipeline.fuzz_job import (
    CampaignConfig,
    failures,
    run_campaign,
    seed_frame,
    totals,
    upgrade_profile,
)
from pipeline.plots import plot_upgrade_profile
from pipeline.progress import report_progress

FAILING_SEEDS_MAX = 100  # the summary lists this many; the Parquet rows have every one
PARQUET_NAME = "seeds.parquet"
SUMMARY_NAME = "summary.json"
PLOT_NAME = "upgrade_profile.png"


@dataclass(frozen=True, slots=True)
class Campaign:
    """Which seeds to run, in how many Spark partitions, and what each seed runs."""

    seeds: int
    first_seed: int
    partitions: int
    config: CampaignConfig


def default_partitions(spark: SparkSession, seeds: int) -> int:
    """Four partitions per core evens out slow seeds; never more partitions than seeds."""
    return max(1, min(seeds, 4 * spark.sparkContext.defaultParallelism))


def execute(
    spark: SparkSession, campaign: Campaign, out_dir: Path, progress: TextIO | None = None
) -> dict[str, Any]:
    """Run `campaign` on `spark`, write its outputs under `out_dir` and return the summary.

    The executors write the Parquet rows, so on a real cluster `out_dir` must be a shared path;
    the driver writes summary.json and the plot from small collected aggregates.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    seeds = seed_frame(spark, campaign.first_seed, campaign.seeds, campaign.partitions)
    # Persisted so that the aggregates below read the rows instead of fuzzing every seed again.
    results = run_campaign(seeds, campaign.config).persist(StorageLevel.MEMORY_AND_DISK)
    started = time.perf_counter()
    try:
        with report_progress(spark, "fuzz", progress):
            results.write.mode("overwrite").parquet(str(out_dir / PARQUET_NAME))
        elapsed_s = time.perf_counter() - started
        if progress is not None:
            print(f"fuzz: {campaign.seeds} seeds done in {elapsed_s:.1f} s", file=progress)
        counts = totals(results).first()
        failing = failures(results).limit(FAILING_SEEDS_MAX + 1).collect()
        profile = upgrade_profile(results).collect()
    finally:
        results.unpersist()
    summary = _summary(spark, campaign, counts.asDict() if counts else {}, elapsed_s, failing)
    summary["outputs"] = {
        "parquet": str(out_dir / PARQUET_NAME),
        "summary": str(out_dir / SUMMARY_NAME),
        "plot": str(out_dir / PLOT_NAME),
    }
    plot_upgrade_profile(profile, _plot_title(campaign, summary), out_dir / PLOT_NAME)
    (out_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def _summary(
    spark: SparkSession,
    campaign: Campaign,
    counts: dict[str, Any],
    elapsed_s: float,
    failing: list[Any],
) -> dict[str, Any]:
    """The summary.json document: counts, rate, where it ran, and the failing seeds."""
    seeds = int(counts.get("seeds", 0))
    return {
        "seeds": seeds,
        "failures": int(counts.get("failures", 0)),
        "violations": int(counts.get("violations", 0)),
        "errors": int(counts.get("errors", 0)),
        "elapsed_s": round(elapsed_s, 3),
        "seeds_per_s": round(seeds / elapsed_s, 3) if elapsed_s > 0 else None,
        "seed_ms_mean": round(counts.get("seed_ms_total", 0.0) / seeds, 3) if seeds else None,
        "master": spark.sparkContext.master,
        "default_parallelism": spark.sparkContext.defaultParallelism,
        "spark_version": spark.version,
        "first_seed": campaign.first_seed,
        "partitions": campaign.partitions,
        "campaign": asdict(campaign.config),
        "failing_seeds": [row.asDict() for row in failing[:FAILING_SEEDS_MAX]],
        "failing_seeds_truncated": len(failing) > FAILING_SEEDS_MAX,
    }


def _plot_title(campaign: Campaign, summary: dict[str, Any]) -> str:
    """A one-line plot title naming the campaign and its outcome."""
    config = campaign.config
    return (
        f"{summary['seeds']} seeds x {config.steps} steps, machine v{config.machine_version}, "
        f"upgrade at {config.upgrade_at}: {summary['failures']} failing"
    )
