"""How long one big client frame stalls a node's event loop (issue 12).

Starts a one-node cluster in a temp dir. A pinger sends small queries ("queues") one at a time
and records each round trip; an authenticated attacker sends one 16 MiB frame at a time:

- `frame_items`: a query frame whose args hold a 16 MiB CBOR array of zeros (16 M items);
- `command_items`: a command frame whose `cmd` blob is a 16 MiB CBOR array of zeros;
- `publish_bytes`: a legitimate publish of a 15 MiB body (one byte string), for comparison.

The stall of an attack is the longest pinger round trip from the moment the frame is sent until
it is answered; the baseline is the longest round trip over the same time with no attack.
Prints JSON. Example: `python scripts/bench_loop_stall.py --reps 3`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2

import fifo
from cluster import protocol
from cluster.launcher import local_cluster
from cluster.rawclient import RawClient
from fifo.commands import DeclareQueue, Enqueue

FRAME_BYTES = protocol.FRAME_BYTES_MAX_DEFAULT - 64  # room for the frame map around the payload


class Pinger(threading.Thread):
    """Small queries back to back; (sent_at, round_trip_s) of each."""

    def __init__(self, client: RawClient) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            sent = time.monotonic()
            self.client.query("queues")
            self.samples.append((sent, time.monotonic() - sent))

    def worst_s(self, start: float, end: float) -> float:
        """The longest round trip that overlapped [start, end]."""
        rtts = [rtt for sent, rtt in self.samples if sent <= end and sent + rtt >= start]
        return max(rtts, default=0.0)


def zeros(size: int) -> bytes:
    """A CBOR array of zeros of about `size` bytes (one byte per item)."""
    return bytes(cbor2.dumps([0] * (size - 16)))


ATTACKS: dict[str, Callable[[int], dict[str, Any]]] = {
    "frame_items": lambda rid: {
        "op": protocol.QUERY,
        "id": rid,
        "query": "queues",
        "args": {"x": cbor2.loads(zeros(FRAME_BYTES))},
    },
    "command_items": lambda rid: protocol.command(rid, zeros(FRAME_BYTES)),
    "publish_bytes": lambda rid: protocol.command(
        rid, fifo.encode(Enqueue("stall", b"x" * (15 * 1024 * 1024)))
    ),
}


def attack(address: str, key: bytes, pinger: Pinger, name: str) -> dict[str, Any]:
    """Send one frame of attack `name`; the stall it caused and how it was answered."""
    attacker = RawClient(address, key, "attacker", timeout_s=60)
    frame = protocol.encode_frame(ATTACKS[name](1))
    try:
        start = time.monotonic()
        attacker.sock.sendall(frame)
        answer = attacker.wait_for(1)
        end = time.monotonic()
    finally:
        attacker.close()
    time.sleep(0.3)  # let the round trip in flight at the end finish
    return {
        "stall_ms": round(pinger.worst_s(start, end) * 1000, 1),
        "answered_in_ms": round((end - start) * 1000, 1),
        "answer": answer.get("code", answer["op"]),
    }


def main() -> None:
    """Parse flags, run the attacks against a fresh node, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3, help="Frames of each kind.")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-stall-") as tmp,
        local_cluster(Path(tmp) / "D", 1) as cluster,
    ):
        address, key = cluster.endpoint("n1"), cluster.key
        setup = RawClient(address, key, "setup")
        setup.command(DeclareQueue("stall"))
        pinger = Pinger(RawClient(address, key, "pinger"))
        pinger.start()
        time.sleep(1.0)
        quiet_start = time.monotonic()
        time.sleep(2.0)
        results["baseline"] = {
            "worst_rtt_ms": round(pinger.worst_s(quiet_start, time.monotonic()) * 1000, 1),
            "p50_rtt_ms": round(statistics.median(r for _s, r in pinger.samples) * 1000, 2),
        }
        for name in ATTACKS:
            runs = [attack(address, key, pinger, name) for _ in range(args.reps)]
            results[name] = {
                "stall_ms_max": max(r["stall_ms"] for r in runs),
                "stall_ms": [r["stall_ms"] for r in runs],
                "answered_in_ms": [r["answered_in_ms"] for r in runs],
                "answer": sorted({str(r["answer"]) for r in runs}),
            }
        pinger.done.set()
        pinger.join(10)
        setup.close()
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
