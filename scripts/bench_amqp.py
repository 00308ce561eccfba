"""RabbitMQ's own benchmark client against quorumq's AMQP port, beside the native client.

Starts a fresh local 3-node cluster with `amqp_guest = true` (bench_qq.py connects as guest),
upgraded to the newest machine version, runs `../shared/bench/rabbitmq/bench_qq.py` unchanged
against the leader's AMQP port, then the same workloads with the native threaded `Client` on the
same cluster (confirmed publish with 100 and 1000 in flight, one-at-a-time publish, consume + ack
with prefetch 100), and prints both as JSON with the load average before and after each.

    python scripts/bench_amqp.py --n 5000 --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import fifo
from cluster import config
from cluster.launcher import (
    LocalCluster,
    init_cluster,
    running_nodes,
    start_cluster,
    wait_until,
)

BENCH_QQ = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench" / "rabbitmq"
BODY = os.urandom(50).hex().encode()  # 100 bytes, as bench_qq.py's payload


def loadavg() -> list[str]:
    """The three load averages of /proc/loadavg."""
    return Path("/proc/loadavg").read_text().split()[:3]


def start(data_dir: Path, tls: bool = False, machine_version: int | None = None) -> LocalCluster:
    """A 3-node cluster with guest allowed, on the newest released machine version, or on
    `machine_version` (an unreleased one too: its nodes get `UNRELEASED_FLAG`), peer and client
    traffic over TLS with `tls`; scripts/run_aiopika_suite.py starts its clusters so too."""
    target = machine_version or max(fifo.SUPPORTED_VERSIONS)
    if target in fifo.UNRELEASED_VERSIONS:
        os.environ[config.UNRELEASED_FLAG] = "1"  # the node processes inherit it
    created = init_cluster(data_dir, 3, tls=tls, max_machine_version=machine_version)
    config.write(data_dir, dataclasses.replace(created, amqp_guest=True))
    cluster = start_cluster(data_dir, 3)
    client = cluster.raw_client(cluster.config.nodes[0].id)
    wait_until(lambda: len(client.query("machine")["supported"]) == 3 or None, 15, "hellos")
    if client.query("machine")["effective_version"] != target:  # an unreleased one comes alone
        client.admin("machine_upgrade", to=target)
    wait_until(lambda: client.query("machine")["effective_version"] == target or None, 30, "v")
    return cluster


def pid_files(cluster: LocalCluster, base: Path) -> Path:
    """`base/rabbit{1,2,3}/beam.pid` naming our node processes: bench_qq.py reads the broker's
    CPU time and peak RSS from the pid files under `$RMQ_BASE`, so it measures our nodes (and never
    reads the stale pid files a stopped RabbitMQ left under /tmp/rmq)."""
    pids = running_nodes(cluster.config)
    for index, node in enumerate(cluster.config.nodes, start=1):
        (base / f"rabbit{index}").mkdir(parents=True, exist_ok=True)
        (base / f"rabbit{index}" / "beam.pid").write_text(f"{pids[node.id]}\n")
    return base


def amqp_figures(cluster: LocalCluster, n: int, reps: int, out: Path) -> dict[str, Any]:
    """bench_qq.py's summary against the leader's AMQP port (and our nodes' CPU and peak RSS)."""
    leader = cluster.config.node(cluster.leader())
    other = next(node for node in cluster.config.nodes if node.id != leader.id)
    command = [
        sys.executable, str(BENCH_QQ / "bench_qq.py"), "--port", str(leader.amqp_port),
        "--port-b", str(other.amqp_port), "--n", str(n), "--reps", str(reps),
        "--windows", "100,1000", "--only", "stream,sync,consume", "--json", str(out),
    ]  # fmt: skip
    env = dict(os.environ, RMQ_BASE=str(pid_files(cluster, out.parent / "rmq_base")))
    before = loadavg()
    subprocess.run(command, check=True, capture_output=True, timeout=3600, env=env)
    result = json.loads(out.read_text())
    summary = {
        f"{name}.{key}": round(value["median"], 2)
        for name, run in result["runs"].items()
        for key, value in run["summary"].items()
    }
    peak_rss = {node: round(v["VmHWM"] / 1024, 1) for node, v in result["broker_end"].items()}
    return {"command": " ".join(command[1:]), "loadavg_before": before,
            "loadavg_after": loadavg(), **summary, "peak_rss_mib": peak_rss}  # fmt: skip


def native_figures(cluster: LocalCluster, n: int, reps: int) -> dict[str, Any]:
    """The same workloads with the native threaded client (medians of `reps`)."""
    before = loadavg()
    runs = [native_once(cluster, n) for _ in range(reps)]
    medians = {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}
    return {"loadavg_before": before, "loadavg_after": loadavg(), **medians}


def native_once(cluster: LocalCluster, n: int) -> dict[str, float]:
    """One round of the four workloads on the leader."""
    figures: dict[str, float] = {}
    with cluster.client(cluster.leader(), only=True) as client:
        for window in (100, 1000):
            queue = f"native.{window}.{uuid.uuid4().hex[:6]}"
            client.declare_queue(queue)
            started = time.perf_counter()
            with client.publisher(queue, window=window) as publisher:
                publisher.publish_many(BODY for _ in range(n))
            figures[f"window{window}_msgs_per_s"] = n / (time.perf_counter() - started)
        queue = f"native.sync.{uuid.uuid4().hex[:6]}"
        client.declare_queue(queue)
        latencies = []
        for _ in range(n):
            started = time.perf_counter()
            client.publish(queue, BODY)
            latencies.append(time.perf_counter() - started)
        latencies.sort()
        figures["sync_p50_ms"] = latencies[len(latencies) // 2] * 1e3
        figures["sync_p99_ms"] = latencies[int(len(latencies) * 0.99)] * 1e3
        figures["consume_msgs_per_s"] = native_consume(client, n)
    return figures


def native_consume(client: Any, n: int) -> float:
    """Consume and ack a backlog of `n` with prefetch 100: messages per second."""
    queue = f"native.consume.{uuid.uuid4().hex[:6]}"
    client.declare_queue(queue)
    with client.publisher(queue, window=1000) as publisher:
        publisher.publish_many(BODY for _ in range(n))
    started = time.perf_counter()
    for got, message in enumerate(client.consume(queue, prefetch=100), start=1):
        message.ack()
        if got >= n:
            break
    return n / (time.perf_counter() - started)


def main() -> None:
    """Parse flags, run both benchmarks on one cluster, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="messages per workload")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--amqp-only", action="store_true", help="skip the native client's half")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qq-amqp-bench-") as tmp:
        cluster = start(Path(tmp) / "D")
        try:
            amqp = amqp_figures(cluster, args.n, args.reps, Path(tmp) / "bench_qq.json")
            native = {} if args.amqp_only else native_figures(cluster, args.n, args.reps)
        finally:
            cluster.stop()
    print(json.dumps({"n": args.n, "reps": args.reps, "amqp": amqp, "native": native}, indent=1))


if __name__ == "__main__":
    main()
