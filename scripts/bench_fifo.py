"""Benchmark the fifo machine in-process: commands/s for the steady mix, SAC, 100 consumers, memory.

    python scripts/bench_fifo.py --json [--messages 200000] [--repeat 3] [--profile]

Prints JSON and writes bench_fifo.json into --output (default: a fresh temp dir). The steady mix
is enqueue -> deliver -> settle with
100-byte bodies and one consumer with prefetch 100; every enqueue and every settle is one command.
On machine v3 it adds message groups (issue 9): the grouped mix (10,000 groups, 10 consumers with
prefetch 10, enqueue -> deliver -> settle) against the same mix without groups in the same run,
the same pair draining a backlog (dispatch through the group index), and bytes per tracked group.
On machine v4 (unreleased, issue 32) deliveries come by reference (`RefDeliver`) and a queued
message holds no body: the memory figure adds a body only for messages whose body the state
holds (`fifo.bodies.referenced_bodies` counts the others), so v4's is the reference's ~88 bytes
(scripts/bench_message_memory.py), not that plus a body it never holds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fifo
from fifo.bodies import referenced_bodies
from fifo.commands import (
    AnnotatedEnqueue,
    Checkout,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    DeclareGroupedQueue,
    DeclareQueue,
    Enqueue,
    GroupConfig,
    QueueConfig,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver, Effect, RefDeliver
from fifo.meta import Meta
from fifo.state import State

BODY = b"x" * 100


class Bench:
    """A machine, its log index and a virtual clock, with helpers to apply commands."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.state: State = fifo.init_state(version)
        self.index = 0
        self.conn = ConnectionId("n1", 1, 1)

    def apply(self, command: Any) -> tuple[Any, list[Effect]]:
        """Apply one command at the next index."""
        self.index += 1
        meta = Meta(self.index, 1, 1_000 + self.index // 100, self.version)
        return fifo.apply(meta, command, self.state)

    def declare(self, queue: str, config: QueueConfig | None = None) -> None:
        """Declare a queue."""
        self.apply(DeclareQueue(queue, config or QueueConfig()))

    def consumer(self, queue: str, tag: str, prefetch: int) -> ConsumerKey:
        """Attach a simple_prefetch consumer; returns its key."""
        reply, _ = self.apply(Checkout(queue, ConsumerId(tag, self.conn), SimplePrefetch(prefetch)))
        return reply.consumer_key  # type: ignore[no-any-return]


def deliveries(effects: list[Effect]) -> list[tuple[ConsumerKey, int]]:
    """(consumer key, msg id) of every delivered message, in effect order."""
    found: list[tuple[ConsumerKey, int]] = []
    for effect in effects:
        if isinstance(effect, (Deliver, RefDeliver)):  # v4: bodies by reference, same msg ids
            found += [(effect.consumer_key, m.msg_id) for m in effect.messages]
    return found


def run_mix(
    bench: Bench, queue: str, messages: int, commands: list[Any] | None = None
) -> dict[str, Any]:
    """Enqueue `messages` (or the given enqueue `commands`), settling each delivery in the next
    command; returns the timing.

    Enqueue commands and every Meta are built before the clock starts (the raft layer hands
    decoded objects to apply), so the figure is the machine's, not the harness's.
    """
    version, state, apply = bench.version, bench.state, fifo.apply
    first = bench.index + 1
    enqueues = commands if commands is not None else [Enqueue(queue, BODY)] * messages
    messages = len(enqueues)
    metas = [Meta(first + n, 1, 1_000 + n // 100, version) for n in range(2 * messages + 1)]
    in_flight: deque[tuple[ConsumerKey, int]] = deque()
    position = 0
    started = time.perf_counter()
    started_cpu = time.process_time()
    for enqueue in enqueues:
        _, effects = apply(metas[position], enqueue, state)
        position += 1
        in_flight.extend(deliveries(effects))
        while in_flight:
            key, msg_id = in_flight.popleft()
            _, effects = apply(metas[position], Settle(queue, key, (msg_id,)), state)
            position += 1
            in_flight.extend(deliveries(effects))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - started_cpu
    bench.index += position
    overview = fifo.overview(state, queue)
    return {
        "commands": position,
        "seconds": round(elapsed, 4),
        "commands_per_s": int(position / elapsed) if elapsed else 0,
        # CPU time of this process: steadier than wall time on a shared, loaded host
        "commands_per_cpu_s": int(position / cpu) if cpu else 0,
        "left_total": overview.total if overview is not None else None,
    }


def steady_mix(version: int, messages: int) -> dict[str, Any]:
    """One consumer, prefetch 100."""
    bench = Bench(version)
    bench.declare("q")
    bench.consumer("q", "c1", 100)
    return run_mix(bench, "q", messages)


def sac_mix(version: int, messages: int) -> dict[str, Any]:
    """A single-active-consumer queue with one active and two waiting consumers."""
    bench = Bench(version)
    bench.declare("q", QueueConfig(single_active_consumer=True))
    for tag in ("c1", "c2", "c3"):
        bench.consumer("q", tag, 100)
    return run_mix(bench, "q", messages)


def competing_mix(version: int, messages: int, consumers: int = 100) -> dict[str, Any]:
    """100 competing consumers with prefetch 10 each."""
    bench = Bench(version)
    bench.declare("q")
    for n in range(consumers):
        bench.consumer("q", f"c{n}", 10)
    return {"consumers": consumers, **run_mix(bench, "q", messages)}


GROUPS = 10_000
GROUPED_CONSUMERS = 10
GROUPED_PREFETCH = 10


def grouped_commands(queue: str, messages: int, groups: int = GROUPS) -> list[Any]:
    """Publishes of message n to group `g<n mod groups>` (the x-group-id annotation)."""
    names = [f"g{n}" for n in range(groups)]
    return [AnnotatedEnqueue(queue, BODY, annotations=(("x-group-id", names[n % groups]),))
            for n in range(messages)]  # fmt: skip


def ten_consumers(version: int, grouped: bool) -> Bench:
    """A queue (grouped, sequenced, or not) with 10 consumers of prefetch 10."""
    bench = Bench(version)
    if grouped:
        bench.apply(DeclareGroupedQueue("q", QueueConfig(), GroupConfig()))
    else:
        bench.declare("q")
    for n in range(GROUPED_CONSUMERS):
        bench.consumer("q", f"c{n}", GROUPED_PREFETCH)
    return bench


def grouped_mix(version: int, messages: int, grouped: bool) -> dict[str, Any]:
    """Enqueue -> deliver -> settle with 10 consumers (prefetch 10), over 10,000 groups or none."""
    bench = ten_consumers(version, grouped)
    commands = grouped_commands("q", messages) if grouped else None
    return {"groups": GROUPS if grouped else 0, "consumers": GROUPED_CONSUMERS,
            "prefetch": GROUPED_PREFETCH, **run_mix(bench, "q", messages, commands)}  # fmt: skip


def backlog_drain(version: int, messages: int, grouped: bool) -> dict[str, Any]:
    """`messages` waiting (over 10,000 groups, or none) before 10 consumers (prefetch 10) attach
    and drain them, settling each delivery in its own command: dispatch goes through the group
    index (oldest head among free groups) instead of the enqueue fast path."""
    bench = Bench(version)
    if grouped:
        bench.apply(DeclareGroupedQueue("q", QueueConfig(), GroupConfig()))
    else:
        bench.declare("q")
    for command in grouped_commands("q", messages) if grouped else [Enqueue("q", BODY)] * messages:
        bench.apply(command)
    state, apply = bench.state, fifo.apply
    in_flight: deque[tuple[ConsumerKey, int]] = deque()
    started_cpu = time.process_time()
    started = time.perf_counter()
    commands = 0
    for n in range(GROUPED_CONSUMERS):  # the consumers attach: deliveries start
        _, effects = bench.apply(
            Checkout("q", ConsumerId(f"c{n}", bench.conn), SimplePrefetch(GROUPED_PREFETCH))
        )
        commands += 1
        in_flight.extend(deliveries(effects))
    first = bench.index + 1
    metas = [Meta(first + n, 1, 2_000, version) for n in range(messages + 1)]
    position = 0
    while in_flight:
        key, msg_id = in_flight.popleft()
        _, effects = apply(metas[position], Settle("q", key, (msg_id,)), state)
        position += 1
        in_flight.extend(deliveries(effects))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - started_cpu
    bench.index += position
    commands += position
    overview = fifo.overview(state, "q")
    return {
        "groups": GROUPS if grouped else 0,
        "backlog": messages,
        "commands": commands,
        "seconds": round(elapsed, 4),
        "commands_per_s": int(commands / elapsed) if elapsed else 0,
        "commands_per_cpu_s": int(commands / cpu) if cpu else 0,
        "left_total": overview.total if overview is not None else None,
    }


def bytes_per_tracked_group(version: int, groups: int = GROUPS) -> dict[str, Any]:
    """Traced bytes per tracked group: one waiting 100-byte message in each of `groups` groups,
    minus the same messages in an ungrouped queue (the group's own overhead)."""
    bench = Bench(version)
    bench.apply(DeclareGroupedQueue("g", QueueConfig(), GroupConfig()))
    bench.declare("u")
    grouped = grouped_commands("g", groups, groups)
    plain = [Enqueue("u", bytes(BODY)) for _ in range(groups)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for command in plain:
        bench.apply(command)
    middle = tracemalloc.get_traced_memory()[0]
    for command in grouped:
        bench.apply(command)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_message = (middle - before) / groups
    per_grouped = (after - middle) / groups
    return {
        "groups": groups,
        "bytes_per_ungrouped_message": round(per_message, 1),
        "bytes_per_grouped_message": round(per_grouped, 1),
        "bytes_per_tracked_group": round(per_grouped - per_message, 1),
    }


def groups_report(version: int, messages: int, repeat: int) -> dict[str, Any]:
    """The issue 9 figures: grouped vs ungrouped mixes of one run, and memory per group."""
    mixed = best_of(repeat, lambda: grouped_mix(version, messages, True))
    plain = best_of(repeat, lambda: grouped_mix(version, messages, False))
    backlog = min(messages, 100_000)
    drained = best_of(repeat, lambda: backlog_drain(version, backlog, True))
    drained_plain = best_of(repeat, lambda: backlog_drain(version, backlog, False))

    def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float:
        return round(a[key] / b[key], 3) if b[key] else 0.0

    return {
        "grouped_mix": mixed,
        "ungrouped_mix": plain,
        "grouped_vs_ungrouped": ratio(mixed, plain, "commands_per_s"),
        "grouped_vs_ungrouped_cpu": ratio(mixed, plain, "commands_per_cpu_s"),
        "target_ratio": 0.7,
        "grouped_backlog": drained,
        "ungrouped_backlog": drained_plain,
        "backlog_grouped_vs_ungrouped": ratio(drained, drained_plain, "commands_per_s"),
        "memory": bytes_per_tracked_group(version),
    }


def memory_per_ready_message(version: int, messages: int) -> dict[str, Any]:
    """Bytes of traced memory per ready 100-byte message (no consumers): the machine's
    structures, plus the body for each message whose body the state holds (all before v4;
    none of v4's, whose bodies stay in the log)."""
    bench = Bench(version)
    bench.declare("q")
    commands = [Enqueue("q", bytes(BODY)) for _ in range(messages)]  # bodies allocated before
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for command in commands:
        bench.apply(command)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    overhead = (after - before) / messages
    # one body object is shared by every command here, so tracemalloc saw none: add one per
    # message the state holds inline, as distinct bodies would cost on a node
    in_log, _ = referenced_bodies(bench.state)
    in_state = messages - in_log
    bodies = sys.getsizeof(BODY) * in_state / messages
    return {
        "messages": messages,
        "body_bytes": len(BODY),
        "bodies_in_state": in_state,
        "bodies_in_log": in_log,
        "overhead_bytes_per_ready_message": round(overhead, 1),  # machine structures only
        "bytes_per_ready_message": round(overhead + bodies, 1),  # plus the bodies it holds
    }


def best_of(repeat: int, figure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a figure `repeat` times and keep the fastest run (noise only ever slows a run down)."""
    runs = [figure() for _ in range(max(1, repeat))]
    best = max(runs, key=lambda run: int(run["commands_per_s"]))
    return {**best, "all_commands_per_s": [run["commands_per_s"] for run in runs]}


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def profile_mix(version: int, messages: int) -> str:
    """The pyinstrument text profile of the steady mix."""
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    steady_mix(version, messages)
    profiler.stop()
    return str(profiler.output_text(unicode=False, color=False, show_all=False))


def main() -> None:
    """Parse flags, run every figure, print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON (default: a short table)")
    parser.add_argument("--messages", type=int, default=200_000, help="messages per mix")
    parser.add_argument("--machine-version", type=int, default=fifo.LATEST_VERSION)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per figure; the best is kept (the host is shared and noisy)",
    )
    parser.add_argument("--profile", action="store_true", help="print a pyinstrument profile")
    parser.add_argument("--no-groups", action="store_true", help="skip the message-group figures")
    parser.add_argument(
        "--output", type=Path, default=None, help="results file (default: in a fresh temp dir)"
    )
    args = parser.parse_args()
    version, messages = args.machine_version, args.messages
    if args.profile:
        print(profile_mix(version, messages))
        return
    report = {
        "benchmark": "fifo",
        "machine_version": version,
        "body_bytes": len(BODY),
        "repeat": args.repeat,
        "steady_mix": best_of(args.repeat, lambda: steady_mix(version, messages)),
        "sac": best_of(args.repeat, lambda: sac_mix(version, messages)),
        "competing_100": best_of(args.repeat, lambda: competing_mix(version, messages)),
        "memory": memory_per_ready_message(version, min(messages, 100_000)),
        "host": machine_info(),
    }
    if version >= 3 and not args.no_groups:
        report["message_groups"] = groups_report(version, messages, args.repeat)
    report["commands_per_s"] = report["steady_mix"]["commands_per_s"]
    out = args.output or Path(tempfile.mkdtemp(prefix="quorumq-bench-")) / "bench_fifo.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name in ("steady_mix", "sac", "competing_100"):
            print(f"{name:<14} {report[name]['commands_per_s']:>10,} commands/s")
        print(f"{'memory':<14} {report['memory']['bytes_per_ready_message']:>10} B/ready message")
        groups = report.get("message_groups")
        if groups:
            print(
                f"{'grouped_mix':<14} {groups['grouped_mix']['commands_per_s']:>10,} commands/s "
                f"({groups['grouped_vs_ungrouped']}x ungrouped "
                f"{groups['ungrouped_mix']['commands_per_s']:,})"
            )
            print(
                f"{'group memory':<14} {groups['memory']['bytes_per_tracked_group']:>10} "
                "B/tracked group"
            )


if __name__ == "__main__":
    main()
