"""`quorumq pipeline rebalance-eval`: the leaderless-versus-server-side rebalance study on Spark."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cluster.cli.exits import CANT_CREATE, UNAVAILABLE, CliError

CASES_MAX = 100_000


@click.command("rebalance-eval")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Output directory: runs.parquet, summary.json, one PNG per metric.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--grid",
    type=click.Choice(["full", "small"]),
    default="full",
    show_default=True,
    help="full: queues 4..256 x apps 1..64 x 6 churns x 3 view delays; small: a smoke test.",
)
@click.option(
    "--seeds", type=click.IntRange(1, 100), default=1, show_default=True, help="Seeds per case."
)
@click.option(
    "--partitions",
    type=click.IntRange(0, 10_000),
    default=0,
    show_default=True,
    help="Tasks the cases are dealt over, round-robin; 0: one task per case (the costliest "
    "start first, the cheap ones fill the gaps).",
)
@click.pass_context
def rebalance_eval(
    ctx: click.Context, out_dir: Path, master: str, grid: str, seeds: int, partitions: int
) -> None:
    """Compare the leaderless balancer with sticky, RocketMQ and consistent-hash assignments.

    Every case (queues x apps x churn x view delay x seed) runs each strategy; the leaderless one
    runs on the real fifo machine in virtual time. Metrics: balance degree (std of queues per
    consumer), stickiness, moves, releases, time to converge, allocation time. Progress and the
    elapsed time go to stderr; the summary (JSON) to stdout.

    \b
    Example:
      quorumq pipeline rebalance-eval --out /tmp/rebalance --master 'local[2]'
    """
    from pipeline.rebalance_job import Grid, run_eval  # Spark imports are slow: only when used
    from pipeline.spark import create_session

    chosen = Grid.full(seeds) if grid == "full" else Grid.small()
    cases = len(chosen.cases())
    if cases > CASES_MAX:
        raise CliError(f"{cases} cases is more than {CASES_MAX}", CANT_CREATE)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"cannot create --out {out_dir}: {err}", CANT_CREATE) from err
    click.echo(f"rebalance-eval: {cases} cases x 5 strategies on {master}", err=True)
    try:
        spark = create_session(master, app_name="quorumq-rebalance-eval")
    except Exception as err:  # the JVM or the master URL: report it as unavailable
        raise CliError(f"cannot start spark on {master}: {err}", UNAVAILABLE) from err
    try:
        summary = run_eval(spark, chosen, out_dir, partitions)
    finally:
        spark.stop()
    click.echo(f"rebalance-eval: done in {summary['seconds']}s, outputs in {out_dir}", err=True)
    json.dump(summary["leaderless_vs_sticky"]["overall"], sys.stdout, indent=2)
    click.echo()
