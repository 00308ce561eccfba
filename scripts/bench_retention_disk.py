"""Disk use of the retained entries while a backlog drains (issue 32, `raft.retention`).

Retains `--entries` entries of `--body` bytes (one message each: the worst case, no batching),
then consumes them over `--snapshots` snapshots, in a random order (`--seed`), as a snapshot
would report them no longer live; after each, prints the live bytes, the bytes on disk, their
ratio (the bound is 2x live + one segment), the segments, and how long the trim and the segment
rewrites took (work done by the snapshot thread, off the loop). Prints JSON lines.
Example: `python scripts/bench_retention_disk.py --entries 200000 --body 1024`.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from raft.retention import SEGMENT_BYTES_MAX, RetainedStore


def main(argv: list[str] | None = None) -> None:
    """Parse flags, fill, drain, print one JSON line per snapshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--body", type=int, default=1024, help="bytes per entry")
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--segment-bytes", type=int, default=SEGMENT_BYTES_MAX)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        store = RetainedStore(Path(tmp), "batch", "bench", args.segment_bytes)
        started = time.perf_counter()
        body = b"\x00" + b"b" * args.body
        store.add((body, index, 1) for index in range(1, args.entries + 1))
        print(json.dumps({"filled_s": round(time.perf_counter() - started, 2), **store.stats()}))
        live = list(range(1, args.entries + 1))
        order = live[:]
        rng.shuffle(order)
        step = max(1, args.entries // args.snapshots)
        for done in range(step, args.entries + step, step):
            gone = set(order[done - step : done])
            live = [index for index in live if index not in gone]
            started = time.perf_counter()
            store.keep_only(live, args.entries + 1)
            stats = store.stats()
            ratio = stats["disk_bytes"] / stats["live_bytes"] if stats["live_bytes"] else None
            print(json.dumps({
                "consumed": min(done, args.entries),
                "trim_s": round(time.perf_counter() - started, 3),
                "disk_per_live": None if ratio is None else round(ratio, 2),
                **stats,
            }))  # fmt: skip
        store.close()


if __name__ == "__main__":
    main()
