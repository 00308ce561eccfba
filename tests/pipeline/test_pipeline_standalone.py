"""`pipeline fuzz` and `pipeline analyze` on a real Spark standalone cluster equal local[2]."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from cluster.cli.main import cli
from pipeline.workload import write_log
from tests.pipeline.spark_standalone import StandaloneCluster, isolated_python

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(420)]

FUZZ = ["--seeds", "4", "--steps", "40", "--upgrade-at", "random"]

# The driver runs in its own process (one SparkContext per process; the local[2] session of
# the other tests lives in this one) and goes through the CLI exactly as a user would.
DRIVER = """
import json, sys
from cluster.cli.main import cli
from pipeline.spark import create_session
master, fuzz_out, log, analyze_out = sys.argv[1:5]
fuzz = sys.argv[5:]
spark = create_session(master)
where = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("fifo").__file__).first()
cli.main(["pipeline", "fuzz", *fuzz, "--master", master, "--out", fuzz_out], standalone_mode=False)
cli.main(["pipeline", "analyze", "--log", log, "--out", analyze_out, "--master", master,
          "--chunk-mib", "1"], standalone_mode=False)
spark.stop()
print("EXECUTOR_FIFO=" + json.dumps(where))
"""


def run_local(*args: str) -> None:
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if result.exception is not None:
        raise result.exception


def rows(spark: SparkSession, path: Path, *order: str) -> list[dict[str, Any]]:
    return [
        r.asDict(recursive=True) for r in spark.read.parquet(str(path)).orderBy(*order).collect()
    ]


def test_fuzz_and_analyze_on_a_standalone_cluster_equal_local_mode(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "workload.log"
    write_log(log, 1_200_000, seed=3, services=3)  # 3 groups, 2 chunks of 1 MiB
    remote, local = tmp_path / "remote", tmp_path / "local"
    # the daemons boot while the local[2] reference runs (JVM start-up is most of the wait)
    standalone = StandaloneCluster(tmp_path / "spark").launch()
    try:
        run_local("pipeline", "fuzz", *FUZZ, "--master", "local[2]", "--out", str(local / "fuzz"))
        run_local("pipeline", "analyze", "--log", str(log), "--out", str(local / "analyze"),
                  "--master", "local[2]", "--chunk-mib", "1")  # fmt: skip
        standalone.wait_ready()
        env = standalone.env()
        env["PYSPARK_PYTHON"] = str(isolated_python(tmp_path))
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, standalone.url, str(remote / "fuzz"), str(log),
             str(remote / "analyze"), *FUZZ],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:] + standalone.output()
    finally:
        standalone.stop()
    where = json.loads(done.stdout.split("EXECUTOR_FIFO=")[1])
    assert "quorumq-packages.zip" in where  # executors import quorumq from the shipped zip

    remote_fuzz = json.loads((remote / "fuzz" / "summary.json").read_text())
    assert remote_fuzz["master"] == standalone.url
    assert (remote_fuzz["seeds"], remote_fuzz["failures"]) == (4, 0)
    keep = ("seed", "digest", "failed", "violations", "final_machine_version", "upgrade_index")
    assert [{k: r[k] for k in keep} for r in rows(spark, remote / "fuzz" / "seeds.parquet", "seed")
            ] == [{k: r[k] for k in keep} for r in rows(spark, local / "fuzz" / "seeds.parquet",
                                                          "seed")]  # fmt: skip

    remote_sum = json.loads((remote / "analyze" / "summary.json").read_text())
    local_sum = json.loads((local / "analyze" / "summary.json").read_text())
    assert remote_sum["master"] == standalone.url and remote_sum["replay_check"]["equal"]
    for key in ("outcomes", "totals", "consumer_totals", "latency", "replay_check", "groups"):
        assert remote_sum[key] == local_sum[key], key
    for table, order in (
        ("messages", ("queue", "seq")),
        ("queue_rates", ("queue", "second")),
        ("consumers", ("queue", "consumer")),
    ):
        remote_rows = rows(spark, remote / "analyze" / f"{table}.parquet", *order)
        assert remote_rows == rows(spark, local / "analyze" / f"{table}.parquet", *order), table
        assert remote_rows
