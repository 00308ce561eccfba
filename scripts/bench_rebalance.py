"""Benchmark consumer-group assignment: balance degree, stickiness, moves against the lower bound
and compute time, for the sticky assignment and RocketMQ's baselines in the same run.

    python scripts/bench_rebalance.py --json [--quick] [--steps 8] [--seed 1] [--no-png]

Groups of 4..256 partitions and 1..64 members run five membership sequences: `join` (N members,
then one joins per step), `leave` (N+steps members, a random one leaves per step), `crash` (a
random member crashes, a replacement with a new id joins, alternately), `scale_out` (1 -> N) and
`scale_in` (N -> 1). Every strategy replays the same sequence; each change recomputes the
assignment from the previous one. Metrics per (strategy, partitions, members, sequence):
balance degree (population std-dev of partitions per member after each step: mean and max),
spread (max - min), stickiness (the fraction of partitions whose previous owner stayed that keep
it), moves per rebalance against the lower bound (`sticky.moves_lower_bound`: the fewest any
balanced assignment needs) and compute time per assignment. The target case (a join that
rebalances 256 partitions over 64 members, < 1 ms) is timed on its own, on the pure function
and on machine v3's apply of that JoinGroup.
Prints JSON (or a summary) and writes results/bench_rebalance.json and .png.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster.balance import sticky
from cluster.balance.strategies import STRATEGIES, Strategy

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bench_rebalance.json"
PARTITIONS = (4, 8, 16, 32, 64, 128, 256)
MEMBERS = (1, 2, 4, 8, 16, 32, 64)
SEQUENCES = ("join", "leave", "crash", "scale_out", "scale_in")
TARGET_PARTITIONS = 256
TARGET_MEMBERS = 64
TARGET_MS = 1.0
BALANCE_STD_MAX = 0.5

Change = tuple[str, str]  # ("join" | "leave", member)
Assignment = Mapping[str, Sequence[str]]


def membership(
    sequence: str, members: int, steps: int, rng: random.Random
) -> tuple[list[str], list[Change]]:
    """The initial members (join order) and the changes of one sequence."""
    names = iter(f"member-{i:03d}" for i in range(10_000))
    if sequence == "join":
        start = [next(names) for _ in range(members)]
        return start, [("join", next(names)) for _ in range(steps)]
    if sequence == "scale_out":
        start = [next(names)]
        return start, [("join", next(names)) for _ in range(members - 1)]
    start = [next(names) for _ in range(members + (steps if sequence == "leave" else 0))]
    alive = list(start)
    changes: list[Change] = []
    if sequence == "scale_in":
        for member in reversed(start[1:]):
            changes.append(("leave", member))
        return start, changes
    for step in range(steps):
        if sequence == "crash" and step % 2:
            joined = next(names)
            alive.append(joined)
            changes.append(("join", joined))
            continue
        if len(alive) <= 1:
            break
        gone = alive.pop(rng.randrange(len(alive)))
        changes.append(("leave", gone))
    return start, changes


def _owners(assignment: Assignment) -> dict[str, str]:
    return {partition: member for member, held in assignment.items() for partition in held}


def replay(
    strategy: Strategy, partitions: list[str], start: list[str], changes: list[Change]
) -> dict[str, Any]:
    """Apply one sequence with one strategy; per-step metrics aggregated."""
    members = list(start)
    current = strategy(partitions, members, {})
    stds, spreads, times_us = [], [], []
    moved = bound = kept = staying = 0
    exact = True
    for kind, member in changes:
        members = (
            [*members, member]
            if kind == "join"
            else [other for other in members if other != member]
        )
        started = time.perf_counter_ns()
        nxt = strategy(partitions, members, current)
        times_us.append((time.perf_counter_ns() - started) / 1000)
        step_moves = sticky.moves(current, nxt)
        step_bound = sticky.moves_lower_bound(partitions, members, current)
        exact = exact and step_moves == step_bound
        moved += step_moves
        bound += step_bound
        before, after = _owners(current), _owners(nxt)
        stayed = [p for p, owner in before.items() if owner in members]
        staying += len(stayed)
        kept += sum(1 for p in stayed if after.get(p) == before[p])
        counts = [len(nxt.get(other, ())) for other in members]
        stds.append(statistics.pstdev(counts))
        spreads.append(max(counts) - min(counts))
        current = nxt
    rebalances = max(1, len(changes))
    return {
        "rebalances": len(changes),
        "balance_std_mean": statistics.fmean(stds) if stds else 0.0,
        "balance_std_max": max(stds, default=0.0),
        "spread_max": max(spreads, default=0),
        "stickiness": kept / staying if staying else 1.0,
        "moves": moved,
        "moves_lower_bound": bound,
        "moves_per_rebalance": moved / rebalances,
        "lower_bound_per_rebalance": bound / rebalances,
        "moves_equal_bound_every_step": exact,
        "compute_us_median": statistics.median(times_us) if times_us else 0.0,
        "compute_us_max": max(times_us, default=0.0),
    }


def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (partitions, members, sequence) under every strategy, the same changes for all."""
    rows = []
    partitions_grid = (4, 16, 64) if args.quick else PARTITIONS
    members_grid = (1, 3, 8) if args.quick else MEMBERS
    for partition_count in partitions_grid:
        partitions = [f"orders.{i}" for i in range(partition_count)]
        for member_count in members_grid:
            for sequence in SEQUENCES:
                rng = random.Random(f"{args.seed}/{partition_count}/{member_count}/{sequence}")
                start, changes = membership(sequence, member_count, args.steps, rng)
                for name, strategy in STRATEGIES.items():
                    row = replay(strategy, partitions, start, changes)
                    rows.append({
                        "strategy": name, "partitions": partition_count,
                        "members": member_count, "sequence": sequence, **row,
                    })  # fmt: skip
    return rows


def target_join(repeat: int) -> dict[str, Any]:
    """The acceptance case: one member joins a group of 63 holding 256 partitions (rebalance to
    64), timed on the pure function (median and max of `repeat` runs) and on the machine."""
    partitions = [f"orders.{i}" for i in range(TARGET_PARTITIONS)]
    members = [f"member-{i:03d}" for i in range(TARGET_MEMBERS)]
    before = sticky.assign(partitions, members[:-1])
    samples = []
    for _ in range(repeat):
        started = time.perf_counter_ns()
        after = sticky.assign(partitions, members, before)
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return {
        "partitions": TARGET_PARTITIONS,
        "members": TARGET_MEMBERS,
        "moves": sticky.moves(before, after),
        "moves_lower_bound": sticky.moves_lower_bound(partitions, members, before),
        "pure_function_ms_median": statistics.median(samples),
        "pure_function_ms_max": max(samples),
        "machine_apply_ms_median": _machine_apply_ms(repeat),
        "target_ms": TARGET_MS,
    }


def _machine_apply_ms(repeat: int) -> float | None:
    """The machine's apply of the JoinGroup that rebalances 256 x 64 (63 members hold the 256
    partitions; the 64th joins: 4 revokes, releases and grants plus the assignment); the
    median of `repeat` runs, each on a fresh copy of the state (the copy is not timed)."""
    import fifo
    from fifo import commands as c
    from fifo.codec import restore, snapshot
    from fifo.meta import Meta

    state = fifo.init_state(3)
    config = c.QueueConfig(single_active_consumer=True)
    index = 1
    fifo.apply(
        Meta(index, 1, 1000, 3),
        c.DeclarePartitionedQueue("orders", config, TARGET_PARTITIONS),
        state,
    )

    def join(i: int) -> c.JoinGroup:
        consumer = c.ConsumerId(f"member-{i:03d}", c.ConnectionId("n1", 1, i + 1))
        return c.JoinGroup("orders", consumer, c.SimplePrefetch(10), group="g", member=f"m{i}")

    for i in range(TARGET_MEMBERS - 1):
        index += 1
        fifo.apply(Meta(index, 1, 1000 + index, 3), join(i), state)
    frozen = snapshot(state)
    last = join(TARGET_MEMBERS - 1)
    meta = Meta(index + 1, 1, 2000 + index, 3)
    samples = []
    for _ in range(max(1, repeat // 4)):
        copy = restore(frozen)
        started = time.perf_counter_ns()
        fifo.apply(meta, last, copy)
        samples.append((time.perf_counter_ns() - started) / 1e6)
    group = copy.consumer_groups["g"]
    assert group.last_reassigned == TARGET_PARTITIONS // TARGET_MEMBERS, group.last_reassigned
    return statistics.median(samples)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per strategy: worst balance, mean stickiness, moves over the bound, time; per sequence."""
    out: dict[str, Any] = {}
    for name in STRATEGIES:
        mine = [row for row in rows if row["strategy"] == name]
        moved = sum(row["moves"] for row in mine)
        bound = sum(row["moves_lower_bound"] for row in mine)
        out[name] = {
            "scenarios": len(mine),
            "balance_std_max": max(row["balance_std_max"] for row in mine),
            "balance_std_mean": statistics.fmean(row["balance_std_mean"] for row in mine),
            "spread_max": max(row["spread_max"] for row in mine),
            "stickiness_mean": statistics.fmean(row["stickiness"] for row in mine),
            "moves": moved,
            "moves_lower_bound": bound,
            "moves_over_bound": moved / bound if bound else None,
            "excess_moves": moved - bound,
            "scenarios_at_bound_every_step": sum(
                1 for row in mine if row["moves_equal_bound_every_step"]
            ),
            "compute_us_median": statistics.median(row["compute_us_median"] for row in mine),
            "by_sequence": {
                sequence: {
                    "stickiness_mean": statistics.fmean(
                        row["stickiness"] for row in mine if row["sequence"] == sequence
                    ),
                    "balance_std_mean": statistics.fmean(
                        row["balance_std_mean"] for row in mine if row["sequence"] == sequence
                    ),
                    "excess_moves_per_rebalance": _excess(
                        [row for row in mine if row["sequence"] == sequence]
                    ),
                    "lower_bound_per_rebalance": statistics.fmean(
                        row["lower_bound_per_rebalance"]
                        for row in mine
                        if row["sequence"] == sequence
                    ),
                }
                for sequence in SEQUENCES
            },
        }
    return out


def _excess(rows: list[dict[str, Any]]) -> float:
    """Moves above the lower bound per rebalance, over a set of scenarios."""
    rebalances = sum(row["rebalances"] for row in rows)
    excess = sum(row["moves"] - row["moves_lower_bound"] for row in rows)
    return excess / rebalances if rebalances else 0.0


def acceptance(summary: dict[str, Any], target: dict[str, Any]) -> dict[str, bool]:
    """Issue 10's acceptance 3 for the sticky assignment, and the compute-time target."""
    mine = summary["sticky"]
    return {
        "sticky_balance_std_max_le_0_5": mine["balance_std_max"] <= BALANCE_STD_MAX,
        "sticky_moves_equal_lower_bound_every_step": (
            mine["scenarios_at_bound_every_step"] == mine["scenarios"]
        ),
        "target_join_256x64_under_1ms": target["pure_function_ms_median"] < TARGET_MS,
        "machine_apply_256x64_under_1ms": (
            target["machine_apply_ms_median"] is not None
            and target["machine_apply_ms_median"] < TARGET_MS
        ),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Four panels: balance degree, stickiness, excess moves (per sequence), and
    compute time against partitions at the largest member count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(STRATEGIES)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    width = 0.8 / len(names)
    panels: list[tuple[Any, str, Callable[[list[dict[str, Any]]], float]]] = [
        (axes[0][0], "balance degree (mean std-dev of partitions per member)",
         lambda rs: statistics.fmean(r["balance_std_mean"] for r in rs)),
        (axes[0][1], "stickiness (fraction of partitions keeping a surviving owner)",
         lambda rs: statistics.fmean(r["stickiness"] for r in rs)),
        (axes[1][0], "excess moves per rebalance (moves - balanced lower bound; < 0: unbalanced)",
         _excess),
    ]  # fmt: skip
    for axis, title, value in panels:
        for offset, name in enumerate(names):
            heights = [
                value([r for r in rows if r["strategy"] == name and r["sequence"] == sequence])
                for sequence in SEQUENCES
            ]
            xs = [i + offset * width for i in range(len(SEQUENCES))]
            axis.bar(xs, heights, width, label=name)
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(SEQUENCES))], SEQUENCES)
        axis.set_title(title, fontsize=10)
    axes[0][0].axhline(BALANCE_STD_MAX, color="grey", linestyle="--", linewidth=0.8)
    axes[1][0].set_yscale("symlog", linthresh=1)
    axes[0][0].legend(fontsize=8)
    top = max(row["members"] for row in rows)
    axis = axes[1][1]
    for name in names:
        points = sorted({row["partitions"] for row in rows})
        means = [
            statistics.fmean(
                r["compute_us_median"] for r in rows
                if r["strategy"] == name and r["members"] == top and r["partitions"] == p
            )
            for p in points
        ]  # fmt: skip
        axis.plot(points, means, marker="o", label=name)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.axhline(TARGET_MS * 1000, color="grey", linestyle="--", linewidth=0.8)
    axis.set_title(f"median compute time per assignment (us), {top} members", fontsize=10)
    axis.set_xlabel("partitions")
    axis.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse flags, run, print and save the results (the path of the PNG is in them)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="Print JSON only.")
    parser.add_argument("--quick", action="store_true", help="A small grid (for tests).")
    parser.add_argument("--steps", type=int, default=8, help="Changes in join/leave/crash.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=200, help="Runs of the 256 x 64 join.")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-png", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = grid(args)
    target = target_join(args.repeat)
    summary = summarise(rows)
    png = args.out.with_suffix(".png")
    if not args.no_png:
        plot(rows, png)
    results = {
        "acceptance": acceptance(summary, target),
        "target_join": target,
        "summary": summary,
        "config": {
            "partitions": sorted({row["partitions"] for row in rows}),
            "members": sorted({row["members"] for row in rows}),
            "sequences": list(SEQUENCES), "steps": args.steps, "seed": args.seed,
            "python": platform.python_version(), "seconds": time.perf_counter() - started,
            "png": None if args.no_png else str(png),
        },
        "rows": rows,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    shown = {key: value for key, value in results.items() if key != "rows"}
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        for key, value in shown.items():
            print(f"{key}: {value}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
