"""Consumer timeouts on an idle leader: v3's scan against v4's deadline index, as JSON.

For each machine version (3: scans every checked-out message on every 100 ms timer tick; 4:
asks its deadline index) and each consumer count, 100,000 messages are checked out and held
(not acked) by that many consumers, then:

- `tick_ms`: the machine's part of one leader timer tick (`cluster.node.timers.due_now`: the
  next deadline, and the due commands only once it passed) on a state built in this process
  with the same commands, averaged over --ticks ticks;
- `idle_leader_cores` / `idle_follower_cores`: a real local cluster (--nodes, fsync batch) whose
  leader holds the same load through real clients; the leader's and one follower's CPU (utime +
  stime from /proc/PID/stat, every thread) over the same --window seconds of idleness, divided
  by the window, after --settle seconds (the followers finish applying what was published; a
  snapshot may be taken): the median of --windows consecutive windows, each listed under
  `windows` with the snapshots the leader wrote during it (`leader_snapshots`: a snapshot is
  work, not idleness). `empty` is the same cluster with nothing held (its floor: heartbeats,
  timers, status). `load` is the load average when each window ended.

With `--baseline-tree DIR` (a checkout of other code, e.g. `git archive main | tar -x -C DIR`)
every cluster runs twice, first with its nodes importing DIR (PYTHONPATH), then this code, and
`ratio` is this code's cores over the baseline's in the same run.

The nodes run each version with --max-machine-version N. A baseline tree from before v4's
release needs QUORUMQ_ALLOW_UNRELEASED_MACHINE=1 to run v4: set here with --baseline-tree only.
Linux only.

    python scripts/bench_timeouts.py --consumers 2,20,100 --window 10 -o results.json
    python scripts/bench_timeouts.py --versions 4 --baseline-tree /tmp/base -o results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_backlog import snapshots_written  # a sibling script: the same log reader

import fifo
from cluster.launcher import LocalCluster, local_cluster, wait_until
from cluster.node.server import UNRELEASED_FLAG
from cluster.node.timers import due_now
from fifo import commands as c
from fifo.replies import Error

MESSAGES = 100_000
BODY = b"x" * 16
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CONNECTION = c.ConnectionId("bench", 1, 1)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def holding_state(version: int, consumers: int, messages: int) -> fifo.State:
    """A state of `version` whose `consumers` competing consumers hold `messages` messages."""
    state = fifo.init_state(version)
    index = 0

    def apply(command: object) -> Any:
        nonlocal index
        index += 1
        reply, _ = fifo.apply(fifo.Meta(index, 1, 1_000, version), command, state)
        if isinstance(reply, Error):
            raise SystemExit(f"{command!r}: {reply}")
        return reply

    apply(c.DeclareQueue("q"))
    for _ in range(messages):
        apply(c.Enqueue("q", BODY))
    prefetch = -(-messages // consumers)
    for number in range(consumers):
        apply(c.Checkout("q", c.ConsumerId(f"t{number}", CONNECTION), c.SimplePrefetch(prefetch)))
    held = sum(len(k.checked_out) for k in state.queues["q"].consumers.values())
    assert held == messages, held
    return state


def tick_ms(version: int, consumers: int, messages: int, ticks: int) -> float:
    """Mean milliseconds of the machine's part of one leader timer tick (nothing due)."""
    state = holding_state(version, consumers, messages)
    now = 2_000  # before any lock expires (30 min consumer timeout)
    assert due_now(state, now) == []  # (v4 builds its index here, once)
    started = time.perf_counter()
    for _ in range(ticks):
        due_now(state, now)
    return (time.perf_counter() - started) * 1000 / ticks


def idle_cores(pids: dict[str, int], window_s: float) -> dict[str, float]:
    """Each process's CPU over the same `window_s` seconds, in cores (and the load after)."""
    before, started = {role: cpu_seconds(pid) for role, pid in pids.items()}, time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - started
    cores = {f"idle_{role}_cores": round((cpu_seconds(pid) - before[role]) / elapsed, 4)
             for role, pid in pids.items()}  # fmt: skip
    return {**cores, "load": round(os.getloadavg()[0], 2)}


def idle_windows(
    pids: dict[str, int], window_s: float, windows: int, leader_dir: Path
) -> dict[str, Any]:
    """`idle_cores` over `windows` consecutive windows: the median of each figure, every
    window's, and the snapshots the leader wrote during each (a snapshot is work, not
    idleness: it shows which window it fell in)."""
    each = []
    for _ in range(windows):
        written = len(snapshots_written(leader_dir))
        figures = idle_cores(pids, window_s)
        each.append({**figures, "leader_snapshots": len(snapshots_written(leader_dir)) - written})
    median = {key: statistics.median(w[key] for w in each) for key in each[0]}
    return {**median, "windows": each}


def node_pids(cluster: LocalCluster, leader: str) -> dict[str, int]:
    """The leader's pid and one follower's (if the cluster has one)."""
    pids = {"leader": cluster.procs[leader].pid}
    followers = sorted(node for node in cluster.procs if node != leader)
    if followers:
        pids["follower"] = cluster.procs[followers[0]].pid
    return pids


def hold(cluster: LocalCluster, leader: str, queue: str, consumers: int, messages: int) -> Any:
    """Publish `messages` to `queue` and have `consumers` consumers hold them all (no ack)."""
    client = cluster.client(leader)
    client.declare_queue(queue)
    with client.publisher(queue, window=1000) as publisher:
        publisher.publish_many((BODY for _ in range(messages)), timeout_s=300.0)
        publisher.wait_for_confirms(timeout_s=300.0)
    prefetch = -(-messages // consumers)
    attached = [client.consume(queue, prefetch=prefetch) for _ in range(consumers)]
    received = 0
    deadline = time.monotonic() + 300
    while received < messages and time.monotonic() < deadline:
        for consumer in attached:
            while consumer.get(timeout_s=0.01) is not None:
                received += 1
    if received != messages:
        raise SystemExit(f"only {received} of {messages} messages came")
    return client


def run_version(
    version: int, consumer_counts: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """One cluster of `version`: idle CPU empty, then with each consumer count."""
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="qq-timeouts-") as tmp,
        local_cluster(Path(tmp) / "D", args.nodes, fsync="batch",
                      max_machine_version=version) as cluster,
    ):  # fmt: skip
        leader = cluster.leader()
        with cluster.client(leader) as probe:
            wait_until(lambda: probe.status().get("effective_machine_version") == version, 60,
                       f"machine v{version}")  # fmt: skip
        pids = node_pids(cluster, leader)
        leader_dir = cluster.data_dir / leader
        out["empty"] = idle_windows(pids, args.window, args.windows, leader_dir)
        for consumers in consumer_counts:
            client = hold(cluster, leader, f"hold{consumers}", consumers, args.messages)
            try:
                time.sleep(args.settle)
                out[str(consumers)] = idle_windows(pids, args.window, args.windows, leader_dir)
            finally:
                client.close()
            with cluster.client(leader) as admin:  # the held messages came back: drop them
                admin.delete_queue(f"hold{consumers}")
    return out


def with_baseline(
    version: int, consumer_counts: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """`run_version` with the nodes on the baseline tree, then on this code; the ratios."""
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(args.baseline_tree.resolve())
    try:
        baseline = run_version(version, consumer_counts, args)
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous
    current = run_version(version, consumer_counts, args)
    ratio = {
        case: {key: round(value / baseline[case][key], 3) if baseline[case][key] else None
               for key, value in figures.items() if key.endswith("_cores")}
        for case, figures in current.items()
    }  # fmt: skip
    return {"baseline": baseline, "this": current, "ratio": ratio}


def main() -> None:
    """Parse flags, measure, print (and write) JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--consumers", default="2,20,100", help="Comma-separated counts.")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--ticks", type=int, default=20, help="Timer ticks timed per case.")
    parser.add_argument("--window", type=float, default=10.0, help="Idle seconds measured.")
    parser.add_argument(
        "--windows", type=int, default=3, help="Windows per case (figures: their median)."
    )
    parser.add_argument("--nodes", type=int, default=3, help="Cluster size.")
    parser.add_argument("--settle", type=float, default=5.0, help="Seconds before a window.")
    parser.add_argument("--baseline-tree", type=Path, help="Also run the nodes on this code.")
    parser.add_argument("--versions", default="3,4")
    parser.add_argument("--no-cluster", action="store_true", help="Only the in-process ticks.")
    parser.add_argument("-o", "--output", type=Path, help="Also write the JSON here.")
    args = parser.parse_args()
    counts = [int(n) for n in args.consumers.split(",")]
    versions = [int(v) for v in args.versions.split(",")]
    if args.baseline_tree is not None:  # a tree from before v4's release has it unreleased
        os.environ[UNRELEASED_FLAG] = "1"
    result: dict[str, Any] = {"messages": args.messages, "nodes": args.nodes,
                              "window_s": args.window, "windows": args.windows,
                              "load_before": os.getloadavg(), "versions": {}}  # fmt: skip
    for version in versions:
        ticks = {str(n): round(tick_ms(version, n, args.messages, args.ticks), 3) for n in counts}
        entry: dict[str, Any] = {"tick_ms": ticks}
        if not args.no_cluster:
            run = with_baseline if args.baseline_tree is not None else run_version
            entry["cluster"] = run(version, counts, args)
        result["versions"][str(version)] = entry
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
