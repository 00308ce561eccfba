"""Simulation campaigns on Spark: seeds partitioned over tasks, each task runs its seeds of
`raft.sim` (3 to 5 real replicas on a virtual clock and network) and returns one small row per
seed; a failing seed is shrunk on its executor and comes back with the command that replays it.

Only seeds travel to the executors and only rows (a trace hash, counts, the first violations,
the reproduce command) come back; nothing is written to disk but the runs' own temp dirs, and,
with `rows_dir` (a directory every executor can write: local masters, a shared mount), each
seed's row as it completes, one JSON line in the task's `part-NNNNN.jsonl`: what a long campaign
ran so far, readable while it runs and kept if it is stopped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

VIOLATIONS_KEPT = 3
VIOLATION_CHARS_MAX = 500
SHRINK_RUNS_MAX = 20  # default runs to shrink one failing seed, on its executor


@dataclass(frozen=True, slots=True)
class SimCampaign:
    """What every seed of a campaign simulates (shipped to the executors with the tasks)."""

    seeds: int
    first_seed: int = 1
    sim_seconds: float = 30.0
    nodes: int = 3
    clients: int = 6
    flaky: bool = True
    wire: str = "rotate"  # raft.sim's ROTATE: each seed's wire from its number
    shrink: bool = True
    shrink_runs_max: int = SHRINK_RUNS_MAX
    plant: str | None = None  # `module:function` of a context manager (a planted bug, in tests)
    rows_dir: str | None = None  # each seed's row appended there as it completes (module doc)


def _params(campaign: SimCampaign) -> Any:
    from raft.sim import SimParams  # imported on the executor, where the task runs

    return SimParams(
        nodes=campaign.nodes,
        seconds=campaign.sim_seconds,
        clients=campaign.clients,
        flaky=campaign.flaky,
        wire=campaign.wire,
    )


def _planted(campaign: SimCampaign) -> Any:
    """The campaign's planted bug as a context manager, or one that does nothing."""
    import contextlib
    import importlib

    if campaign.plant is None:
        return contextlib.nullcontext()
    module_name, _, attribute = campaign.plant.partition(":")
    return getattr(importlib.import_module(module_name), attribute)()


def simulate_seed(seed: int, campaign: SimCampaign) -> dict[str, Any]:
    """Run one seed (shrinking it if it fails) and return its row; a crash is a failed row."""
    from raft.sim import reproduce_command, run_seed, shrink

    params = _params(campaign)
    started = time.perf_counter()
    row: dict[str, Any] = {"seed": seed, "failed": True, "trace_hash": None, "sim_s": 0.0}
    try:
        with _planted(campaign):
            result = run_seed(seed, params)
            row.update(_result_columns(result))
            if result.failed:
                smallest, smallest_params = result, params
                if campaign.shrink:
                    smallest, smallest_params = shrink(result, params, campaign.shrink_runs_max)
                row["reproduce"] = reproduce_command(smallest, smallest_params)
                row["faults"] = len(smallest.faults)
    except Exception as err:  # a crashing seed is a finding, not a reason to fail the job
        row["violations"] = [f"simulator raised {type(err).__name__}: {err}"[:VIOLATION_CHARS_MAX]]
    row["wall_s"] = time.perf_counter() - started
    return row


def _result_columns(result: Any) -> dict[str, Any]:
    return {
        "failed": bool(result.failed),
        "trace_hash": result.trace_hash,
        "sim_s": float(result.sim_seconds),
        "cpu_s": float(result.cpu_seconds),
        "operations": int(result.operations),
        "violations": [v[:VIOLATION_CHARS_MAX] for v in result.violations[:VIOLATIONS_KEPT]],
    }


def rows_file(rows_dir: str, partition: int) -> Path:
    """The JSON-lines file a task appends its seeds' rows to."""
    return Path(rows_dir) / f"part-{partition:05d}.jsonl"


def _run_partition(campaign: SimCampaign) -> Any:
    def run(partition: int, seeds: Iterator[int]) -> Iterator[dict[str, Any]]:
        path = None if campaign.rows_dir is None else rows_file(campaign.rows_dir, partition)
        for seed in seeds:
            row = simulate_seed(int(seed), campaign)
            if path is not None:
                with open(path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(row, sort_keys=True) + "\n")
            yield row

    return run


def run_campaign(spark: SparkSession, campaign: SimCampaign, partitions: int) -> dict[str, Any]:
    """Run every seed of `campaign` over `partitions` tasks; the summary with the failing rows."""
    started = time.perf_counter()
    if campaign.rows_dir is not None:
        Path(campaign.rows_dir).mkdir(parents=True, exist_ok=True)
    seeds = range(campaign.first_seed, campaign.first_seed + campaign.seeds)
    rows = (
        spark.sparkContext.parallelize(seeds, partitions)
        .mapPartitionsWithIndex(_run_partition(campaign))
        .collect()
    )
    wall = time.perf_counter() - started
    sim_total = sum(row["sim_s"] for row in rows)
    failing = sorted((r for r in rows if r["failed"]), key=lambda r: r["seed"])
    return {
        "campaign": dataclasses.asdict(campaign),
        "master": spark.sparkContext.master,
        "partitions": partitions,
        "seeds_run": len(rows),
        "failures": len(failing),
        "wall_s": round(wall, 1),
        "sim_s": round(sim_total, 1),
        "sim_per_wall": round(sim_total / max(wall, 1e-9), 1),
        "task_cpu_s": round(sum(r.get("cpu_s", 0.0) for r in rows), 1),
        "failing": failing,
        "trace_hashes": {r["seed"]: r["trace_hash"] for r in rows},
    }
