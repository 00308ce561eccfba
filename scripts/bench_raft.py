"""Benchmark raw replication through a fresh local 3-node cluster: group-commit throughput.

    python scripts/bench_raft.py --json [--messages 20000] [--fsync batch,always,never]

For each fsync policy: confirmed Enqueue/s with a window of 100 and 1000 pipelined commands, and
one-at-a-time confirmed latency (p50/p99), all through the leader's client port with 100-byte
bodies. Prints JSON and writes bench_raft.json into --out (default: a fresh temp dir).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fifo
from cluster import config, protocol
from cluster.launcher import LocalCluster, start_cluster
from fifo.commands import DeclareQueue, Enqueue

BODY = b"x" * 100


class PipelinedClient:
    """A minimal asyncio protocol client that keeps up to `window` commands in flight."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.next_id = 1

    @classmethod
    async def connect(cls, address: str, key: bytes) -> PipelinedClient:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        challenge = await protocol.read_frame(reader)
        await protocol.write_frame(writer, protocol.hello(key, challenge["nonce"], "bench"))
        welcome = await protocol.read_frame(reader)
        assert welcome["op"] == protocol.WELCOME, welcome
        return cls(reader, writer)

    async def run(self, commands: list[bytes], window: int) -> list[float]:
        """Send every command with at most `window` in flight; returns per-command latencies."""
        sent: dict[int, float] = {}
        latencies: list[float] = []
        slots = asyncio.Semaphore(window)

        async def read_replies() -> None:
            while len(latencies) < len(commands):
                frame = await protocol.read_frame(self.reader)
                if frame["op"] == protocol.EFFECT:
                    continue
                if frame["op"] == protocol.ERROR:
                    raise RuntimeError(f"command failed: {frame}")
                latencies.append(time.perf_counter() - sent.pop(frame["id"]))
                slots.release()

        reader = asyncio.create_task(read_replies())
        for blob in commands:
            await slots.acquire()
            request_id, self.next_id = self.next_id, self.next_id + 1
            sent[request_id] = time.perf_counter()
            self.writer.write(protocol.encode_frame(protocol.command(request_id, blob)))
            if slots.locked():
                await self.writer.drain()
        await self.writer.drain()
        await reader
        return latencies

    async def close(self) -> None:
        self.writer.close()


async def measure(cluster: LocalCluster, messages: int, window: int, queue: str) -> dict[str, Any]:
    leader = cluster.leader()
    client = await PipelinedClient.connect(
        cluster.config.node(leader).client_address, cluster.key
    )
    await client.run([fifo.encode(DeclareQueue(queue))], 1)
    blobs = [fifo.encode(Enqueue(queue, BODY)) for _ in range(messages)]
    started = time.perf_counter()
    latencies = await client.run(blobs, window)
    elapsed = time.perf_counter() - started
    await client.close()
    latencies.sort()
    return {
        "window": window,
        "messages": messages,
        "confirmed_per_s": round(messages / elapsed),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 3),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 3),
        "mean_ms": round(1000 * statistics.fmean(latencies), 3),
    }


def bench_policy(policy: str, messages: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-raft-") as tmp:
        cluster = start_cluster(Path(tmp) / "D", 3, fsync=cast(config.FsyncPolicy, policy))
        try:
            runs = [
                asyncio.run(measure(cluster, messages, 100, "w100")),
                asyncio.run(measure(cluster, messages, 1000, "w1000")),
                asyncio.run(measure(cluster, max(200, messages // 20), 1, "w1")),
            ]
            leader = cluster.leader()
            log_len = cluster.statuses()[leader]["log_len"]  # type: ignore[index]
        finally:
            cluster.stop()
    return {"fsync": policy, "runs": runs, "leader_log_len_after": log_len}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--fsync", default="batch,always,never", help="comma-separated policies")
    parser.add_argument(
        "--out", type=Path, default=None, help="results file (default: in a fresh temp dir)"
    )
    args = parser.parse_args()
    results = {
        "benchmark": "bench_raft",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "body_bytes": len(BODY),
        "policies": [bench_policy(p, args.messages) for p in args.fsync.split(",")],
    }
    out = args.out or Path(tempfile.mkdtemp(prefix="quorumq-bench-")) / "bench_raft.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        policies: list[dict[str, Any]] = results["policies"]  # type: ignore[assignment]
        for policy in policies:
            for run in policy["runs"]:
                print(policy["fsync"], run)
    return 0


if __name__ == "__main__":
    _ = config  # the data dir layout is written by cluster.launcher through cluster.config
    sys.exit(main())
