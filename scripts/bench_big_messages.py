"""Big messages on a 3-node cluster: how long each node's event loop stalls (issue 31 item 5).

Starts a 3-node cluster in a temp dir. One pinger process per node sends small queries one at a
time and records each round trip; the main process publishes `--count` messages of `--mib` MiB,
confirmed one at a time, then consumes and acks them all. Reports per phase and per node the
longest round trip (the stall), the time taken, and the terms before and after (a term change
means an election: a stalled loop missed heartbeats). The baseline is the longest round trip over
2 s before any big message. Prints JSON and writes it to `--out`.

Example: `python scripts/bench_big_messages.py --count 20 --mib 8`
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster.launcher import LocalCluster, local_cluster
from cluster.rawclient import RawClient

Samples = list[tuple[float, float]]


def ping(address: str, key: bytes, stop: Any, out: Any) -> None:
    """Child process: small queries back to back until `stop` is set; sends (sent_at, rtt_s)
    pairs (CLOCK_MONOTONIC, comparable across processes) through `out`."""
    client = RawClient(address, key, "pinger", timeout_s=60)
    samples: Samples = []
    while not stop.is_set():
        sent = time.monotonic()
        try:
            client.query("queues")
        except Exception:  # a node without a leader answers an error: keep timing
            client.close()
            client = RawClient(address, key, "pinger", timeout_s=60)
        samples.append((sent, time.monotonic() - sent))
        time.sleep(0.005)
    client.close()
    out.send(samples)


def worst_ms(samples: Samples, start: float, end: float) -> float:
    """The longest round trip (ms) that overlapped [start, end]."""
    worst = max((rtt for sent, rtt in samples if sent <= end and sent + rtt >= start), default=0)
    return round(worst * 1000, 1)


def terms(cluster: LocalCluster) -> dict[str, int]:
    """Each node's current term (its status)."""
    found = {}
    for node in cluster.config.node_ids():
        with cluster.client(node, only=True) as client:
            found[node] = int(str(client.status()["term"]))
    return found


def run(cluster: LocalCluster, count: int, body: bytes) -> dict[str, tuple[float, float]]:
    """Publish then drain; the (start, end) of each phase."""
    phases: dict[str, tuple[float, float]] = {}
    with cluster.client(request_timeout_s=120) as client:
        client.declare_queue("big")
        start = time.monotonic()
        for _ in range(count):
            client.publish("big", body)
        phases["publish"] = (start, time.monotonic())
        consumer = client.consume("big", prefetch=1)
        start = time.monotonic()
        for _ in range(count):
            message = consumer.get(timeout_s=120)
            if message is None or len(message.body) != len(body):
                raise SystemExit("a big message did not come back whole")
            message.ack()
        consumer.wait_settled(60)
        phases["drain"] = (start, time.monotonic())
        consumer.cancel()
    return phases


def main() -> None:
    """Parse flags, run, print and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=20, help="Messages to publish (default 20).")
    parser.add_argument("--mib", type=float, default=8.0, help="Body size in MiB (default 8).")
    parser.add_argument("--out", default="bench_big_messages.json", help="Results file.")
    args = parser.parse_args()
    body = os.urandom(int(args.mib * 1024 * 1024))
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-big-") as tmp,
        local_cluster(Path(tmp) / "D", 3) as cluster,
    ):
        cluster.leader()
        stop = multiprocessing.Event()
        pipes, pingers = {}, []
        for node in cluster.config.node_ids():
            receive, send = multiprocessing.Pipe(duplex=False)
            target = (cluster.endpoint(node), cluster.key, stop, send)
            pingers.append(multiprocessing.Process(target=ping, args=target))
            pipes[node] = receive
        for pinger in pingers:
            pinger.start()
        time.sleep(1.0)
        before = terms(cluster)
        phases = {"baseline": (time.monotonic(), time.monotonic() + 2.0)}
        time.sleep(2.0)
        phases.update(run(cluster, args.count, body))
        after = terms(cluster)
        stop.set()
        samples = {node: pipe.recv() for node, pipe in pipes.items()}
        for pinger in pingers:
            pinger.join(10)
    results: dict[str, Any] = {
        "count": args.count,
        "mib": args.mib,
        "load_average": os.getloadavg(),
        "terms_before": before,
        "terms_after": after,
        "elections": max(after.values()) - max(before.values()),
    }
    for phase, (start, end) in phases.items():
        results[phase] = {
            "seconds": round(end - start, 2),
            "stall_ms": {node: worst_ms(s, start, end) for node, s in samples.items()},
        }
    text = json.dumps(results, indent=2)
    Path(args.out).write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
