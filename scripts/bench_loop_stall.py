"""How long one big client frame stalls a node's event loop (issue 12).

Starts a one-node cluster in a temp dir. A pinger sends small queries ("queues") one at a time
and records each round trip; an authenticated attacker sends one 16 MiB frame at a time:

- `frame_items`: a query frame whose args hold a 16 MiB CBOR array of zeros (16 M items);
- `command_items`: a command frame whose `cmd` blob is a 16 MiB CBOR array of zeros;
- `publish_bytes`: a legitimate publish of a 15 MiB body (one byte string), for comparison.

The stall of an attack is the longest round trip of the pinger (a process of its own) from the
moment the frame is sent until it is answered; the baseline is the longest round trip over 2 s
with no attack.
Prints JSON. Example: `python scripts/bench_loop_stall.py --reps 3`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
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


def ping(address: str, key: bytes, stop: Any, out: Any) -> None:
    """Child process: small queries back to back until `stop` is set; sends (sent_at, rtt_s)
    pairs (CLOCK_MONOTONIC, comparable across processes) through `out`. A process of its own,
    so the attacker's work never delays the pings."""
    client = RawClient(address, key, "pinger")
    samples: list[tuple[float, float]] = []
    while not stop.is_set():
        sent = time.monotonic()
        client.query("queues")
        samples.append((sent, time.monotonic() - sent))
    client.close()
    out.send(samples)


def worst_s(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest round trip that overlapped [start, end]."""
    return max((rtt for sent, rtt in samples if sent <= end and sent + rtt >= start), default=0.0)


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


def attack(address: str, key: bytes, frame: bytes) -> tuple[float, float, str]:
    """Send one attack frame; (sent_at, answered_at, what answered it)."""
    attacker = RawClient(address, key, "attacker", timeout_s=60)
    try:
        start = time.monotonic()
        attacker.sock.sendall(frame)
        answer = _answer(attacker)
        end = time.monotonic()
    finally:
        attacker.close()
    time.sleep(0.3)  # let the round trip in flight at the end finish
    return start, end, str(answer.get("code", answer["op"]))


def _answer(client: RawClient) -> dict[str, Any]:
    """The frame answering request 1, or an error frame (a frame refused unread has no id)."""
    while True:
        frame = protocol.recv_frame(client.sock)
        if frame.get("id") == 1 or frame["op"] == protocol.ERROR:
            return frame


def main() -> None:
    """Parse flags, run the attacks against a fresh node, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3, help="Frames of each kind.")
    args = parser.parse_args()
    frames = {name: protocol.encode_frame(make(1)) for name, make in ATTACKS.items()}
    windows: dict[str, list[tuple[float, float, str]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="qq-bench-stall-") as tmp,
        local_cluster(Path(tmp) / "D", 1) as cluster,
    ):
        address, key = cluster.endpoint("n1"), cluster.key
        setup = RawClient(address, key, "setup")
        setup.command(DeclareQueue("stall"))
        stop = multiprocessing.Event()
        receive, send = multiprocessing.Pipe(duplex=False)
        pinger = multiprocessing.Process(target=ping, args=(address, key, stop, send))
        pinger.start()
        time.sleep(1.0)
        quiet = (time.monotonic(), time.monotonic() + 2.0)
        time.sleep(2.0)
        for name, frame in frames.items():
            windows[name] = [attack(address, key, frame) for _ in range(args.reps)]
        stop.set()
        samples: list[tuple[float, float]] = receive.recv()
        pinger.join(10)
        setup.close()
    results: dict[str, Any] = {
        "baseline": {
            "worst_rtt_ms": round(worst_s(samples, *quiet) * 1000, 1),
            "p50_rtt_ms": round(statistics.median(r for _s, r in samples) * 1000, 2),
        }
    }
    for name, runs in windows.items():
        stalls = [round(worst_s(samples, start, end) * 1000, 1) for start, end, _ in runs]
        results[name] = {
            "stall_ms_max": max(stalls),
            "stall_ms": stalls,
            "answered_in_ms": [round((end - start) * 1000, 1) for start, end, _ in runs],
            "answer": sorted({answer for _, _, answer in runs}),
        }
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
