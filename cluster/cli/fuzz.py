"""`quorumq fuzz`: run one seeded random log against the machine and check every invariant."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Literal

import click

from cluster.cli.exits import FAILURE, USAGE, CliError

VIOLATIONS_SHOWN = 5


class UpgradeAt(click.ParamType[int | str, Any]):
    """`random` or a non-negative entry index at which v1 is converted to v2."""

    name = "K|random"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | str:
        """Parse `random` or a non-negative integer."""
        if value == "random" or isinstance(value, int):
            return value  # type: ignore[no-any-return]
        try:
            index = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither 'random' nor an integer", param, ctx)
        if index < 0:
            self.fail(f"{index} is negative", param, ctx)
        return index


EXAMPLE = """\b
Example:
  quorumq fuzz --seed 7 --steps 5000 --machine-version 1 --upgrade-at random -o json"""


@click.command("fuzz", epilog=EXAMPLE)
@click.option("--seed", type=click.IntRange(min=0), required=True, help="Seed of the run.")
@click.option(
    "--steps",
    type=click.IntRange(min=1, max=10_000_000),
    required=True,
    help="Number of log entries to generate and apply.",
)
@click.option(
    "--machine-version", type=int, required=True, help="Machine version the run starts with."
)
@click.option(
    "--upgrade-at",
    type=UpgradeAt(),
    default=None,
    help="Convert to the latest version before entry K, or at a seeded random entry.",
)
@click.option(
    "--snapshot-check",
    is_flag=True,
    help="Also check snapshot + replay == full replay at a seeded random entry.",
)
@click.option(
    "--shrink",
    is_flag=True,
    help="On a violation, shrink the log to a minimal one that still breaks it (ddmin).",
)
@click.option(
    "-o",
    "--output",
    "output_here",
    type=click.Choice(["table", "json", "jsonl"]),
    default=None,
    help="Output format (the global -o, also accepted after the command).",
)
@click.pass_context
def fuzz(
    ctx: click.Context,
    seed: int,
    steps: int,
    machine_version: int,
    upgrade_at: int | str | None,
    snapshot_check: bool,
    shrink: bool,
    output_here: str | None,
) -> None:
    """Run a seeded random log against the machine, checking invariants after every step.

    Exits 1 on a violation and prints the command that reproduces it.
    """
    import fifo  # deferred: keeps `quorumq --help` fast
    import fifo.fuzz

    if machine_version not in fifo.MACHINES:  # an unreleased version is fuzzed before it ships
        raise CliError(
            f"--machine-version {machine_version} is not one of {sorted(fifo.MACHINES)}",
            USAGE,
        )
    if upgrade_at is not None and machine_version >= fifo.LATEST_VERSION:
        raise CliError(f"--upgrade-at needs a machine version below {fifo.LATEST_VERSION}", USAGE)
    if isinstance(upgrade_at, int) and upgrade_at >= steps:
        raise CliError(f"--upgrade-at {upgrade_at} must be below --steps {steps}", USAGE)
    upgrade: int | Literal["random"] | None = "random" if upgrade_at == "random" else (
        None if upgrade_at is None else int(upgrade_at)
    )
    result = fifo.fuzz.run(seed, steps, machine_version, upgrade, snapshot_check)
    output = output_here or (ctx.obj.output if ctx.obj is not None else "table")
    report = asdict(result)
    if shrink and result.violations:
        shrunk = fifo.fuzz.shrink(seed, steps, machine_version, upgrade)
        report["shrunk"] = None if shrunk is None else {
            "invariant": shrunk.invariant,
            "reproducible": shrunk.reproducible,
            "original_length": shrunk.original_length,
            "entries": shrunk.lines(),
        }
    if output in ("json", "jsonl"):
        click.echo(json.dumps(report, indent=None if output == "jsonl" else 2))
    else:
        _print_table(report)
    if result.violations:
        raise CliError(
            f"{len(result.violations)} invariant violation(s); reproduce with: {result.reproduce}",
            FAILURE,
        )


def _print_table(report: dict[str, Any]) -> None:
    keys = (
        "seed",
        "steps",
        "steps_run",
        "initial_machine_version",
        "final_machine_version",
        "upgrade_index",
        "snapshot_index",
        "ready",
        "total",
        "error_replies",
        "deliveries",
        "digest",
    )
    width = max(len(k) for k in keys)
    for key in keys:
        click.echo(f"{key:<{width}}  {report[key]}")
    violations = report["violations"]
    click.echo(f"{'violations':<{width}}  {len(violations)}")
    for violation in violations[:VIOLATIONS_SHOWN]:
        click.echo(f"  step {violation['step']} {violation['invariant']}: {violation['detail']}")
        click.echo(f"    command: {violation['command']}")
    shrunk = report.get("shrunk")
    if shrunk:
        click.echo(f"shrunk log ({len(shrunk['entries'])} of {shrunk['original_length']} entries, "
                   f"{shrunk['invariant']}):")
        for line in shrunk["entries"]:
            click.echo(f"  {line}")
