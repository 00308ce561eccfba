"""`quorumq simulate`: deterministic simulation of a whole cluster (raft/sim).

One seed (`--seed S`) replays exactly: the same seed and flags print the same trace hash in any
process. A campaign (`--seeds N`, bounded by `--minutes M`) runs seeds one after another and
shrinks each failure to a shorter fault schedule, printed as the command that replays it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from cluster.cli.exits import FAILURE, USAGE, CliError

EXAMPLE = """\b
Example:
  quorumq simulate --seed 7
  quorumq simulate --seed 7 --faults '3.20:isolate:n2,9.00:heal:'
  quorumq simulate --seeds 100 --minutes 5 -o json"""

SHRINK_RUNS_MAX = 30
WIRE_CHOICES = ["quorumq", "pysyncobj", "pysyncobj2", "rotate"]  # raft.sim's WIRES and ROTATE


@click.command("simulate", epilog=EXAMPLE)
@click.option("--seed", type=click.IntRange(min=0), help="Run this one seed.")
@click.option("--seeds", type=click.IntRange(min=1, max=10_000_000), help="Run a campaign.")
@click.option(
    "--first-seed",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="The campaign's first seed.",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0.0, min_open=True),
    help="Stop the campaign after this much wall time.",
)
@click.option("--nodes", type=click.IntRange(3, 5), default=3, show_default=True)
@click.option("--clients", type=click.IntRange(1, 32), default=6, show_default=True)
@click.option(
    "--seconds",
    type=click.FloatRange(min=1.0, max=3600.0),
    default=30.0,
    show_default=True,
    help="Virtual seconds of workload under faults.",
)
@click.option("--no-flaky", is_flag=True, help="No lossy/duplicating/reordering links.")
@click.option(
    "--slow", is_flag=True, help="Also slow links (in order, 0.2-1.4 s later: across elections)."
)
@click.option("--disk", is_flag=True, help="Power cuts may also leave a flipped byte unsynced.")
@click.option("--reads", is_flag=True, help="Also reads on every member, checked for staleness.")
@click.option(
    "--wire",
    type=click.Choice(WIRE_CHOICES),
    help='The peer codec: ours (CBOR), pysyncobj\'s pickle (transport = "pysyncobj"), that '
    "pickle at protocol 2 (peers from before 8345617), or rotate: each seed's from its number "
    "[default: quorumq for --seed, rotate for --seeds].",
)
@click.option("--faults", help="This fault schedule instead of the seed's (at:op:args,...).")
@click.option("--no-shrink", is_flag=True, help="Report failures as found, unshrunk.")
@click.option(
    "-o",
    "--output",
    "output_here",
    type=click.Choice(["table", "json", "jsonl"]),
    default=None,
    help="Output format (the global -o, also after the command).",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    seed: int | None,
    seeds: int | None,
    first_seed: int,
    minutes: float | None,
    nodes: int,
    clients: int,
    seconds: float,
    no_flaky: bool,
    slow: bool,
    disk: bool,
    reads: bool,
    wire: str | None,
    faults: str | None,
    no_shrink: bool,
    output_here: str | None,
) -> None:
    """Run the real replica code of NODES members in one process, on a virtual clock, a
    simulated network and a power-loss disk, under a seeded fault schedule and a queue
    workload; check Raft's safety properties and the total-queue verdict.

    Exits 1 if a seed fails, printing the command that replays it (shrunk).
    """
    from raft.sim import SimParams, parse_faults  # deferred: keeps `quorumq --help` fast
    from raft.sim.faults import FaultSyntaxError

    if (seed is None) == (seeds is None):
        raise CliError("give exactly one of --seed S or --seeds N", USAGE)
    if faults is not None and seed is None:
        raise CliError("--faults replays one seed: give it with --seed", USAGE)
    try:
        schedule = None if faults is None else parse_faults(faults)
    except FaultSyntaxError as err:
        raise CliError(str(err), USAGE) from err
    wire = wire or ("quorumq" if seed is not None else "rotate")
    params = SimParams(
        nodes, seconds, clients, not no_flaky, wire=wire, slow=slow, reads=reads, disk=disk
    )
    output = output_here or (ctx.obj.output if ctx.obj is not None else "table")
    if seed is not None:
        failed = _one(seed, params, schedule, not no_shrink, output)
    else:
        assert seeds is not None
        failed = _campaign(first_seed, seeds, minutes, params, not no_shrink, output)
    if failed:
        ctx.exit(FAILURE)


def _row(result: Any, params: Any) -> dict[str, Any]:
    from raft.sim import seed_params

    verdict = result.verdict
    return {
        "seed": result.seed,
        "wire": seed_params(result.seed, params).wire,
        "trace_hash": result.trace_hash,
        "ok": not result.failed,
        "faults": len(result.faults),
        "sim_s": round(result.sim_seconds, 2),
        "wall_s": round(result.wall_seconds, 2),
        "sim_per_wall": round(result.sim_seconds / max(result.wall_seconds, 1e-9), 1),
        "cpu_s": round(result.cpu_seconds, 2),
        "sim_per_cpu": round(result.sim_seconds / max(result.cpu_seconds, 1e-9), 1),
        "operations": result.operations,
        "confirmed": verdict.confirmed if verdict else 0,
        "violations": result.violations,
    }


def _show(row: dict[str, Any], output: str) -> None:
    if output in ("json", "jsonl"):
        click.echo(json.dumps(row, indent=None if output == "jsonl" else 2))
        return
    status = "ok" if row["ok"] else "FAILED"
    click.echo(
        f"seed {row['seed']} ({row['wire']}): {status}  trace {row['trace_hash']}  "
        f"{row['sim_s']} sim s in "
        f"{row['wall_s']} s ({row['sim_per_wall']}x; {row['sim_per_cpu']}x per CPU second)  "
        f"{row['operations']} ops, "
        f"{row['confirmed']} confirmed, {row['faults']} faults"
    )
    for violation in row["violations"][:5]:
        click.echo(f"  {violation}")


def _report_failure(result: Any, params: Any, shrink_it: bool, output: str) -> None:
    from raft.sim import reproduce_command, shrink

    if shrink_it:
        result, params = shrink(result, params, SHRINK_RUNS_MAX)
    command = reproduce_command(result, params)
    if output in ("json", "jsonl"):
        click.echo(
            json.dumps({"seed": result.seed, "reproduce": command, "violations": result.violations})
        )
    else:
        click.echo(f"  shrunk to {len(result.faults)} faults; reproduce with:\n  {command}")


def _one(seed: int, params: Any, schedule: Any, shrink_it: bool, output: str) -> bool:
    from raft.sim import run_seed

    result = run_seed(seed, params, schedule)
    _show(_row(result, params), output)
    if result.failed:
        _report_failure(result, params, shrink_it and schedule is None, output)
    return bool(result.failed)


def _campaign(
    first: int, count: int, minutes: float | None, params: Any, shrink_it: bool, output: str
) -> bool:
    from raft.sim import run_seed

    started, cpu_started = time.perf_counter(), time.process_time()
    failures = runs = 0
    sim_total = 0.0
    for seed in range(first, first + count):
        if minutes is not None and time.perf_counter() - started > minutes * 60:
            break
        result = run_seed(seed, params)
        runs += 1
        sim_total += result.sim_seconds
        if result.failed or output != "table":
            _show(_row(result, params), output)
        if result.failed:
            failures += 1
            _report_failure(result, params, shrink_it, output)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    summary = {
        "seeds_run": runs,
        "failed": failures,
        "wall_s": round(wall, 1),
        "sim_s": round(sim_total, 1),
        "sim_per_wall": round(sim_total / max(wall, 1e-9), 1),
        "sim_per_cpu": round(sim_total / max(cpu, 1e-9), 1),
    }
    if output in ("json", "jsonl"):
        click.echo(json.dumps({"campaign": summary}))
    else:
        click.echo(
            f"campaign: {runs} seeds, {failures} failed, {summary['sim_s']} sim s in "
            f"{summary['wall_s']} s ({summary['sim_per_wall']}x; "
            f"{summary['sim_per_cpu']}x per CPU second)"
        )
    return failures > 0
