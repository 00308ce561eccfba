"""`rebalance-eval` on a real local[2] Spark session, on the small grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline.rebalance_job import METRICS, RESULT_SCHEMA, Grid, run_eval

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def test_the_small_grid_writes_parquet_summary_and_one_plot_per_metric(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Every case x strategy is a row of the explicit schema; summary.json pairs the cases."""
    grid = Grid.small()
    summary = run_eval(spark, grid, tmp_path, partitions=2)
    runs = spark.read.parquet(str(tmp_path / "runs.parquet"))
    assert [f.name for f in runs.schema.fields] == [f.name for f in RESULT_SCHEMA.fields]
    assert runs.count() == len(grid.cases()) * 5
    assert runs.where("strategy = 'sticky' AND spread > 1").count() == 0
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["leaderless_vs_sticky"]["overall"]["cases"] == len(grid.cases())
    assert on_disk["strategies"]["leaderless"]["converged_fraction"] == 1.0
    assert summary["plots"] == [f"rebalance_{m}.png" for m in METRICS]
    for name in summary["plots"]:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
