"""Work pool benchmark: the ordered pool against an unordered pool of the same size, one run.

10,000 items over 1,000 keys (seeded random keys), 16 workers, a handler that sleeps 1 ms:
wall time of the ordered pool (`OrderedWorkPool`, per-key order) and of an unordered pool
(`concurrent.futures.ThreadPoolExecutor`, same thread count), alternated `--repeat` times; the
headline is the ratio of the medians (target: ordered within 1.1x of unordered). "unkeyed" is
the same pool with one key per item, which isolates what the order itself costs. The same for
asyncio (`AsyncOrderedWorkPool` against 16 tasks on one `asyncio.Queue`). With `--cluster`, also
through a real local 3-node cluster: `consumer.process` keyed by the message's key against
`consumer.process` with a key unique per message (no order), same workers and prefetch.
Prints JSON and writes `results/bench_workpool.json`.
Example: `python scripts/bench_workpool.py --json --cluster`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import structlog

from cluster.client import AsyncOrderedWorkPool, Client, Message, OrderedWorkPool

Item = tuple[int, int]  # (key, number)
TARGET_RATIO = 1.1


def make_items(count: int, keys: int, seed: int) -> list[Item]:
    rng = random.Random(seed)
    return [(rng.randrange(keys), number) for number in range(count)]


def by_key(item: Item) -> int:
    return item[0]


# --- threads -----------------------------------------------------------------------------------


def by_number(item: Item) -> int:
    return item[1]


def ordered_threads(
    items: list[Item], workers: int, sleep_s: float, key: Callable[[Item], int] = by_key
) -> float:
    """Submit everything to the ordered pool and wait until every item ran."""

    def handle(item: Item) -> None:
        time.sleep(sleep_s)

    started = time.perf_counter()
    with OrderedWorkPool(handle, workers=workers, key=key) as pool:
        for item in items:
            pool.submit(item)
    seconds = time.perf_counter() - started
    assert pool.completed == len(items)
    return seconds


def unordered_threads(items: list[Item], workers: int, sleep_s: float) -> float:
    """The same with a plain thread pool (no order between items)."""

    def handle(item: Item) -> None:
        time.sleep(sleep_s)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as executor:
        futures = [executor.submit(handle, item) for item in items]
        wait(futures)
    return time.perf_counter() - started


# --- asyncio -----------------------------------------------------------------------------------


async def ordered_tasks(
    items: list[Item], workers: int, sleep_s: float, key: Callable[[Item], int] = by_key
) -> float:
    async def handle(item: Item) -> None:
        await asyncio.sleep(sleep_s)

    started = time.perf_counter()
    async with AsyncOrderedWorkPool(handle, workers=workers, key=key) as pool:
        for item in items:
            await pool.submit(item)
    seconds = time.perf_counter() - started
    assert pool.completed == len(items)
    return seconds


async def unordered_tasks(items: list[Item], workers: int, sleep_s: float) -> float:
    queue: asyncio.Queue[Item | None] = asyncio.Queue()

    async def handle(item: Item) -> None:
        await asyncio.sleep(sleep_s)

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            await handle(item)

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
    for item in items:
        queue.put_nowait(item)
    for _ in tasks:
        queue.put_nowait(None)
    await asyncio.gather(*tasks)
    return time.perf_counter() - started


# --- comparing ---------------------------------------------------------------------------------


def compare(runs: dict[str, Callable[[], float]], repeat: int) -> dict[str, Any]:
    """Alternate the variants `repeat` times (after one warm-up each): their times, medians,
    and the ratio of the ordered pool's median to each other's."""
    for run_once in runs.values():
        run_once()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run_once in runs.items():
            times[name].append(run_once())
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    ratio = medians["ordered"] / medians["unordered"]
    return {
        **{f"{name}_s": [round(s, 4) for s in seconds] for name, seconds in times.items()},
        **{f"{name}_median_s": round(median, 4) for name, median in medians.items()},
        "ordered_over_unordered": round(ratio, 3),
        "ordered_over_unkeyed": round(medians["ordered"] / medians["unkeyed"], 3),
        "per_round_ratios": [
            round(o / u, 3) for o, u in zip(times["ordered"], times["unordered"], strict=True)
        ],
        "within_target": ratio <= TARGET_RATIO,
    }


# --- through a real cluster --------------------------------------------------------------------


def cluster_compare(args: argparse.Namespace, items: list[Item]) -> dict[str, Any]:
    """consume + process on a local 3-node cluster: keyed (ordered) vs one key per message."""
    from cluster.launcher import local_cluster  # only this figure needs node processes

    def key_of(message: Message) -> bytes:
        return message.body.split(b":")[0]

    def unique(message: Message) -> tuple[bytes, int]:
        return message.body, message.msg_id

    times: dict[str, list[float]] = {"ordered": [], "unordered": []}
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-workpool-") as tmp,
        local_cluster(Path(tmp) / "D", 3) as cluster,
        cluster.client() as client,
    ):
        for round_number in range(args.cluster_repeat):
            for name, key in (("ordered", key_of), ("unordered", unique)):
                queue = f"bench-{name}-{round_number}"
                client.declare_queue(queue)
                with client.publisher(queue, window=500) as publisher:
                    publisher.publish_many(b"%d:%d" % item for item in items)
                    publisher.wait_for_confirms(120)
                times[name].append(process_all(client, queue, key, args, len(items)))
    ordered = statistics.median(times["ordered"])
    unordered = statistics.median(times["unordered"])
    results: dict[str, Any] = {
        "ordered_s": [round(s, 3) for s in times["ordered"]],
        "unordered_s": [round(s, 3) for s in times["unordered"]],
        "ordered_over_unordered": round(ordered / unordered, 3),
        "prefetch": args.prefetch,
        "msg_per_s_ordered": round(len(items) / ordered, 1),
    }
    return results


def process_all(
    client: Client, queue: str, key: Callable[[Message], Any], args: argparse.Namespace, count: int
) -> float:
    """Seconds from attaching until every message was handled and acked."""
    started = time.perf_counter()
    consumer = client.consume(queue, prefetch=args.prefetch)
    processing = consumer.process(
        lambda message: time.sleep(args.sleep_ms / 1000), workers=args.workers, key=key
    )
    deadline = time.monotonic() + 300
    while processing.processed < count and time.monotonic() < deadline:
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    if not processing.stop(drain=True, timeout_s=60) or processing.processed != count:
        raise RuntimeError(f"{queue}: processed {processing.processed} of {count}")
    return seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    items = make_items(args.messages, args.keys, args.seed)
    sleep_s = args.sleep_ms / 1000
    results: dict[str, Any] = {
        "threads": compare(
            {
                "ordered": lambda: ordered_threads(items, args.workers, sleep_s),
                "unordered": lambda: unordered_threads(items, args.workers, sleep_s),
                "unkeyed": lambda: ordered_threads(items, args.workers, sleep_s, by_number),
            },
            args.repeat,
        ),
        "asyncio": compare(
            {
                "ordered": lambda: asyncio.run(ordered_tasks(items, args.workers, sleep_s)),
                "unordered": lambda: asyncio.run(unordered_tasks(items, args.workers, sleep_s)),
                "unkeyed": lambda: asyncio.run(
                    ordered_tasks(items, args.workers, sleep_s, by_number)
                ),
            },
            args.repeat,
        ),
    }
    if args.cluster:
        results["cluster"] = cluster_compare(args, items)
    results["config"] = {
        "messages": args.messages,
        "keys": args.keys,
        "workers": args.workers,
        "sleep_ms": args.sleep_ms,
        "repeat": args.repeat,
        "ideal_s": round(args.messages * sleep_s / args.workers, 4),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(load, 2) for load in os.getloadavg()],
    }
    results["target"] = {"ordered_over_unordered_max": TARGET_RATIO}
    return results


def main() -> None:
    """Parse flags, run, print and save the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="Print JSON only.")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--sleep-ms", type=float, default=1.0, help="Handler time per item.")
    parser.add_argument("--repeat", type=int, default=5, help="Alternating rounds per pair.")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--cluster", action="store_true", help="Also through a real cluster.")
    parser.add_argument("--cluster-repeat", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=200, help="Cluster figure's prefetch.")
    parser.add_argument("--out", type=Path, default=Path("results/bench_workpool.json"))
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, value in results.items():
            print(f"{name}: {value}")


if __name__ == "__main__":
    main()
