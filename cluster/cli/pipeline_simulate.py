"""`quorumq pipeline simulate`: a `quorumq simulate` campaign spread over Spark tasks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from cluster.cli.exits import FAILURE, UNAVAILABLE, CliError

EXAMPLE = """\b
Example:
  quorumq pipeline simulate --master 'local[2]' --seeds 200 --sim-seconds 60
  quorumq pipeline simulate --master spark://host:7077 --seeds 10000 -o json
  quorumq pipeline simulate --master 'local[2]' --seeds 10000 --partitions 400 --rows-dir rows"""


@click.command("simulate", epilog=EXAMPLE)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--seeds", type=click.IntRange(1, 10_000_000), required=True, help="Seeds to run.")
@click.option("--first-seed", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--sim-seconds",
    type=click.FloatRange(1.0, 3600.0),
    default=30.0,
    show_default=True,
    help="Virtual seconds of workload under faults per seed.",
)
@click.option("--nodes", type=click.IntRange(3, 5), default=3, show_default=True)
@click.option("--clients", type=click.IntRange(1, 32), default=6, show_default=True)
@click.option("--no-flaky", is_flag=True, help="No lossy/duplicating/reordering links.")
@click.option(
    "--wire",
    type=click.Choice(["quorumq", "pysyncobj", "pysyncobj2", "rotate"]),
    default="rotate",
    show_default=True,
    help="The peer codec of every seed, or rotate: each seed's from its number (quorumq simulate).",
)
@click.option("--no-shrink", is_flag=True, help="Report failures as found, unshrunk.")
@click.option("--partitions", type=click.IntRange(min=1), help="Spark tasks (default 4/core).")
@click.option(
    "--rows-dir",
    type=click.Path(file_okay=False),
    help="Append each seed's row there as it completes (part-NNNNN.jsonl per task; every "
    "executor must reach it): a long campaign's results so far, kept if it is stopped.",
)
@click.option(
    "-o",
    "--output",
    "output_here",
    type=click.Choice(["table", "json", "jsonl"]),
    help="Output format (the global -o, also after the command).",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    master: str,
    seeds: int,
    first_seed: int,
    sim_seconds: float,
    nodes: int,
    clients: int,
    no_flaky: bool,
    wire: str,
    no_shrink: bool,
    partitions: int | None,
    rows_dir: str | None,
    output_here: str | None,
) -> None:
    """Run seeds FIRST_SEED .. FIRST_SEED+SEEDS-1 of the deterministic cluster simulator
    (raft/sim) on Spark; each failing seed is shrunk on its executor and printed with the
    `quorumq simulate` command that replays it. Exits 1 if any seed failed.
    """
    from pipeline.simulate_job import SimCampaign  # Spark imports are slow: only when used

    campaign = SimCampaign(
        seeds,
        first_seed,
        sim_seconds,
        nodes,
        clients,
        not no_flaky,
        wire,
        not no_shrink,
        rows_dir=None if rows_dir is None else str(Path(rows_dir).resolve()),
    )
    summary = _run(campaign, master, partitions)
    output = output_here or (ctx.obj.output if ctx.obj is not None else "table")
    _print(summary, output)
    if summary["failures"]:
        ctx.exit(FAILURE)


def _run(campaign: Any, master: str, partitions: int | None) -> dict[str, Any]:
    """Start Spark on `master`, run the campaign, always stop a session we started."""
    from pyspark.sql import SparkSession

    from pipeline.campaign import default_partitions
    from pipeline.progress import report_progress
    from pipeline.simulate_job import run_campaign
    from pipeline.spark import create_session

    owned = SparkSession.getActiveSession() is None
    click.echo(f"starting spark on {master}", err=True)
    try:
        spark = create_session(master)
    except Exception as err:  # py4j and the launcher raise several unrelated types
        raise CliError(f"cannot start spark on {master}: {err}", UNAVAILABLE) from err
    try:
        slices = partitions or default_partitions(spark, campaign.seeds)
        click.echo(f"simulating {campaign.seeds} seeds in {slices} partitions", err=True)
        with report_progress(spark, "simulate", sys.stderr):
            return run_campaign(spark, campaign, slices)
    finally:
        if owned:
            spark.stop()


def _print(summary: dict[str, Any], output: str) -> None:
    if output in ("json", "jsonl"):
        shown = {k: v for k, v in summary.items() if k != "trace_hashes"}
        click.echo(json.dumps(shown, sort_keys=True, indent=None if output == "jsonl" else 2))
        return
    click.echo(
        f"{summary['seeds_run']} seeds, {summary['failures']} failed, {summary['sim_s']} sim s "
        f"in {summary['wall_s']} s ({summary['sim_per_wall']}x) on {summary['master']}"
    )
    for row in summary["failing"]:
        click.echo(f"seed {row['seed']}: {'; '.join(row['violations'])}")
        if row.get("reproduce"):
            click.echo(f"  reproduce: {row['reproduce']}")
