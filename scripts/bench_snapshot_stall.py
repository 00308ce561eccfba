"""How long taking one snapshot stalls an event loop, by method (issue 32).

Builds a machine state holding `--messages` queued messages with `--body` byte bodies (0, the
default, stands for machine v4, which keeps a reference instead of the body), then runs an
asyncio loop that applies one Enqueue every millisecond (a node under load) while a snapshot is
taken in one of three ways:

- `inline`: `fifo.snapshot` + write + fsync on the loop (what the node did before issue 32);
- `fork`: `os.fork()`; the child encodes and writes, the loop polls `waitpid` (copy-on-write:
  the loop pays the fork's page-table copy, then a page fault per page it touches first);
- `thread`: a frozen copy of the state taken on the loop (`copy.deepcopy`: the state is mutated
  in place by apply, so it cannot be shared), encoded and written on another thread (which holds
  the GIL while the C encoder runs).

Reports per method the loop's longest stall (the largest lateness of a 1 ms timer), the time
until the snapshot is on disk, and the baseline stall with no snapshot, as JSON.
Example: `python scripts/bench_snapshot_stall.py --messages 200000 --reps 3`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fifo
from fifo.commands import DeclareQueue, Enqueue
from fifo.meta import Meta
from fifo.state import State

PROBE_PERIOD_S = 0.001


class Clock:
    """Meta indexes for applies (one command per entry, as the worst case)."""

    def __init__(self) -> None:
        self.index = 0

    def meta(self) -> Meta:
        self.index += 1
        return Meta(self.index * 1024, 1, 1_700_000_000_000 + self.index, 4)


def build_state(messages: int, body_bytes: int, clock: Clock) -> State:
    """A v4 state holding `messages` ready messages in one queue."""
    state = fifo.init_state(4)
    fifo.apply(clock.meta(), DeclareQueue("backlog"), state)
    body = b"x" * body_bytes
    for _ in range(messages):
        fifo.apply(clock.meta(), Enqueue("backlog", body), state)
    return state


def write_file(path: Path, data: bytes) -> None:
    """Write and fsync, as the node writes its dump."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def snapshot_inline(state: State, path: Path, done: Callable[[], None]) -> None:
    """Encode and write on the loop."""
    write_file(path, fifo.snapshot(state))
    done()


def snapshot_fork(state: State, path: Path, done: Callable[[], None]) -> None:
    """Fork; the child encodes and writes; the loop reaps it."""
    pid = os.fork()
    if pid == 0:
        try:
            write_file(path, fifo.snapshot(state))
        finally:
            os._exit(0)
    loop = asyncio.get_running_loop()

    def reap() -> None:
        finished, _status = os.waitpid(pid, os.WNOHANG)
        if finished:
            done()
        else:
            loop.call_later(0.005, reap)

    loop.call_later(0.005, reap)


def snapshot_thread(state: State, path: Path, done: Callable[[], None]) -> None:
    """Copy the state on the loop; encode and write it on another thread."""
    frozen = copy.deepcopy(state)
    loop = asyncio.get_running_loop()

    def work() -> None:
        write_file(path, fifo.snapshot(frozen))
        loop.call_soon_threadsafe(done)

    threading.Thread(target=work, daemon=True).start()


METHODS: dict[str, Callable[[State, Path, Callable[[], None]], None]] = {
    "inline": snapshot_inline,
    "fork": snapshot_fork,
    "thread": snapshot_thread,
}


async def run_once(state: State, clock: Clock, method: str | None, path: Path) -> dict[str, Any]:
    """One snapshot (or, with method None, 0.5 s of load alone): the longest loop stall."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    worst = 0.0
    started = time.perf_counter()
    if method is None:
        loop.call_later(0.5, finished.set_result, None)
    else:
        loop.call_soon(METHODS[method], state, path, lambda: finished.set_result(None))
    while not finished.done():
        due = time.perf_counter() + PROBE_PERIOD_S
        await asyncio.sleep(PROBE_PERIOD_S)
        worst = max(worst, time.perf_counter() - due)
        fifo.apply(clock.meta(), Enqueue("backlog", b""), state)  # load: one apply per ms
    total = time.perf_counter() - started
    return {"stall_ms": round(worst * 1000, 1), "done_ms": round(total * 1000, 1)}


def main(argv: list[str] | None = None) -> None:
    """Parse flags, build the state, measure each method `--reps` times, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body", type=int, default=0, help="body bytes per message")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--methods", default="inline,fork,thread")
    args = parser.parse_args(argv)
    clock = Clock()
    built = time.perf_counter()
    state = build_state(args.messages, args.body, clock)
    report: dict[str, Any] = {
        "messages": args.messages,
        "body_bytes": args.body,
        "build_s": round(time.perf_counter() - built, 1),
        "snapshot_bytes": len(fifo.snapshot(state)),
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-stall-") as tmp:
        path = Path(tmp) / "dump"
        for method in [None, *args.methods.split(",")]:
            runs = [asyncio.run(run_once(state, clock, method, path)) for _ in range(args.reps)]
            report[method or "baseline"] = {
                "stall_ms_median": statistics.median(r["stall_ms"] for r in runs),
                "done_ms_median": statistics.median(r["done_ms"] for r in runs),
                "runs": runs,
            }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
