"""`quorumq pipeline`: Spark jobs over the machine, a thin shell over the `pipeline` package."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from cluster.cli.exits import CANT_CREATE, FAILURE, UNAVAILABLE, USAGE, CliError

if TYPE_CHECKING:  # pyspark is slow to import: the CLI imports the pipeline only when used
    from pipeline.fuzz_job import CampaignConfig


class UpgradeAtType(click.ParamType[int | Literal["random"], Any]):
    """`random` or a non-negative log step at which the upgrade to the latest version happens."""

    name = "random|K"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | Literal["random"]:
        if value == "random":
            return "random"
        try:
            step = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither 'random' nor an integer", param, ctx)
        if step < 0:
            self.fail(f"{step} is negative", param, ctx)
        return step


@click.group()
def pipeline() -> None:
    """Spark jobs over the fifo machine: distributed fuzz campaigns and log analytics."""


@pipeline.command("fuzz")
@click.option("--seeds", type=click.IntRange(min=1), required=True, help="Number of seeds.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Commands per seed.")
@click.option(
    "--machine-version",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Machine version each seed starts with.",
)
@click.option(
    "--upgrade-at",
    type=UpgradeAtType(),
    default=None,
    help="Upgrade to the latest version at step K, or at a random step per seed.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Spark partitions (default: 4 per core, at most one per seed).",
)
@click.option(
    "--first-seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seeds run are first-seed .. first-seed+seeds-1.",
)
@click.option(
    "--snapshot-check/--no-snapshot-check",
    default=True,
    show_default=True,
    help="Check snapshot + replay == full replay at a random point of every seed.",
)
@click.option(
    "--apply-fn",
    default=None,
    hidden=True,
    help="module:function replacing fifo.apply (plants a broken machine in tests).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Output directory: seeds.parquet, summary.json, upgrade_profile.png.",
)
@click.pass_context
def fuzz(
    ctx: click.Context,
    seeds: int,
    steps: int,
    machine_version: int,
    upgrade_at: int | Literal["random"] | None,
    master: str,
    partitions: int | None,
    first_seed: int,
    snapshot_check: bool,
    apply_fn: str | None,
    out_dir: Path,
) -> None:
    """Run a seeded fuzz campaign on Spark; exit 1 when any seed fails.

    Each seed runs the machine with its invariants, a snapshot/replay check and, with
    --upgrade-at, an upgrade to the latest version. A failing seed's row carries the
    `quorumq fuzz` command that reproduces it locally. Progress goes to stderr.

    \b
    Example:
      quorumq pipeline fuzz --seeds 200 --steps 200 --upgrade-at random \\
        --master 'local[2]' --out /tmp/campaign
    """
    from pipeline.fuzz_job import CampaignConfig  # Spark imports are slow: only when used

    _check_machine_version(machine_version, upgrade_at)
    if isinstance(upgrade_at, int) and upgrade_at >= steps:
        raise CliError(f"--upgrade-at {upgrade_at} must be below --steps {steps}", USAGE)
    _check_apply_fn(apply_fn)
    _check_out_dir(out_dir)
    config = CampaignConfig(steps, machine_version, upgrade_at, snapshot_check, apply_fn)
    summary = _run(config, seeds, first_seed, partitions, master, out_dir)
    _print_summary(summary, ctx.obj.output if ctx.obj else "table")
    if summary["failures"]:
        raise CliError(f"{summary['failures']} of {summary['seeds']} seeds failed", FAILURE)


def _check_machine_version(machine_version: int, upgrade_at: object) -> None:
    """Usage errors for a version the machine lacks or an upgrade with nowhere to go. An
    unreleased version (fifo.UNRELEASED_VERSIONS) is fuzzed before it ships, as `quorumq fuzz`
    does."""
    from fifo import LATEST_VERSION, MACHINES

    if machine_version not in MACHINES:
        raise CliError(
            f"--machine-version {machine_version} is not one of {sorted(MACHINES)}", USAGE
        )
    if upgrade_at is not None and machine_version >= LATEST_VERSION:
        raise CliError(f"--upgrade-at needs --machine-version below {LATEST_VERSION}", USAGE)


def _check_apply_fn(apply_fn: str | None) -> None:
    """Fail fast on the driver when --apply-fn cannot be imported."""
    from pipeline.fuzz_job import resolve_apply_fn

    if apply_fn is not None:
        try:
            resolve_apply_fn(apply_fn)
        except ValueError as err:
            raise CliError(f"--apply-fn: {err}", USAGE) from err


def _check_out_dir(out_dir: Path) -> None:
    """The output directory must be creatable before Spark starts (which takes seconds)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"cannot create --out {out_dir}: {err}", CANT_CREATE) from err


def _run(
    config: CampaignConfig,
    seeds: int,
    first_seed: int,
    partitions: int | None,
    master: str,
    out_dir: Path,
) -> dict[str, Any]:
    """Start Spark on `master`, run the campaign, always stop Spark."""
    from pyspark.sql import SparkSession

    from pipeline.campaign import Campaign, default_partitions, execute
    from pipeline.spark import create_session

    # An embedding program (or a test) may already run a session: use it and leave it running.
    owned = SparkSession.getActiveSession() is None
    click.echo(f"starting spark on {master}", err=True)
    try:
        spark = create_session(master)
    except Exception as err:  # py4j and the launcher raise several unrelated types
        raise CliError(f"cannot start spark on {master}: {err}", UNAVAILABLE) from err
    try:
        slices = partitions or default_partitions(spark, seeds)
        click.echo(f"fuzzing {seeds} seeds in {slices} partitions", err=True)
        campaign = Campaign(seeds, first_seed, slices, config)
        return execute(spark, campaign, out_dir, progress=sys.stderr)
    finally:
        if owned:
            spark.stop()


def _print_summary(summary: dict[str, Any], output: str) -> None:
    """The summary on stdout: the JSON document, or a few lines for people."""
    if output in ("json", "jsonl"):
        click.echo(json.dumps(summary, sort_keys=True, indent=None if output == "jsonl" else 2))
        return
    click.echo(
        f"{summary['seeds']} seeds, {summary['failures']} failing, "
        f"{summary['seeds_per_s']} seeds/s in {summary['elapsed_s']} s "
        f"on {summary['master']} (spark {summary['spark_version']})"
    )
    for failing in summary["failing_seeds"]:
        reason = failing["first_violation"] or failing["error"]
        click.echo(f"seed {failing['seed']}: {reason}\n  reproduce: {failing['reproduce']}")
    for name, path in summary["outputs"].items():
        click.echo(f"{name}: {path}")


from cluster.cli.pipeline_analyze import analyze  # noqa: E402 - their own modules, added here
from cluster.cli.rebalance_eval import rebalance_eval  # noqa: E402

pipeline.add_command(analyze)
pipeline.add_command(rebalance_eval)
from cluster.cli.pipeline_simulate import simulate  # noqa: E402

pipeline.add_command(simulate)
