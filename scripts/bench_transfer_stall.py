"""How long a snapshot transfer carrying live entries stalls the sender's and receiver's loops
(issue 32).

A 3-node local cluster whose snapshots name every applied entry live (the test hook
QUORUMQ_TEST_LIVE_ENTRIES=all, as tests/cluster/test_retention_cluster.py): one follower is
paused (SIGSTOP) while `--mib` MiB of `--body`-byte publishes go in and the leader compacts past
it; then it resumes and the leader sends it the dump followed by every live entry (read back
1 MiB per AppendEntries, raft.transfer), which it stores in its retained store on its loop
(raft.node `_install_transferred`). A pinger process per node (small queries back to back, as
scripts/bench_loop_stall.py) gives the loop's stall: the longest round trip overlapping the
transfer, against the longest in a quiet second before it.
Example: `python scripts/bench_transfer_stall.py --mib 100`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import config, protocol
from cluster.errors import ProtocolError
from cluster.launcher import LocalCluster, init_cluster, wait_until
from cluster.rawclient import RawClient
from fifo.commands import DeclareQueue, Enqueue

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_stall import worst_s  # a sibling script: the same measure

import fifo

LIVE_ENTRIES_ENV = "QUORUMQ_TEST_LIVE_ENTRIES"  # raft.node.TEST_LIVE_ENTRIES_ENV
INSTALLED_EVENT = "snapshot_live_entries_installed"


def fill(client: RawClient, count: int, body: bytes, window: int = 32) -> None:
    """Publish `count` Enqueues of `body`, `window` frames in flight at a time."""
    sent = 0
    while sent < count:
        ids = []
        for _ in range(min(window, count - sent)):
            request_id = next(client.ids)
            protocol.send_frame(
                client.sock, protocol.command(request_id, fifo.encode(Enqueue("backlog", body)))
            )
            ids.append(request_id)
        for request_id in ids:
            client.wait_for(request_id)
        sent += len(ids)


def ping(address: str, key: bytes, stop: Any, out: Any) -> None:
    """Child process: small queries back to back until `stop` is set; sends (sent_at, rtt_s)
    pairs through `out`. A snapshot installed closes every client session (the node's state
    jumped): the pinger reconnects, the time counted in that round trip."""
    client = RawClient(address, key, "pinger")
    samples: list[tuple[float, float]] = []
    while not stop.is_set():
        sent = time.monotonic()
        try:
            client.query("queues")
        except ProtocolError:  # refused (no leader heard yet): the loop answered all the same
            pass
        except (ConnectionError, OSError):
            client.close()
            client = RawClient(address, key, "pinger")
        samples.append((sent, time.monotonic() - sent))
    client.close()
    out.send(samples)


def start_pinger(cluster: LocalCluster, node_id: str) -> tuple[Any, Any, Any]:
    """A pinger process against `node_id`: (process, stop event, receiving pipe end)."""
    stop = multiprocessing.Event()
    receive, send = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.Process(
        target=ping, args=(cluster.endpoint(node_id), cluster.key, stop, send)
    )
    process.start()
    return process, stop, receive


def run(mib: int, body_bytes: int, data_dir: Path) -> dict[str, Any]:
    """One transfer of about `mib` MiB of live entries; the stalls and durations measured."""
    os.environ[LIVE_ENTRIES_ENV] = "all"
    cfg = init_cluster(data_dir, nodes=3)
    count = mib * 1024 * 1024 // body_bytes
    # several snapshots while the follower is paused: the leader's log starts past it
    cfg = dataclasses.replace(cfg, snapshot_every_entries=max(10, count // 8))
    config.write(data_dir, cfg)
    with LocalCluster(data_dir, cfg) as cluster:
        for node in cfg.nodes:
            cluster.start_node(node.id)
        leader = cluster.leader()
        lagging = next(n.id for n in cfg.nodes if n.id != leader)
        client = RawClient(cluster.endpoint(leader), cluster.key, "filler", timeout_s=120)
        client.command(DeclareQueue("backlog"))
        cluster.kill(lagging, signal.SIGSTOP)
        filled = time.monotonic()
        try:
            fill(client, count, b"x" * body_bytes)
            fill_s = time.monotonic() - filled
            time.sleep(3.0)  # the leader drops the silent connection
            pingers = {leader: start_pinger(cluster, leader)}
            time.sleep(0.5)
            quiet = {leader: (time.monotonic(), time.monotonic() + 1.0)}
            time.sleep(1.0)
            # its pinger connects once it resumes, so its first ping is sent during the transfer
            pingers[lagging] = start_pinger(cluster, lagging)
            start = time.monotonic()
        finally:
            cluster.kill(lagging, signal.SIGCONT)
        lagging_log = data_dir / lagging / "node.log"
        wait_until(lambda: INSTALLED_EVENT in lagging_log.read_text(), 300, "the transfer")
        end = time.monotonic()
        time.sleep(0.5)
        quiet[lagging] = (time.monotonic(), time.monotonic() + 1.0)
        time.sleep(1.0)
        found: dict[str, Any] = {}
        for node_id, (process, stop, receive) in pingers.items():
            stop.set()
            samples = receive.recv()
            process.join(10)
            role = "leader" if node_id == leader else "receiver"
            found[f"{role}_stall_ms"] = round(worst_s(samples, start, end) * 1000, 1)
            found[f"{role}_quiet_worst_rtt_ms"] = round(worst_s(samples, *quiet[node_id]) * 1000, 1)
        installed = [
            line for line in lagging_log.read_text().splitlines() if INSTALLED_EVENT in line
        ]
        client.close()
        cluster.stop()
    return {
        "live_entries_mib": mib,
        "body_bytes": body_bytes,
        "fill_s": round(fill_s, 1),
        "transfer_s": round(end - start, 1),
        **found,
        "installed": json.loads(installed[-1]) if installed else None,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run one transfer, print JSON with the load average."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100, help="MiB of live entries to transfer")
    parser.add_argument("--body", type=int, default=64 * 1024, help="body bytes per message")
    parser.add_argument("--dir", type=Path, help="keep the cluster here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.dir is not None:
        report = run(args.mib, args.body, args.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-transfer-stall-") as tmp:
            report = run(args.mib, args.body, Path(tmp) / "D")
    report["load_average"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
