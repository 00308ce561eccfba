"""Where the CPU goes during confirmed publishing: per-process CPU seconds and msg/s, as JSON.

Starts a fresh local 3-node cluster (fsync `batch`), connects a client to the leader and, for
each shell (threaded `Client`, `AsyncClient`) and each window, publishes --messages 100-byte
bodies with confirms, reading every node's and this process's CPU time (utime + stime from
/proc/PID/stat, every thread) before and after. All four processes share the machine's cores,
so a microsecond of client CPU per message is one the nodes do not get. With --consume N, each
shell also consumes and acks a backlog of N (prefetch 100; the backlog is published unmeasured).
Linux only.

    python scripts/bench_publish_cpu.py --messages 40000 --repeat 3 --consume 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cluster import async_drain, cpu_by_role, drain

from cluster.client import AsyncClient
from cluster.launcher import LocalCluster, local_cluster

BODY = b"x" * 100
Runner = Callable[[LocalCluster, str, str, int, int], int]


def measure(cluster: LocalCluster, leader: str, run: Callable[[], int]) -> dict[str, Any]:
    """Run one publish phase; msg/s and CPU seconds (and us per message) per process."""
    before, started = cpu_by_role(cluster, leader), time.perf_counter()
    confirmed = run()
    seconds = time.perf_counter() - started
    after = cpu_by_role(cluster, leader)
    cpu = {name: round(after[name] - before[name], 2) for name in before}
    return {
        "msg_per_s": round(confirmed / seconds, 1),
        "seconds": round(seconds, 3),
        "cpu_s": cpu,
        "cpu_us_per_msg": {name: round(s * 1e6 / confirmed, 1) for name, s in cpu.items()},
        "cpu_total_s": round(sum(cpu.values()), 2),
    }


def threaded_run(cluster: LocalCluster, leader: str, queue: str, count: int, window: int) -> int:
    """Publish `count` with the threaded client; the confirmed count."""
    with cluster.client(leader) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=window) as publisher:
            publisher.publish_many((BODY for _ in range(count)), timeout_s=120.0)
            publisher.wait_for_confirms(timeout_s=120.0)
        client.purge_queue(queue)
        return publisher.confirmed


def asyncio_run(cluster: LocalCluster, leader: str, queue: str, count: int, window: int) -> int:
    """Publish `count` with the asyncio client; the confirmed count."""
    endpoint = cluster.endpoint(leader)

    async def run() -> int:
        async with AsyncClient([endpoint], cluster.key, prefer_leader=False) as client:
            await client.declare_queue(queue)
            async with client.publisher(queue, window=window) as publisher:
                await publisher.publish_many((BODY for _ in range(count)), timeout_s=120.0)
                await publisher.wait_for_confirms(timeout_s=120.0)
            await client.purge_queue(queue)
            return publisher.confirmed

    return asyncio.run(run())


def threaded_consume(cluster: LocalCluster, leader: str, queue: str, count: int, _: int) -> int:
    """Consume and ack the `count` messages of `queue` with the threaded client."""
    with cluster.client(leader) as client:
        consumer = client.consume(queue, prefetch=100)
        received = drain(consumer, count)
        consumer.cancel()
    return received


def asyncio_consume(cluster: LocalCluster, leader: str, queue: str, count: int, _: int) -> int:
    """Consume and ack the `count` messages of `queue` with the asyncio client."""
    endpoint = cluster.endpoint(leader)

    async def run() -> int:
        async with AsyncClient([endpoint], cluster.key, prefer_leader=False) as client:
            consumer = await client.consume(queue, prefetch=100)
            received = await async_drain(consumer, count)
            await consumer.cancel()
        return received

    return asyncio.run(run())


def backlog(cluster: LocalCluster, leader: str, queue: str, count: int) -> None:
    """Publish `count` messages into `queue` (not measured)."""
    with cluster.client(leader) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=1000) as publisher:
            publisher.publish_many((BODY for _ in range(count)), timeout_s=120.0)


def main() -> None:
    """Parse flags, run the phases, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=40_000, help="Messages per phase.")
    parser.add_argument("--windows", default="100,1000", help="Comma-separated windows.")
    parser.add_argument("--shells", default="threaded,asyncio", help="threaded and/or asyncio.")
    parser.add_argument("--repeat", type=int, default=1, help="Runs of every phase.")
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument(
        "--consume", type=int, default=0, help="Also consume + ack a backlog of this many."
    )
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    shells = args.shells.split(",")
    runners: dict[str, Runner] = {"threaded": threaded_run, "asyncio": asyncio_run}
    consumers: dict[str, Runner] = {"threaded": threaded_consume, "asyncio": asyncio_consume}
    results: dict[str, Any] = {"load_before": os.getloadavg(), "runs": {}}
    with (
        tempfile.TemporaryDirectory(prefix="qq-cpu-") as tmp,
        local_cluster(Path(tmp) / "D", 3, fsync=args.fsync) as cluster,
    ):
        leader = cluster.leader()
        threaded_run(cluster, leader, "warmup", 2000, 1000)
        for run in range(args.repeat):
            for shell in shells:
                for window in windows:
                    name = f"{shell}-w{window}"
                    queue = f"cpu-{name}-{run}"
                    runner = runners[shell]

                    def phase(
                        runner: Runner = runner, queue: str = queue, window: int = window
                    ) -> int:
                        return runner(cluster, leader, queue, args.messages, window)

                    figures = measure(cluster, leader, phase)
                    results["runs"].setdefault(name, []).append(figures)
                    print(name, json.dumps(figures), file=sys.stderr)
                if args.consume:
                    name, queue = f"{shell}-consume", f"cpu-{shell}-consume-{run}"
                    backlog(cluster, leader, queue, args.consume)
                    consume = consumers[shell]

                    def drain(consume: Runner = consume, queue: str = queue) -> int:
                        return consume(cluster, leader, queue, args.consume, 100)

                    figures = measure(cluster, leader, drain)
                    results["runs"].setdefault(name, []).append(figures)
                    print(name, json.dumps(figures), file=sys.stderr)
    results["medians"] = {
        name: {
            "msg_per_s": statistics.median(r["msg_per_s"] for r in runs),
            "cpu_us_per_msg": {
                proc: statistics.median(r["cpu_us_per_msg"][proc] for r in runs)
                for proc in runs[0]["cpu_us_per_msg"]
            },
        }
        for name, runs in results["runs"].items()
    }
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
