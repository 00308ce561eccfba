"""Cluster benchmark: confirmed publish throughput and latency, consume + ack, leader-kill recovery.

Runs against a fresh local 3-node cluster (100-byte bodies), `--runs N` times (a fresh cluster
each time; figures are the medians over the runs), prints JSON and writes `bench_cluster.json`
into --out (default: a fresh temp dir, never the checkout). The publish and consume phases run
with the threaded `Client` and again with `AsyncClient` (under "asyncio"), on the same cluster.

Targets are ratios to RabbitMQ quorum queues measured on the same machine in the same hour (issue
14): give `--peer FILE`, the JSON written by `../shared/bench/rabbitmq/bench_qq.py --json FILE`,
and the "targets" block shows each figure, RabbitMQ's, the ratio and whether the target is met.
Example (RabbitMQ first, then stopped, then us with nothing else running; in
../shared/bench/rabbitmq, start_cluster.sh and stop_cluster.sh around the first, one command):
  /tmp/rmq-venv/bin/python bench_qq.py --n 20000 --reps 3 --windows 100,1000
      --only stream,sync,consume --port-b 5673 --json /tmp/rmq.json
  python scripts/bench_cluster.py --runs 3 --peer /tmp/rmq.json
Without --peer the figures are printed and the ratio targets say they need it.

Peak RSS (each node's VmHWM) is taken for the target after the threaded phases, which are the
workload bench_qq.py runs on RabbitMQ; `peak_rss_mib_all_phases` is the same after the asyncio
phases too (more queues and messages than RabbitMQ is given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import operator
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from cluster.client import AsyncClient, AsyncConsumer, Client, ClusterError, Consumer
from cluster.launcher import LocalCluster, local_cluster

BODY = b"x" * 100
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(ordered: list[float], pct: float) -> float:
    """The `pct` percentile of sorted samples, interpolated as bench_qq.py does (so the ratios
    to RabbitMQ compare like with like)."""
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def publish_rate(
    client: Client, queue: str, count: int, window: int, keep: bool = False
) -> dict[str, Any]:
    """Confirmed publishes with `window` unconfirmed messages in flight; the queue is deleted
    after (unless `keep`), as bench_qq.py does: the next phase runs without its messages."""
    client.declare_queue(queue)
    started = time.perf_counter()
    with client.publisher(queue, window=window) as publisher:
        publisher.publish_many((BODY for _ in range(count)), timeout_s=120.0)
        publisher.wait_for_confirms(timeout_s=120.0)
    seconds = time.perf_counter() - started
    if not keep:
        client.delete_queue(queue)
    return {
        "messages": publisher.confirmed,
        "seconds": round(seconds, 3),
        "msg_per_s": round(publisher.confirmed / seconds, 1),
    }


def latency_summary(samples: list[float]) -> dict[str, Any]:
    """Count, p50, p99 and mean of latency samples in milliseconds."""
    ordered = sorted(samples)
    return {
        "messages": len(ordered),
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(percentile(ordered, 99), 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
    }


def cpu_seconds(pid: int | str) -> float:
    """utime + stime of a process (all its threads), in seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_by_role(cluster: LocalCluster, leader: str) -> dict[str, float]:
    """CPU seconds so far of the client (this process) and of each node, named by role."""
    out = {"client": cpu_seconds("self")}
    for node_id, proc in sorted(cluster.procs.items()):
        role = "leader" if node_id == leader else f"follower-{node_id}"
        out[role] = cpu_seconds(proc.pid)
    return out


def publish_latency(
    client: Client, queue: str, count: int, cpu: Callable[[], dict[str, float]] | None = None
) -> dict[str, Any]:
    """One message at a time, each waiting for its confirm; with `cpu` (CPU seconds by process,
    `cpu_by_role`) also the CPU microseconds each process spent per publish, and the three
    nodes' sum (RabbitMQ's: bench_qq.py's `broker_cpu_s` over its one-at-a-time publishes)."""
    client.declare_queue(queue)
    samples: list[float] = []
    before = cpu() if cpu is not None else {}
    with client.publisher(queue, window=1) as publisher:
        for _ in range(count):
            started = time.perf_counter()
            publisher.publish(BODY)
            publisher.wait_for_confirms(timeout_s=30.0)
            samples.append((time.perf_counter() - started) * 1000)
    after = cpu() if cpu is not None else {}
    client.delete_queue(queue)  # (as bench_qq.py)
    result = latency_summary(samples)
    if cpu is not None:
        per = {role: (after[role] - before[role]) * 1e6 / count for role in before}
        result["cpu_us_per_publish"] = {role: round(us) for role, us in per.items()}
        result["cpu_us_per_publish_nodes"] = round(
            sum(us for role, us in per.items() if role != "client")
        )
    return result


def drain(consumer: Consumer, count: int) -> int:
    """Take up to `count` messages from `consumer`, acking each, until none comes for 30 s;
    returns how many came, once every ack is settled."""
    received = 0
    while received < count:
        message = consumer.get(timeout_s=30.0)
        if message is None:
            break
        consumer.ack([message])
        received += 1
    consumer.wait_settled(timeout_s=30.0)
    return received


async def async_drain(consumer: AsyncConsumer, count: int) -> int:
    """`drain` with the asyncio client."""
    received = 0
    while received < count:
        message = await consumer.get(timeout_s=30.0)
        if message is None:
            break
        await consumer.ack([message])
        received += 1
    await consumer.wait_settled(timeout_s=30.0)
    return received


def consume_rate(client: Client, queue: str, backlog: int, prefetch: int) -> dict[str, Any]:
    """Consume and ack a backlog of `backlog` messages with `prefetch` (then delete the queue)."""
    publish_rate(client, queue, backlog, 1000, keep=True)
    started = time.perf_counter()
    consumer = client.consume(queue, prefetch=prefetch)
    received = drain(consumer, backlog)
    seconds = time.perf_counter() - started
    consumer.cancel()
    client.delete_queue(queue)
    return {
        "messages": received,
        "prefetch": prefetch,
        "seconds": round(seconds, 3),
        "msg_per_s": round(received / seconds, 1),
    }


def recovery_after_kill(
    samples: list[tuple[float, float]], killed_at: float, dead_at: float
) -> dict[str, Any]:
    """Kill -> first confirmed publish, from (publish started, confirm received) pairs.

    Only a publish started after the old leader was gone (`dead_at`: its process reaped) counts:
    a confirm received after `killed_at` may still be the old leader's, sent before SIGKILL took
    effect or read late from the socket buffer (that is how a run once printed 0.0 s). The
    publish in flight at the kill, if any, is reported apart."""
    fresh = [confirmed for sent, confirmed in samples if sent >= dead_at]
    straddling = [confirmed for sent, confirmed in samples if sent < dead_at < confirmed]
    return {
        "recovery_s": round(min(fresh) - killed_at, 3) if fresh else None,
        "kill_to_dead_s": round(dead_at - killed_at, 4),
        "confirms_after_kill_of_earlier_publishes": sum(
            1 for sent, confirmed in samples if sent < dead_at and confirmed > killed_at
        ),
        "in_flight_confirmed_after_s": (
            round(max(straddling) - killed_at, 3) if straddling else None
        ),
    }


def leader_kill_recovery(cluster: LocalCluster, queue: str) -> dict[str, Any]:
    """SIGKILL the leader while publishing one at a time; seconds from the kill to the confirm
    of the first publish made after the leader's process was gone (`recovery_after_kill`)."""
    leader = cluster.leader()
    process = cluster.procs[leader]
    with cluster.client(leader, reconnect_timeout_s=30.0) as client:
        client.declare_queue(queue)
        samples: list[tuple[float, float]] = []  # (publish started, confirm received)
        stop = threading.Event()

        def produce() -> None:
            with client.publisher(queue, window=1) as publisher:
                while not stop.is_set():
                    sent = time.perf_counter()
                    publisher.publish(BODY, timeout_s=30.0)
                    publisher.wait_for_confirms(timeout_s=30.0)
                    samples.append((sent, time.perf_counter()))

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(1.0)
        killed_at = time.perf_counter()
        process.kill()
        process.wait(timeout=10.0)  # reaped: from here on it cannot confirm anything
        dead_at = time.perf_counter()
        cluster.kill(leader)  # forgets the handle (already dead: sends nothing)
        deadline = killed_at + 30.0
        while not any(sent >= dead_at for sent, _ in samples) and time.perf_counter() < deadline:
            time.sleep(0.001)
        stop.set()
        producer.join(timeout=35.0)
    new_leader = cluster.leader(exclude=leader)
    cluster.restart(leader)
    return {
        "killed": leader,
        "new_leader": new_leader,
        **recovery_after_kill(list(samples), killed_at, dead_at),
    }


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
    return latency_summary(samples)


async def async_consume_rate(
    client: AsyncClient, queue: str, backlog: int, prefetch: int
) -> dict[str, Any]:
    """`consume_rate` with the asyncio client."""
    await async_publish_rate(client, queue, backlog, 1000)
    started = time.perf_counter()
    consumer = await client.consume(queue, prefetch=prefetch)
    received = await async_drain(consumer, backlog)
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
        async with AsyncClient(
            endpoints, cluster.key, prefer_leader=False, tls=cluster.tls
        ) as client:
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
        async with AsyncClient(
            endpoints, cluster.key, prefer_leader=False, tls=cluster.tls
        ) as aclient:
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


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """Start a fresh cluster, run every phase, stop the cluster."""
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-") as tmp,
        local_cluster(Path(tmp) / "D", 3, fsync=args.fsync, tls=args.tls) as cluster,
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
                    client, "latency", args.latency_messages, lambda: cpu_by_role(cluster, leader)
                ),
                "consume_ack_prefetch_100": lambda: consume_rate(
                    client, "consume", args.backlog, 100
                ),
            }
            for name, phase in phases.items():
                results[name] = _guarded(phase)
            results["threaded_client_reads"] = client_reads(client)
        # the target's figure: after the phases bench_qq.py runs on RabbitMQ too (publish at
        # windows 100 and 1000, one at a time, consume), not after the asyncio ones below
        results["peak_rss_mib"] = peak_rss_mib(cluster)
        if args.threaded_only:
            results["loadavg"] = {"before": load_before, "after": os.getloadavg()}
            return results
        results["asyncio"] = _guarded(lambda: asyncio_phases(cluster, leader, args))
        results["asyncio_over_threaded"] = {
            phase: _ratio(results, phase)
            for phase in ("publish_window_100", "publish_window_1000", "consume_ack_prefetch_100")
        }
        # and after them too, for information (before the kill: the killed node's peak goes
        # with its process)
        results["peak_rss_mib_all_phases"] = peak_rss_mib(cluster)
        results["leader_kill"] = _guarded(lambda: leader_kill_recovery(cluster, "kill"))

        def interleaved() -> dict[str, Any]:
            # last, so that its 2 x repeat runs do not grow the log the phases above work on
            current = cluster.leader()
            with cluster.client(current) as client:
                return interleaved_window_1000(
                    cluster, client, current, args.messages * 2, args.repeat
                )

        if args.repeat > 0:
            results["publish_window_1000_interleaved"] = _guarded(interleaved)
    results["loadavg"] = {"before": load_before, "after": os.getloadavg()}
    return results


# --- figures and targets (issue 14: ratios to RabbitMQ measured in the same hour) ------------


@dataclass(frozen=True, slots=True)
class Target:
    """One benchmark target: `figure` compared (`<`, `<=` or `>=`) with `factor` x RabbitMQ's
    figure, or with `factor` itself when `absolute`."""

    figure: str
    label: str
    unit: str
    compare: str  # "<", "<=" or ">="
    factor: float
    absolute: bool = False

    def goal(self) -> str:
        """The target as text, e.g. '<= 0.7x RabbitMQ' or '<= 1.2 s'."""
        if self.absolute:
            return f"{self.compare} {self.factor:g} {self.unit}"
        return f"{self.compare} {self.factor:g}x RabbitMQ"


TARGETS: tuple[Target, ...] = (
    Target("publish_p50_ms", "one-at-a-time confirmed publish p50", "ms", "<", 1.0),
    Target("publish_p99_ms", "one-at-a-time confirmed publish p99", "ms", "<=", 1.0),
    Target("publish_cpu_us", "CPU per one-at-a-time publish, 3 nodes", "us", "<=", 1.0),
    Target("publish_window_100_msg_per_s", "confirmed publish, window 100", "msg/s", ">=", 2.0),
    Target("publish_window_1000_msg_per_s", "confirmed publish, window 1000", "msg/s", ">=", 2.0),
    Target("consume_ack_msg_per_s", "consume + ack, prefetch 100", "msg/s", ">=", 2.0),
    Target("peak_rss_mib", "peak RSS per node (the largest node)", "MiB", "<=", 0.3),
    Target(
        "leader_kill_recovery_s", "leader kill -> first confirmed publish", "s", "<=", 1.2, True
    ),
)

Figures = dict[str, float | None]


def _number(value: Any) -> float | None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if is_number else None


def our_figures(results: dict[str, Any]) -> Figures:
    """The figures the targets compare, from one run's results (None where a phase failed)."""

    def get(phase: str, key: str) -> float | None:
        section = results.get(phase)
        return _number(section.get(key)) if isinstance(section, dict) else None

    peaks = [_number(v) for v in (results.get("peak_rss_mib") or {}).values()]
    known_peaks = [peak for peak in peaks if peak is not None]
    return {
        "publish_p50_ms": get("publish_latency", "p50_ms"),
        "publish_p99_ms": get("publish_latency", "p99_ms"),
        "publish_cpu_us": get("publish_latency", "cpu_us_per_publish_nodes"),
        "publish_window_100_msg_per_s": get("publish_window_100", "msg_per_s"),
        "publish_window_1000_msg_per_s": get("publish_window_1000", "msg_per_s"),
        "consume_ack_msg_per_s": get("consume_ack_prefetch_100", "msg_per_s"),
        "peak_rss_mib": max(known_peaks) if known_peaks else None,
        "leader_kill_recovery_s": get("leader_kill", "recovery_s"),
    }


class PeerFileError(ValueError):
    """Raised when a --peer file is not a bench_qq.py JSON result."""


# (our figure, bench_qq.py run name, key in its summary): each summary value is a median over
# the peer's repetitions
PEER_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("publish_p50_ms", "sync_publish", "p50_ms"),
    ("publish_p99_ms", "sync_publish", "p99_ms"),
    ("publish_window_100_msg_per_s", "stream_publish_window100", "msgs_per_s"),
    ("publish_window_1000_msg_per_s", "stream_publish_window1000", "msgs_per_s"),
    ("consume_ack_msg_per_s", "consume_prefetch100", "msgs_per_s"),
)


def peer_figures(peer: dict[str, Any]) -> Figures:
    """RabbitMQ's figures from a `bench_qq.py --json` result: medians over its repetitions,
    and the largest node's peak RSS (VmHWM at the end, kB) in MiB; None for what it did not
    measure. PeerFileError if it holds none of them."""
    runs = peer.get("runs")
    if not isinstance(runs, dict):
        raise PeerFileError("no 'runs' object: not the JSON of bench_qq.py --json")
    figures: Figures = {}
    for figure, run_name, key in PEER_FIGURES:
        figures[figure] = _number(_dig(runs, run_name, "summary", key, "median"))
    brokers = peer.get("broker_end")
    peaks = [
        _number(stats.get("VmHWM"))
        for stats in (brokers.values() if isinstance(brokers, dict) else [])
        if isinstance(stats, dict)
    ]
    known = [peak for peak in peaks if peak is not None]
    figures["peak_rss_mib"] = round(max(known) / 1024, 1) if known else None
    figures["publish_cpu_us"] = _peer_cpu_per_publish(runs.get("sync_publish"))
    figures["leader_kill_recovery_s"] = None  # bench_qq.py does not measure it
    if all(value is None for value in figures.values()):
        raise PeerFileError("it holds none of the figures the targets need")
    return figures


def _peer_cpu_per_publish(sync: Any) -> float | None:
    """RabbitMQ's CPU microseconds per one-at-a-time publish, its three nodes summed: the
    median over bench_qq.py's repetitions of sum(broker_cpu_s) / n (None if not recorded)."""
    reps = sync.get("reps") if isinstance(sync, dict) else None
    per_rep = []
    for rep in reps if isinstance(reps, list) else []:
        cpu, count = _dig(rep, "broker_cpu_s"), _number(_dig(rep, "n"))
        seconds = [_number(v) for v in cpu.values()] if isinstance(cpu, dict) else []
        if count and seconds and None not in seconds:
            per_rep.append(sum(v for v in seconds if v is not None) * 1e6 / count)
    return round(statistics.median(per_rep), 1) if per_rep else None


def _dig(value: Any, *keys: str) -> Any:
    """value[k1][k2]...; None as soon as one level is not a dict or lacks the key."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def load_peer(path: Path) -> dict[str, Any]:
    """Read a --peer file; PeerFileError with the reason when it cannot be used."""
    try:
        peer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PeerFileError(f"cannot read {path}: {err}") from err
    if not isinstance(peer, dict):
        raise PeerFileError(f"{path}: a JSON object expected")
    peer_figures(peer)  # raises if unusable
    return peer


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">=": operator.ge,
}


def evaluate_targets(ours: Figures, peer: Figures | None) -> list[dict[str, Any]]:
    """One row per target: our figure, RabbitMQ's, the ratio, the target and whether it is met
    (None when it cannot be told: a figure missing, or no --peer for a ratio target)."""
    rows = []
    for target in TARGETS:
        mine = ours.get(target.figure)
        theirs = None if peer is None else peer.get(target.figure)
        exact = mine / theirs if mine is not None and theirs else None
        ratio = round(exact, 3) if exact is not None else None
        measured = mine if target.absolute else exact  # judged unrounded: 1.9999x is not 2x
        met = None
        if measured is not None:
            met = _COMPARE[target.compare](measured, target.factor)
        row: dict[str, Any] = {
            "measure": target.label,
            "figure": target.figure,
            "unit": target.unit,
            "quorumq": mine,
            "rabbitmq": theirs,
            "ratio": ratio,
            "target": target.goal(),
            "met": met,
        }
        if met is None:
            row["why_unknown"] = (
                "our figure is missing (the phase failed or did not run)"
                if mine is None
                else "ratios need --peer FILE (bench_qq.py --json)"
                if peer is None
                else "not in the --peer file"
            )
        rows.append(row)
    return rows


def median_figures(runs: list[Figures]) -> dict[str, dict[str, Any]]:
    """Per figure: the median over the runs that measured it, and every run's value."""
    out: dict[str, dict[str, Any]] = {}
    for target in TARGETS:
        values = [run.get(target.figure) for run in runs]
        known = [value for value in values if value is not None]
        median = round(statistics.median(known), 3) if known else None
        out[target.figure] = {"median": median, "values": values}
    return out


def targets_table(rows: list[dict[str, Any]]) -> str:
    """The targets as an aligned text table."""

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    lines = [f"{'measure':42} {'quorumq':>10} {'RabbitMQ':>10} {'ratio':>7}  {'target':20} met"]
    for row in rows:
        met = {True: "met", False: "NOT MET", None: "?"}[row["met"]]
        lines.append(
            f"{row['measure']:42} {cell(row['quorumq']):>10} {cell(row['rabbitmq']):>10} "
            f"{cell(row['ratio']):>7}  {row['target']:20} {met}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, peer: dict[str, Any] | None) -> dict[str, Any]:
    """`args.runs` fresh clusters, one after the other; medians and targets over them."""
    runs = []
    for number in range(args.runs):
        print(f"run {number + 1} of {args.runs}", file=sys.stderr)
        runs.append(run_once(args))
    medians = median_figures([our_figures(result) for result in runs])
    ours = {figure: entry["median"] for figure, entry in medians.items()}
    theirs = peer_figures(peer) if peer is not None else None
    results: dict[str, Any] = {
        "runs": runs,
        "figures": medians,
        "targets": evaluate_targets(ours, theirs),
        "config": {
            "nodes": 3,
            "runs": args.runs,
            "body_bytes": len(BODY),
            "fsync": args.fsync,
            "tls": args.tls,
            "threaded_only": args.threaded_only,
            "client_on": "leader",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
    }
    if peer is not None:
        results["peer"] = {
            "file": str(args.peer),
            "started": peer.get("started"),
            "finished": peer.get("finished"),
            "reps": peer.get("reps"),
            "loadavg_start": peer.get("loadavg_start"),
            "loadavg_end": peer.get("loadavg_end"),
        }
    return results


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    """Parse flags, run, print and save the results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="Print JSON only.")
    parser.add_argument(
        "--runs",
        type=_positive,
        default=1,
        help="Run the whole benchmark N times, each on a fresh cluster, and report medians "
        "(issue 14 asks for medians of at least 3). Default 1.",
    )
    parser.add_argument(
        "--peer",
        type=Path,
        default=None,
        metavar="FILE",
        help="RabbitMQ's figures: the JSON of `bench_qq.py --json FILE`, measured on this "
        "machine in the same hour. Without it, ratio targets are reported as unknown.",
    )
    parser.add_argument(
        "--messages", type=_positive, default=20_000, help="Messages at window 100 (x2 at 1000)."
    )
    parser.add_argument(
        "--latency-messages",
        type=_positive,
        default=5000,
        help="One-at-a-time publishes (default 5000: enough for a p99 and for CPU per publish "
        "from /proc's 10 ms clock ticks).",
    )
    parser.add_argument(
        "--backlog", type=_positive, default=20_000, help="Messages to consume and ack."
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="Alternating threaded/asyncio window-1000 runs (0: skip that phase).",
    )
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="Start the cluster with `tls = true`: mutual TLS on the peer traffic, TLS on the "
        "client ports (every benchmark client verifies the nodes with D/tls/ca.crt).",
    )
    parser.add_argument(
        "--threaded-only",
        action="store_true",
        help="Only the threaded client's publish, latency and consume phases (a quick A/B "
        "run; no leader kill).",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results file (default: in a fresh temp dir)"
    )
    args = parser.parse_args()
    peer = None
    if args.peer is not None:
        try:
            peer = load_peer(args.peer)
        except PeerFileError as err:
            parser.error(f"--peer: {err}")
    # client logs (reconnects during the leader kill) go to stderr, never into the JSON
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    results = run(args, peer)
    out = args.out or Path(tempfile.mkdtemp(prefix="quorumq-bench-")) / "bench_cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for number, result in enumerate(results["runs"], 1):
        print(f"run {number}:")
        for name, value in result.items():
            print(f"  {name}: {value}")
    print(f"medians over {args.runs} run(s):")
    for figure, entry in results["figures"].items():
        print(f"  {figure}: {entry['median']} (runs: {entry['values']})")
    print(targets_table(results["targets"]))
    if peer is None:
        print("ratios need --peer FILE (RabbitMQ's figures: bench_qq.py --json FILE)")


if __name__ == "__main__":
    main()
