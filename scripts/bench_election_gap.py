"""How long after an election each node delivers again (issue 24: a node holds deliveries until
its applied state is current, raft/contact.py).

    python scripts/bench_election_gap.py --elections 4

A local 3-node cluster; on every node a consumer of its own queue and a producer publishing to
every queue every `--period-ms`. Each round pauses the leader (SIGSTOP) until another node
leads, resumes it and lets the cluster settle. Per election, from the new leader's
`role_changed` line: the time to the first delivery its own consumer got, and the other
follower's (the paused node is left out). Includes the wait for the first publish after the
election to commit (about one period plus a retry): compare runs, not absolute values.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path

import click

from cluster.client import Client
from cluster.client.consumer import Message
from cluster.launcher import LocalCluster, start_cluster, wait_until

SETTLE_S = 4.0  # after a resume: the old leader catches up, deliveries flow everywhere again


def _utc(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def elections(cluster: LocalCluster, node: str) -> list[float]:
    """When (epoch seconds) `node` became leader, from its node.log."""
    out: list[float] = []
    for line in (cluster.data_dir / node / "node.log").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "role_changed" and event.get("new") == "leader":
            out.append(_utc(str(event["timestamp"])))
    return out


def produce(client: Client, queues: list[str], period_s: float, stop: threading.Event) -> None:
    """Publish one message to every queue each period until `stop` (errors only slow it)."""
    publishers = [client.publisher(queue, window=1000) for queue in queues]
    while not stop.is_set():
        for publisher in publishers:
            with contextlib.suppress(Exception):
                publisher.publish(b"x", timeout_s=0.5)
        stop.wait(period_s)


def first_after(times: list[float], start: float) -> float | None:
    return next((t - start for t in times if t >= start), None)


@click.command()
@click.option("--elections", "rounds", default=4, type=click.IntRange(1, 20))
@click.option("--period-ms", default=20, type=click.IntRange(5, 1000))
def main(rounds: int, period_ms: int) -> None:
    """Pause the leader `rounds` times; print the election-to-first-delivery gaps."""
    with tempfile.TemporaryDirectory(prefix="quorumq-election-gap-") as tmp:
        cluster = start_cluster(Path(tmp) / "D", nodes=3)
        try:
            measure(cluster, rounds, period_ms / 1000)
        finally:
            for node in cluster.config.node_ids():
                with contextlib.suppress(Exception):
                    cluster.kill(node, signal.SIGCONT)
            cluster.stop()


def measure(cluster: LocalCluster, rounds: int, period_s: float) -> None:
    """The rounds and the printed result."""
    nodes = cluster.config.node_ids()
    with cluster.client(cluster.leader()) as admin:
        for node in nodes:
            admin.declare_queue(f"q-{node}")
    got: dict[str, list[float]] = {node: [] for node in nodes}
    stop = threading.Event()
    clients = [cluster.client(n, only=True, silence_timeout_s=60.0) for n in nodes]
    for node, client in zip(nodes, clients, strict=True):
        client.consume(f"q-{node}", prefetch=1000, auto_ack=True,
                       on_message=_recorder(got[node]))  # fmt: skip
        queues = [f"q-{n}" for n in nodes]
        threading.Thread(target=produce, args=(client, queues, period_s, stop), daemon=True).start()
    leader_gaps: list[float] = []
    follower_gaps: list[float] = []
    try:
        for _ in range(rounds):
            old = cluster.leader()
            time.sleep(SETTLE_S)
            cluster.kill(old, signal.SIGSTOP)
            new = wait_until(partial(_other_leader, cluster, old), 30, "a new leader")
            cluster.kill(old, signal.SIGCONT)
            time.sleep(SETTLE_S)
            elected = elections(cluster, new)[-1]
            other = next(n for n in nodes if n not in (old, new))
            for gaps, node in ((leader_gaps, new), (follower_gaps, other)):
                gap = first_after(got[node], elected)
                if gap is not None:
                    gaps.append(gap)
    finally:
        stop.set()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
    for name, gaps in (("new leader", leader_gaps), ("follower", follower_gaps)):
        shown = ", ".join(f"{g * 1000:.0f}" for g in gaps)
        median = statistics.median(gaps) * 1000 if gaps else float("nan")
        print(f"{name}: election to first delivery, ms: median {median:.0f} [{shown}]")


def _recorder(times: list[float]) -> Callable[[Message], None]:
    """An on_message callback noting when each message arrived."""
    return lambda _message: times.append(time.time())


def _other_leader(cluster: LocalCluster, old: str) -> str | None:
    """The node other than `old` that says it leads, if one does."""
    for node in cluster.config.node_ids():
        if node == old:
            continue
        with contextlib.suppress(Exception):
            with cluster.client(node, only=True, request_timeout_s=1.0) as client:
                status = client.status(timeout_s=1.0)
            if status.get("role") == "leader":
                return node
    return None


if __name__ == "__main__":
    main()
