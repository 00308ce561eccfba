"""Profile a leader and a follower with py-spy under a publish load; write flame graphs.

Starts a fresh local 3-node cluster (fsync `batch`), runs a confirmed-publish load with the
threaded client (window 1000 by default, or one message at a time with `--window 1`), and while
it runs records the leader's and one follower's Python stacks with `py-spy record` (every
thread, sampled at --rate Hz, without stopping the process). Writes into --out:
`leader-{T}-w{W}.svg`, `follower-{T}-w{W}.svg` (flame graphs; T the Raft transport, `quorumq` or
`pysyncobj` as QUORUMQ_RAFT_TRANSPORT selects) and `profile-{T}-w{W}.json`: messages per second
during the recording and, per node, the share of samples spent under the frames that explain
the cost per message (encode, journal fsync, apply, transport, ...), from py-spy's raw output.

    python scripts/profile_cluster.py --out docs/perf              # window 1000
    python scripts/profile_cluster.py --out docs/perf --window 1   # latency path
    QUORUMQ_RAFT_TRANSPORT=pysyncobj python scripts/profile_cluster.py --out docs/perf

Needs py-spy (`pip install py-spy`) and permission to ptrace the node processes (root, or
`kernel.yama.ptrace_scope = 0`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cluster.launcher import LocalCluster, local_cluster

BODY = b"x" * 100

# Frames whose inclusive share of a node's samples explains where a message's time goes:
# (label, substring of py-spy's "function (file:line)" frame text).
CATEGORIES = (
    ("client sessions (decode, reply)", "cluster/node/session.py"),
    ("group commit", "raft/batcher.py"),
    ("entry encode/decode", "raft/entry.py"),
    ("peer transport", "raft/transport.py"),
    ("peer message codec", "raft/peercodec.py"),
    ("journal and fsync", "raft/durability.py"),
    ("apply (replicated state)", "raft/replicated.py"),
    ("fifo machine", "(fifo/"),
    ("effects to consumers", "cluster/node/effects.py"),
    ("pysyncobj core", "pysyncobj/syncobj.py"),
    ("pysyncobj poller (before: its tick thread)", "pysyncobj/poller.py"),
    ("raft ticks on the loop", "raft/ticker.py"),
    ("idle: the loop waiting for events", "EpollSelector.select"),
    ("asyncio event loop", "asyncio/"),
    ("structlog", "structlog/"),
)


def _load(
    cluster: LocalCluster, leader: str, window: int, stop: threading.Event
) -> tuple[threading.Thread, list[int]]:
    """Publish with confirms on a thread until `stop`; the list holds the confirmed count
    once the thread has ended."""
    confirmed = [0]

    def run() -> None:
        with cluster.client(leader) as client:
            client.declare_queue("profile")
            with client.publisher("profile", window=window) as publisher:
                while not stop.is_set():
                    if window == 1:
                        publisher.publish(BODY, timeout_s=30.0)
                        publisher.wait_for_confirms(timeout_s=30.0)
                    else:
                        publisher.publish_many((BODY for _ in range(window)), timeout_s=60.0)
            confirmed[0] = publisher.confirmed  # final: leaving the block waited for every confirm

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, confirmed


def _record(py_spy: str, pid: int, seconds: float, rate: int, out: Path, fmt: str) -> Any:
    """Start py-spy on `pid` for `seconds`; returns the Popen."""
    command = [py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds))]
    command += ["--rate", str(rate), "--nonblocking", "--threads", "--format", fmt]
    command += ["--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _shares(raw: Path) -> dict[str, Any]:
    """From py-spy's collapsed stacks: samples per thread and the inclusive share per category."""
    totals: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        frames = stack.split(";")
        threads[frames[0]] += count
        for label, needle in CATEGORIES:
            if any(needle in frame for frame in frames):
                totals[label] += count
    return {
        "samples": samples,
        "threads": {name: round(n / samples, 3) for name, n in threads.most_common(6)}
        if samples
        else {},
        "inclusive_share": {
            label: round(totals[label] / samples, 3) for label, _ in CATEGORIES if samples
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the SVGs and JSON")
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed messages in flight")
    parser.add_argument("--seconds", type=float, default=15.0, help="recording length (1-120)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument(
        "--keep-raw",
        action="store_true",
        help="also keep py-spy's collapsed stacks in --out (leader-TAG.txt, follower-TAG.txt)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.seconds <= 120 or not 1 <= args.window <= 10_000:
        parser.error("--seconds must be 1..120 and --window 1..10000")
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        parser.error("py-spy is not installed: pip install py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    transport = os.environ.get("QUORUMQ_RAFT_TRANSPORT", "quorumq")  # the nodes inherit it
    tag = f"{transport}-w{args.window}"
    with (
        tempfile.TemporaryDirectory(prefix="qq-profile-") as tmp,
        local_cluster(Path(tmp) / "D", 3, fsync="batch") as cluster,
    ):
        leader = cluster.leader()
        follower = next(n for n in sorted(cluster.procs) if n != leader)
        stop = threading.Event()
        loader, confirmed = _load(cluster, leader, args.window, stop)
        time.sleep(3.0)  # warm up: connections, first entries, caches
        with cluster.client(leader) as probe:
            before = _depth(probe)
        started = time.perf_counter()
        recorders = {}
        for role, node in (("leader", leader), ("follower", follower)):
            pid = cluster.procs[node].pid
            recorders[role] = [
                _record(
                    py_spy,
                    pid,
                    args.seconds,
                    args.rate,
                    args.out / f"{role}-{tag}.svg",
                    "flamegraph",
                ),
                _record(py_spy, pid, args.seconds, args.rate, Path(tmp) / f"{role}.txt", "raw"),
            ]
        for procs in recorders.values():
            for proc in procs:
                _, err = proc.communicate(timeout=args.seconds + 60)
                if proc.returncode != 0:
                    raise SystemExit(f"py-spy failed: {err.strip()[-500:]}")
        elapsed = time.perf_counter() - started
        with cluster.client(leader) as probe:
            after = _depth(probe)
        stop.set()
        loader.join(timeout=60)
        if args.keep_raw:
            for role in ("leader", "follower"):
                shutil.copyfile(Path(tmp) / f"{role}.txt", args.out / f"{role}-{tag}.txt")
        result = {
            "transport": transport,
            "window": args.window,
            "seconds": round(elapsed, 1),
            "msg_per_s_while_recording": round((after - before) / elapsed, 1),
            "confirmed_total": confirmed[0],
            "leader": {"node": leader} | _shares(Path(tmp) / "leader.txt"),
            "follower": {"node": follower} | _shares(Path(tmp) / "follower.txt"),
        }
    (args.out / f"profile-{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _depth(client: Any) -> int:
    """Messages in the profile queue: what was confirmed so far."""
    overview = client.overview("profile")
    return int(overview.total) if overview is not None else 0


if __name__ == "__main__":
    sys.exit(main())
