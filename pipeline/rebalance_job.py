"""`quorumq pipeline rebalance-eval`: the rebalance study on Spark.

A grid of cases (queues x apps x churn x view delay x seed) is partitioned over executors; each
case runs every strategy (`cluster.balance.evaluate.run_case`): the leaderless balancer on the real
machine in virtual time, RocketMQ's average / average-by-circle / consistent hash, and the
server-side sticky assignment. Outputs under --out: `runs.parquet` (RESULT_SCHEMA), `summary.json`
(means per strategy and churn, and the leaderless-versus-sticky comparison) and one PNG per metric.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from cluster.balance.evaluate import STRATEGY_NAMES, Case, run_case
from cluster.balance.simulator import CHURNS

RESULT_SCHEMA = StructType(
    [
        StructField("strategy", StringType(), nullable=False),
        StructField("queues", IntegerType(), nullable=False),
        StructField("apps", IntegerType(), nullable=False),
        StructField("churn", StringType(), nullable=False),
        StructField("view_delay_ms", IntegerType(), nullable=False),
        StructField("seed", LongType(), nullable=False),
        StructField("converged", BooleanType(), nullable=False),
        StructField("time_to_converge_ms", LongType(), nullable=False),  # virtual time
        StructField("steps", LongType(), nullable=False),  # machine commands in the rebalance
        StructField("releases", LongType(), nullable=False),
        StructField("moves", LongType(), nullable=False),  # queues taken from a live owner
        StructField("cascades", LongType(), nullable=False),  # hand-offs of a queue beyond one
        StructField("balance_std", DoubleType(), nullable=False),  # std of queues per consumer
        StructField("spread", IntegerType(), nullable=False),  # max - min queues per consumer
        StructField("stickiness", DoubleType(), nullable=False),  # live owners' queues kept
        StructField("allocation_ms", DoubleType(), nullable=False),  # wall time per decision
    ]
)
METRICS = ("balance_std", "stickiness", "moves", "releases", "time_to_converge_ms", "allocation_ms")


@dataclass(frozen=True, slots=True)
class Grid:
    """The cases to run; `full()` is the study in the README, `small()` the test's."""

    queues: tuple[int, ...]
    apps: tuple[int, ...]
    churns: tuple[str, ...]
    view_delays_ms: tuple[int, ...]
    seeds: int
    horizon_ms: int = 60_000

    @staticmethod
    def full(seeds: int = 1) -> Grid:
        return Grid((4, 16, 64, 256), (1, 4, 16, 64), CHURNS, (0, 250, 1000), seeds)

    @staticmethod
    def small() -> Grid:
        return Grid((4, 8), (1, 3), ("join", "crash"), (0, 200), 1, horizon_ms=30_000)

    def cases(self) -> list[Case]:
        """Every case, the most expensive first (they start while cheap ones fill the gaps)."""
        cases = [
            Case(q, a, churn, delay, seed, self.horizon_ms)
            for q in self.queues
            for a in self.apps
            for churn in self.churns
            for delay in self.view_delays_ms
            for seed in range(self.seeds)
        ]
        return sorted(cases, key=lambda c: -(c.queues * c.apps))


def _run_partition(cases: Iterable[Case]) -> Iterator[tuple[Any, ...]]:
    names = [f.name for f in RESULT_SCHEMA.fields]
    for case in cases:
        for row in run_case(case):
            yield tuple(row[n] for n in names)


def _run_slices(cases: list[Case], slices: int, ids: Iterable[int]) -> Iterator[tuple[Any, ...]]:
    for i in ids:
        yield from _run_partition(cases[i::slices])


def run_grid(spark: SparkSession, grid: Grid, partitions: int) -> DataFrame:
    """Run every case on the executors, dealt round-robin over `partitions` tasks (0: one task
    per case): task i runs cases i, i + partitions, ...; tasks start in order and the cases
    are sorted costliest first, so no task holds all the costliest cases and they start first."""
    cases = grid.cases()
    slices = len(cases) if partitions <= 0 else max(1, min(partitions, len(cases)))
    rdd = spark.sparkContext.parallelize(range(slices), slices)
    return spark.createDataFrame(
        rdd.mapPartitions(lambda ids: _run_slices(cases, slices, ids)), RESULT_SCHEMA
    )


def summarize(runs: DataFrame) -> dict[str, Any]:
    """Means per strategy (overall and per churn) and where leaderless beats or loses to sticky."""
    aggregates = [F.mean(m).alias(m) for m in METRICS]
    aggregates += [F.count("*").alias("runs"), F.mean(F.col("converged").cast("double"))
                   .alias("converged_fraction")]  # fmt: skip
    overall = {
        r["strategy"]: r.asDict() for r in runs.groupBy("strategy").agg(*aggregates).collect()
    }
    per_churn: dict[str, dict[str, Any]] = {}
    for r in runs.groupBy("strategy", "churn").agg(*aggregates).collect():
        per_churn.setdefault(r["strategy"], {})[r["churn"]] = r.asDict()
    return {
        "strategies": overall,
        "per_churn": per_churn,
        "leaderless_vs_sticky": _versus(runs),
    }


def _versus(runs: DataFrame) -> dict[str, Any]:
    """Paired cases: the fraction where leaderless is worse, and the means by view delay."""
    key = ["queues", "apps", "churn", "view_delay_ms", "seed"]
    lead = runs.where(F.col("strategy") == "leaderless").select(
        *key, *[F.col(m).alias(f"l_{m}") for m in (*METRICS, "converged")]
    )
    stick = runs.where(F.col("strategy") == "sticky").select(
        *key, *[F.col(m).alias(f"s_{m}") for m in METRICS]
    )
    paired = lead.join(stick, key)
    worse = {
        "moves": F.col("l_moves") > F.col("s_moves"),
        "time_to_converge_ms": F.col("l_time_to_converge_ms") > F.col("s_time_to_converge_ms"),
        "stickiness": F.col("l_stickiness") < F.col("s_stickiness"),
        "balance_std": F.col("l_balance_std") > F.col("s_balance_std") + 1e-9,
    }
    better = {
        "moves": F.col("l_moves") < F.col("s_moves"),
        "time_to_converge_ms": F.col("l_time_to_converge_ms") < F.col("s_time_to_converge_ms"),
        "stickiness": F.col("l_stickiness") > F.col("s_stickiness"),
        "balance_std": F.col("l_balance_std") < F.col("s_balance_std") - 1e-9,
    }
    cols = [F.count("*").alias("cases")]
    cols += [F.mean(c.cast("double")).alias(f"leaderless_worse_{m}") for m, c in worse.items()]
    cols += [F.mean(c.cast("double")).alias(f"leaderless_better_{m}") for m, c in better.items()]
    cols.append(F.mean(F.col("l_converged").cast("double")).alias("leaderless_converged"))
    means = [F.mean(f"{p}_{m}").alias(f"{p}_{m}") for p in "ls" for m in METRICS]
    by_delay = {
        str(r["view_delay_ms"]): r.asDict()
        for r in paired.groupBy("view_delay_ms").agg(*cols, *means).collect()
    }
    by_size = {
        f"{r['queues']}x{r['apps']}": r.asDict()
        for r in paired.groupBy("queues", "apps").agg(*cols, *means).collect()
    }
    overall = paired.agg(*cols).collect()[0].asDict()
    return {"overall": overall, "by_view_delay_ms": by_delay, "by_queues_x_apps": by_size}


def plot_metrics(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """One small PNG per metric: mean per churn pattern, strategies side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    per_churn = summary["per_churn"]
    strategies = [s for s in STRATEGY_NAMES if s in per_churn]
    churns = sorted({c for s in strategies for c in per_churn[s]})
    width = 0.8 / max(1, len(strategies))
    for metric in METRICS:
        figure, axes = plt.subplots(figsize=(8, 3.6))
        for i, strategy in enumerate(strategies):
            values = [per_churn[strategy].get(c, {}).get(metric) or 0.0 for c in churns]
            xs = [j + (i - (len(strategies) - 1) / 2) * width for j in range(len(churns))]
            axes.bar(xs, values, width, label=strategy)
        axes.set_xticks(range(len(churns)), churns)
        axes.set_ylabel(f"mean {metric}")
        if metric in ("time_to_converge_ms", "moves", "releases", "allocation_ms"):
            axes.set_yscale("symlog")
        axes.legend(fontsize=7, ncol=len(strategies), loc="upper center",
                    bbox_to_anchor=(0.5, 1.18), frameon=False)  # fmt: skip
        figure.tight_layout()
        path = out_dir / f"rebalance_{metric}.png"
        figure.savefig(path, format="png", dpi=72)
        plt.close(figure)
        paths.append(path)
    return paths


def run_eval(spark: SparkSession, grid: Grid, out_dir: Path, partitions: int) -> dict[str, Any]:
    """Run the grid, write runs.parquet, summary.json and the plots; return the summary."""
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = run_grid(spark, grid, partitions).cache()
    runs.write.mode("overwrite").parquet(str(out_dir / "runs.parquet"))
    summary = summarize(runs)
    summary["grid"] = {
        "queues": grid.queues, "apps": grid.apps, "churns": grid.churns,
        "view_delays_ms": grid.view_delays_ms, "seeds": grid.seeds,
        "horizon_ms": grid.horizon_ms, "cases": len(grid.cases()),
    }  # fmt: skip
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["plots"] = [p.name for p in plot_metrics(summary, out_dir)]
    runs.unpersist()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary
