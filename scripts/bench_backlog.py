"""Backlog benchmark: producers outrun consumers, the queue holds the difference (issue 32).

Starts its own local 3-node cluster (fsync batch), publishes --total confirmed messages of --body
bytes into one queue with no consumer (window --window), in slices of --slice; after each slice
records the slice's publish rate and, per node: the resident set and its peak (VmRSS, VmHWM); the
longest event-loop stall (the nodes' `loop_stall_recent_max_ms`, polled every second: the longest
in the 10 s before a poll, so a slice may show a stall of the one before); leader changes (role
changes to leader); snapshots written (count, and durations where node.log carries them); the
disk use of its data dir. Then drains the queue (prefetch --prefetch, ack) and records the drain
rate, and --settle-s seconds after the queue is empty (a drained node forces a snapshot within a
second, giving back its retained entries) the resident sets and disk use. Prints one JSON
document (progress on stderr) and writes it to --out (default: a fresh temp dir, never the
checkout).

The fields match ../shared/bench/rabbitmq/bench_backlog.py's (the same workload on RabbitMQ);
`--peer FILE` reads that script's JSON and adds the ratios (ours / RabbitMQ's). The nodes run
the newest machine version (v4: bodies stay in the log); `--machine-version N` caps them at N.

    python scripts/bench_backlog.py --total 50000 --slice 10000 --body 1024
    python scripts/bench_backlog.py --total 400000 --peer /tmp/rmq-backlog.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cluster.client import Client, Consumer
from cluster.launcher import LocalCluster, local_cluster, wait_until

QUEUE = "backlog"
POLL_S = 1.0  # status polls during a phase (the stall window of a node is 10 s)
DRAIN_IDLE_S = 60.0  # the drain gives up after this long without a message
MIB = 1024 * 1024


def proc_memory_mib(pid: int) -> dict[str, float]:
    """A process's VmRSS and VmHWM (its peak) in MiB, as the RabbitMQ script reports them."""
    out: dict[str, float] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        if line.startswith(("VmRSS", "VmHWM")):
            key, value = line.split(":")
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def disk_mib(path: Path) -> float:
    """The bytes of every file under `path`, in MiB."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return round(total / MIB, 1)


def snapshots_written(node_dir: Path) -> list[float | None]:
    """One entry per `snapshot_written` line of the node's logs: its duration in ms when the
    line carries one (`total_ms`, `duration_ms` or `seconds`), else None."""
    found: list[float | None] = []
    for log_file in sorted(node_dir.glob("node.log*")):
        with open(log_file, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if '"snapshot_written"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if "total_ms" in event:
                    found.append(float(event["total_ms"]))
                elif "duration_ms" in event:
                    found.append(float(event["duration_ms"]))
                elif "seconds" in event:
                    found.append(float(event["seconds"]) * 1000)
                else:
                    found.append(None)
    return found


class Watcher:
    """Polls every node's status on a thread while a phase runs: the longest loop stall seen."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.stall_ms: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        """Take each answering node's recent longest stall."""
        for node, status in written_statuses(self.cluster).items():
            if status is not None:
                stall = int(status.get("loop_stall_recent_max_ms") or 0)
                self.stall_ms[node] = max(stall, self.stall_ms.get(node, 0))


def written_statuses(cluster: LocalCluster) -> dict[str, dict[str, Any] | None]:
    """Each node's status as it writes it to `status.json` every 2 s (None if unreadable).
    Not the `status` query: that one computes the state digest on the loop (up to 50,000
    messages: ~100 ms), and polling it every second showed up as the bench's own stalls."""
    out: dict[str, dict[str, Any] | None] = {}
    for node in cluster.config.nodes:
        try:
            out[node.id] = json.loads((node.data_dir / "status.json").read_text("utf-8"))
        except (OSError, ValueError):
            out[node.id] = None
    return out


def leader_elections(cluster: LocalCluster) -> int:
    """Role changes to leader, summed over the answering nodes, since they started (the
    `status` query, once a slice: status.json may predate the first election)."""
    total = 0
    for status in cluster.statuses().values():
        changes = (status or {}).get("role_changes") or {}
        total += sum(count for change, count in changes.items() if change.endswith("->leader"))
    return total


def node_figures(cluster: LocalCluster) -> dict[str, Any]:
    """Per node: RSS and peak, disk use of its data dir, snapshots written so far."""
    rss, disk, snapshots = {}, {}, {}
    for node in cluster.config.nodes:
        proc = cluster.procs.get(node.id)
        rss[node.id] = proc_memory_mib(proc.pid) if proc is not None else {}
        disk[node.id] = disk_mib(node.data_dir)
        snapshots[node.id] = snapshots_written(node.data_dir)
    return {"rss_mib": rss, "disk_mib": disk, "snapshots": snapshots}


def publish_slice(client: Client, count: int, body: bytes, window: int) -> float:
    """Publish `count` confirmed messages; the rate in messages per second."""
    started = time.perf_counter()
    with client.publisher(QUEUE, window=window) as publisher:
        publisher.publish_many((body for _ in range(count)), timeout_s=600.0)
        publisher.wait_for_confirms(timeout_s=600.0)
    return count / (time.perf_counter() - started)


def slice_record(
    cluster: LocalCluster, done: int, rate: float, watcher: Watcher, elections: int
) -> dict[str, Any]:
    """One slice's figures; snapshots are those written during it (count, durations)."""
    figures = node_figures(cluster)
    return {
        "backlog_after": done,
        "msg_per_s": round(rate, 1),
        "load": os.getloadavg()[0],
        "rss_mib": figures["rss_mib"],
        "disk_mib": figures["disk_mib"],
        "loop_stall_max_ms": watcher.stall_ms,
        "leader_changes": leader_elections(cluster) - elections,
        "snapshots_total": {node: len(s) for node, s in figures["snapshots"].items()},
        "_snapshots": figures["snapshots"],
    }


def publish_phase(
    cluster: LocalCluster, client: Client, args: argparse.Namespace, seen: dict[str, int]
) -> list[Any]:
    """Every slice of the publish, each with its figures (`seen`: snapshots counted so far)."""
    slices: list[dict[str, Any]] = []
    body, done = b"x" * args.body, 0
    elections = leader_elections(cluster)
    while done < args.total:
        count = min(args.slice, args.total - done)
        with Watcher(cluster) as watcher:
            rate = publish_slice(client, count, body, args.window)
        done += count
        record = slice_record(cluster, done, rate, watcher, elections)
        elections += record["leader_changes"]
        record["snapshots"] = _new_snapshots(record.pop("_snapshots"), seen)
        slices.append(record)
        print(json.dumps(record), file=sys.stderr, flush=True)
    return slices


def _new_snapshots(by_node: dict[str, list[float | None]], seen: dict[str, int]) -> Any:
    """The snapshots written since the last slice: per node their count and durations."""
    out: dict[str, Any] = {}
    for node, durations in by_node.items():
        new = durations[seen.get(node, 0) :]
        seen[node] = len(durations)
        out[node] = {"count": len(new), "durations_ms": new}
    return out


def drain_phase(
    cluster: LocalCluster, client: Client, args: argparse.Namespace, seen: dict[str, int]
) -> Any:
    """Consume and ack every message; the rate, then the figures once the queue is empty."""
    elections = leader_elections(cluster)
    with Watcher(cluster) as watcher:
        started = time.perf_counter()
        consumer = client.consume(QUEUE, prefetch=args.prefetch)
        got = _take_all(consumer, args.total)
        seconds = time.perf_counter() - started
        wait_until(lambda: _emptied(client), 120.0, "the acks applied")
        consumer.cancel()
        time.sleep(args.settle_s)  # a drained node snapshots within a second (its disk back)
    figures = node_figures(cluster)
    return {
        "drain": {
            "messages": got,
            "msg_per_s": round(got / seconds, 1),
            "loop_stall_max_ms": watcher.stall_ms,
            "leader_changes": leader_elections(cluster) - elections,
            "snapshots": _new_snapshots(figures["snapshots"], seen),
        },
        "rss_after_drain_mib": figures["rss_mib"],
        "disk_after_drain_mib": figures["disk_mib"],
    }


def _take_all(consumer: Consumer, total: int) -> int:
    got = 0
    while got < total:
        message = consumer.get(timeout_s=DRAIN_IDLE_S)
        if message is None:
            break
        message.ack()
        got += 1
    return got


def _emptied(client: Client) -> bool:
    overview = client.overview(QUEUE)
    return overview is not None and overview.total == 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh cluster: publish the backlog, drain it, stop the cluster."""
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="qq-backlog-") as tmp,
        local_cluster(
            Path(tmp) / "D", 3, fsync="batch", max_machine_version=args.machine_version
        ) as cluster,
    ):
        leader = cluster.leader()
        fresh = node_figures(cluster)["rss_mib"]
        with cluster.client(leader) as client:
            if args.machine_version is not None:
                wanted = args.machine_version
                wait_until(
                    lambda: client.status().get("effective_machine_version") == wanted,
                    60.0,
                    f"machine v{wanted}",
                )
            client.declare_queue(QUEUE)
            seen: dict[str, int] = {}
            slices = publish_phase(cluster, client, args, seen)
            drained = drain_phase(cluster, client, args, seen)
            version = client.status().get("effective_machine_version")
    return {
        "broker": "quorumq",
        "body": args.body,
        "published": args.total,
        "window": args.window,
        "prefetch": args.prefetch,
        "machine_version": version,
        "rss_fresh_mib": fresh,
        "slices": slices,
        **drained,
        "loadavg": {"before": load_before, "after": os.getloadavg()},
    }


def _max_rss(rss_by_node: dict[str, dict[str, float]], key: str) -> float | None:
    values = [v[key] for v in rss_by_node.values() if key in v]
    return max(values) if values else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 3)


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """Ours over RabbitMQ's, per figure the issue names (rates: > 1 is better; RSS: < 1)."""
    theirs_by_backlog = {s["backlog_after"]: s for s in peer.get("slices", [])}
    per_slice = []
    for ours_slice in ours["slices"]:
        theirs = theirs_by_backlog.get(ours_slice["backlog_after"])
        if theirs is None:
            continue
        per_slice.append({
            "backlog_after": ours_slice["backlog_after"],
            "publish_rate": _ratio(ours_slice["msg_per_s"], theirs.get("msg_per_s")),
            "peak_rss": _ratio(
                _max_rss(ours_slice["rss_mib"], "VmHWM"), _max_rss(theirs["rss_mib"], "VmHWM")
            ),
            "rss": _ratio(
                _max_rss(ours_slice["rss_mib"], "VmRSS"), _max_rss(theirs["rss_mib"], "VmRSS")
            ),
        })  # fmt: skip
    return {
        "peer_body": peer.get("body"),
        "peer_published": peer.get("published"),
        "slices": per_slice,
        "drain_rate": _ratio(ours["drain"]["msg_per_s"], peer.get("drain", {}).get("msg_per_s")),
        "rss_after_drain": _ratio(
            _max_rss(ours["rss_after_drain_mib"], "VmRSS"),
            _max_rss(peer.get("rss_after_drain_mib", {}), "VmRSS"),
        ),
        "last_over_first_publish_rate": {
            "quorumq": _last_over_first(ours["slices"]),
            "rabbitmq": _last_over_first(peer.get("slices", [])),
        },
    }


def _last_over_first(slices: list[dict[str, Any]]) -> float | None:
    if len(slices) < 2:
        return None
    return _ratio(slices[-1].get("msg_per_s"), slices[0].get("msg_per_s"))


def load_peer(path: Path) -> dict[str, Any]:
    """The JSON of the RabbitMQ script; ValueError if it is not that."""
    peer = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(peer, dict) or "slices" not in peer or "drain" not in peer:
        raise ValueError(f"{path}: not the JSON of bench/rabbitmq/bench_backlog.py")
    return peer


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def parse_args() -> argparse.Namespace:
    """The flags (the RabbitMQ script's, plus ours)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--total", type=_positive, default=400_000, help="Messages published.")
    parser.add_argument("--slice", type=_positive, default=50_000, help="Messages per slice.")
    parser.add_argument("--body", type=_positive, default=1024, help="Body bytes.")
    parser.add_argument("--window", type=_positive, default=1000, help="Unconfirmed in flight.")
    parser.add_argument("--prefetch", type=_positive, default=100, help="Drain prefetch.")
    parser.add_argument("--machine-version", type=int, choices=(1, 2, 3, 4), default=None)
    parser.add_argument("--peer", type=Path, default=None, metavar="FILE", help="RabbitMQ JSON.")
    parser.add_argument("--out", type=Path, default=None, help="Results file (default: temp).")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=5.0,
        help="Seconds between the queue found empty and the after-drain figures.",
    )
    return parser.parse_args()


def main() -> None:
    """Parse flags, run, print and save the results."""
    args = parse_args()
    peer = None
    if args.peer is not None:
        try:
            peer = load_peer(args.peer)
        except (OSError, ValueError) as err:
            sys.exit(f"--peer: {err}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # client records: stderr
    results = run(args)
    if peer is not None:
        results["ratios_to_rabbitmq"] = ratios(results, peer)
    out = args.out or Path(tempfile.mkdtemp(prefix="quorumq-bench-")) / "bench_backlog.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
