"""Cluster benchmark: confirmed publish throughput and latency, consume + ack, leader-kill recovery.

Runs against a fresh local 3-node cluster (100-byte bodies), prints JSON and writes
`bench_cluster.json` into --out (default: a fresh temp dir, never the checkout). The publish
and consume phases run with the threaded `Client` and
again with `AsyncClient` (under "asyncio"), on the same cluster, one after the other.
Example: `python scripts/bench_cluster.py --json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from cluster.client import AsyncClient, Client, ClusterError
from cluster.launcher import LocalCluster, local_cluster

BODY = b"x" * 100


def publish_rate(client: Client, queue: str, count: int, window: int) -> dict[str, Any]:
    """Confirmed publishes with `window` unconfirmed messages in flight."""
    client.declare_queue(queue)
    started = time.perf_counter()
    with client.publisher(queue, window=window) as publisher:
        publisher.publish_many((BODY for _ in range(count)), timeout_s=120.0)
        publisher.wait_for_confirms(timeout_s=120.0)
    seconds = time.perf_counter() - started
    return {
        "messages": publisher.confirmed,
        "seconds": round(seconds, 3),
        "msg_per_s": round(publisher.confirmed / seconds, 1),
    }


def publish_latency(client: Client, queue: str, count: int) -> dict[str, Any]:
    """One message at a time, each waiting for its confirm."""
    client.declare_queue(queue)
    samples: list[float] = []
    with client.publisher(queue, window=1) as publisher:
        for _ in range(count):
            started = time.perf_counter()
            publisher.publish(BODY)
            publisher.wait_for_confirms(timeout_s=30.0)
            samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "messages": count,
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 3),
        "mean_ms": round(statistics.fmean(samples), 3),
    }


def consume_rate(client: Client, queue: str, backlog: int, prefetch: int) -> dict[str, Any]:
    """Consume and ack a backlog of `backlog` messages with `prefetch`."""
    publish_rate(client, queue, backlog, 1000)
    started = time.perf_counter()
    consumer = client.consume(queue, prefetch=prefetch)
    received = 0
    while received < backlog:
        message = consumer.get(timeout_s=30.0)
        if message is None:
            break
        consumer.ack([message])
        received += 1
    consumer.wait_settled(timeout_s=30.0)
    seconds = time.perf_counter() - started
    consumer.cancel()
    return {
        "messages": received,
        "prefetch": prefetch,
        "seconds": round(seconds, 3),
        "msg_per_s": round(received / seconds, 1),
    }


def leader_kill_recovery(cluster: LocalCluster, queue: str) -> dict[str, Any]:
    """SIGKILL the leader while publishing one at a time; seconds to the next confirm."""
    leader = cluster.leader()
    with cluster.client(leader, reconnect_timeout_s=30.0) as client:
        client.declare_queue(queue)
        confirms: list[float] = []
        stop = threading.Event()

        def produce() -> None:
            with client.publisher(queue, window=1) as publisher:
                while not stop.is_set():
                    publisher.publish(BODY, timeout_s=30.0)
                    publisher.wait_for_confirms(timeout_s=30.0)
                    confirms.append(time.perf_counter())

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(1.0)
        killed_at = time.perf_counter()
        cluster.kill(leader)
        deadline = killed_at + 30.0
        while not any(t > killed_at for t in confirms) and time.perf_counter() < deadline:
            time.sleep(0.001)
        stop.set()
        producer.join(timeout=35.0)
    after = [t for t in confirms if t > killed_at]
    recovery = round(after[0] - killed_at, 3) if after else None
    new_leader = cluster.leader(exclude=leader)
    cluster.restart(leader)
    return {"killed": leader, "new_leader": new_leader, "recovery_s": recovery}


async def async_publish_rate(
    client: AsyncClient, queue: str, count: int, window: int
) -> dict[str, Any]:
    """`publish_rate` with the asyncio client."""
    await client.declare_queue(queue)
    started = time.perf_counter()
    async with client.publisher(queue, window=window) as publisher:
        await publisher.publish_many((BODY for _ in range(count)), timeout_s=120.0)
        await publisher.wait_for_confirms(timeout_s=120.0)
    seconds = time.perf_counter() - started
    return {
        "messages": publisher.confirmed,
        "seconds": round(seconds, 3),
        "msg_per_s": round(publisher.confirmed / seconds, 1),
    }


async def async_publish_latency(client: AsyncClient, queue: str, count: int) -> dict[str, Any]:
    """`publish_latency` with the asyncio client."""
    await client.declare_queue(queue)
    samples: list[float] = []
    async with client.publisher(queue, window=1) as publisher:
        for _ in range(count):
            started = time.perf_counter()
            await publisher.publish(BODY)
            await publisher.wait_for_confirms(timeout_s=30.0)
            samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "messages": count,
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 3),
        "mean_ms": round(statistics.fmean(samples), 3),
    }


async def async_consume_rate(
    client: AsyncClient, queue: str, backlog: int, prefetch: int
) -> dict[str, Any]:
    """`consume_rate` with the asyncio client."""
    await async_publish_rate(client, queue, backlog, 1000)
    started = time.perf_counter()
    consumer = await client.consume(queue, prefetch=prefetch)
    received = 0
    while received < backlog:
        message = await consumer.get(timeout_s=30.0)
        if message is None:
            break
        await consumer.ack([message])
        received += 1
    await consumer.wait_settled(timeout_s=30.0)
    seconds = time.perf_counter() - started
    await consumer.cancel()
    return {
        "messages": received,
        "prefetch": prefetch,
        "seconds": round(seconds, 3),
        "msg_per_s": round(received / seconds, 1),
    }


def asyncio_phases(cluster: LocalCluster, leader: str, args: argparse.Namespace) -> dict[str, Any]:
    """The publish and consume phases again, with one AsyncClient on the leader."""
    first = cluster.endpoint(leader)
    endpoints = [first] + [e for e in cluster.config.endpoints().values() if e != first]

    async def run_all() -> dict[str, Any]:
        results: dict[str, Any] = {}
        async with AsyncClient(endpoints, cluster.key, prefer_leader=False) as client:
            phases: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
                "publish_window_100": lambda: async_publish_rate(
                    client, "aio-w100", args.messages, 100
                ),
                "publish_window_1000": lambda: async_publish_rate(
                    client, "aio-w1000", args.messages * 2, 1000
                ),
                "publish_latency": lambda: async_publish_latency(
                    client, "aio-latency", args.latency_messages
                ),
                "consume_ack_prefetch_100": lambda: async_consume_rate(
                    client, "aio-consume", args.backlog, 100
                ),
            }
            for name, phase in phases.items():
                try:
                    results[name] = await phase()
                except ClusterError as err:
                    results[name] = {"error": f"{type(err).__name__}: {err}"}
            # leave the state as large as the threaded phases alone would: node status (and so
            # the leader-kill phase's leader detection) hashes the whole state
            for queue in ("aio-w100", "aio-w1000", "aio-latency", "aio-consume"):
                with contextlib.suppress(ClusterError):
                    await client.purge_queue(queue)
        return results

    return asyncio.run(run_all())


def interleaved_window_1000(
    cluster: LocalCluster, client: Client, leader: str, count: int, repeat: int
) -> dict[str, Any]:
    """Threaded and asyncio publishes at window 1000, alternately (who goes first alternates
    too), so a noisy machine weighs on both alike; each queue is purged after its run."""
    first = cluster.endpoint(leader)
    endpoints = [first] + [e for e in cluster.config.endpoints().values() if e != first]

    async def in_asyncio(queue: str) -> dict[str, Any]:
        async with AsyncClient(endpoints, cluster.key, prefer_leader=False) as aclient:
            figures = await async_publish_rate(aclient, queue, count, 1000)
            await aclient.purge_queue(queue)
            return figures

    def threaded(queue: str) -> dict[str, Any]:
        figures = publish_rate(client, queue, count, 1000)
        client.purge_queue(queue)
        return figures

    runs: dict[str, list[float]] = {"threaded": [], "asyncio": []}
    for run in range(repeat):
        order = ["threaded", "asyncio"] if run % 2 == 0 else ["asyncio", "threaded"]
        for shell in order:
            queue = f"cmp-{shell}-{run}"
            figures = threaded(queue) if shell == "threaded" else asyncio.run(in_asyncio(queue))
            runs[shell].append(figures["msg_per_s"])
    medians = {shell: statistics.median(rates) for shell, rates in runs.items()}
    return {
        "messages_per_run": count,
        "threaded_msg_per_s": runs["threaded"],
        "asyncio_msg_per_s": runs["asyncio"],
        "threaded_median": medians["threaded"],
        "asyncio_median": medians["asyncio"],
        "asyncio_over_threaded": round(medians["asyncio"] / medians["threaded"], 3),
    }


def _ratio(results: dict[str, Any], phase: str) -> float | None:
    """asyncio msg/s over threaded msg/s for one phase (None if either failed)."""
    threaded = results.get(phase, {}).get("msg_per_s")
    in_asyncio = results.get("asyncio", {}).get(phase, {}).get("msg_per_s")
    if not threaded or not in_asyncio:
        return None
    return round(float(in_asyncio) / float(threaded), 3)


def _guarded(phase: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one phase; a failure is reported in the results instead of ending the run."""
    try:
        return phase()
    except ClusterError as err:
        return {"error": f"{type(err).__name__}: {err}"}


def peak_rss_mib(cluster: LocalCluster) -> dict[str, float | None]:
    """Each node's peak resident set (VmHWM, Linux) so far, in MiB; None where unreadable."""
    peaks: dict[str, float | None] = {}
    for node_id, proc in sorted(cluster.procs.items()):
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            peaks[node_id] = None
            continue
        kib = next(
            (line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), None
        )
        peaks[node_id] = round(int(kib) / 1024, 1) if kib is not None else None
    return peaks


def client_reads(client: Client) -> dict[str, int | None]:
    """Socket reads made by calling threads and by the reader thread (None: a client without
    these counters, such as one from before callers read their own answers)."""
    return {
        "by_callers": getattr(client, "reads_by_callers", None),
        "by_reader": getattr(client, "reads_by_reader", None),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start a fresh cluster, run every phase, stop the cluster."""
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-") as tmp,
        local_cluster(Path(tmp) / "D", 3, fsync=args.fsync) as cluster,
    ):
        leader = cluster.leader()
        results: dict[str, Any] = {}
        with cluster.client(leader) as client:
            phases: dict[str, Callable[[], dict[str, Any]]] = {
                "publish_window_100": lambda: publish_rate(client, "w100", args.messages, 100),
                "publish_window_1000": lambda: publish_rate(
                    client, "w1000", args.messages * 2, 1000
                ),
                "publish_latency": lambda: publish_latency(
                    client, "latency", args.latency_messages
                ),
                "consume_ack_prefetch_100": lambda: consume_rate(
                    client, "consume", args.backlog, 100
                ),
            }
            for name, phase in phases.items():
                results[name] = _guarded(phase)
            results["threaded_client_reads"] = client_reads(client)
        if args.threaded_only:
            results["config"] = {"nodes": 3, "fsync": args.fsync, "threaded_only": True}
            return results
        results["asyncio"] = _guarded(lambda: asyncio_phases(cluster, leader, args))
        results["asyncio_over_threaded"] = {
            phase: _ratio(results, phase)
            for phase in ("publish_window_100", "publish_window_1000", "consume_ack_prefetch_100")
        }
        # before the kill: the killed node's peak goes with its process
        results["peak_rss_mib"] = peak_rss_mib(cluster)
        results["leader_kill"] = _guarded(lambda: leader_kill_recovery(cluster, "kill"))

        def interleaved() -> dict[str, Any]:
            # last, so that its 2 x repeat runs do not grow the log the phases above work on
            current = cluster.leader()
            with cluster.client(current) as client:
                return interleaved_window_1000(
                    cluster, client, current, args.messages * 2, args.repeat
                )

        results["publish_window_1000_interleaved"] = _guarded(interleaved)
    results["config"] = {
        "nodes": 3,
        "body_bytes": len(BODY),
        "fsync": args.fsync,
        "client_on": "leader",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    results["targets"] = {
        "publish_window_100_msg_per_s": 9500,
        "publish_window_1000_msg_per_s": 26000,
        "publish_p50_ms": 0.96,
        "consume_msg_per_s": 15000,
        "leader_kill_recovery_s": 2.0,
    }
    return results


def main() -> None:
    """Parse flags, run, print and save the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="Print JSON only.")
    parser.add_argument("--messages", type=int, default=20_000, help="Messages at window 100.")
    parser.add_argument("--latency-messages", type=int, default=1000)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument(
        "--repeat", type=int, default=5, help="Alternating threaded/asyncio window-1000 runs."
    )
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument(
        "--threaded-only",
        action="store_true",
        help="Only the threaded client's publish, latency and consume phases (a quick A/B run).",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results file (default: in a fresh temp dir)"
    )
    args = parser.parse_args()
    # client logs (reconnects during the leader kill) go to stderr, never into the JSON
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    results = run(args)
    out = args.out or Path(tempfile.mkdtemp(prefix="quorumq-bench-")) / "bench_cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, value in results.items():
            print(f"{name}: {value}")


if __name__ == "__main__":
    main()
